"""Answer extraction and the small graders that suites (and users' JSONL suites) grade with.

    extract_number("so she pays $1,250.00 in all.\n#### 1250")   # 1250.0
    extract_choice("The answer is (C).")                             # "C"
    GRADERS["numeric"]("... #### 18", "18")                          # 1.0
    get_grader("exact")                                              # or ValueError naming the graders

Every grader is a function `(answer_text: str, reference) -> float` in [0, 1]; `GRADERS` maps a name
to it. Numbers follow GSM8K's convention (Cobbe et al. 2021, "Training Verifiers to Solve Math Word
Problems": the gold number follows `####`); letters follow MMLU's "Answer: X" format (Hendrycks et al.
2021, "Measuring Massive Multitask Language Understanding").
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Callable
from typing import Any

# A number as models write it: optional sign (ASCII or U+2212) and "$", digits with optional thousands
# commas ("1,250" but not the list "1, 2"), optional decimals, an optional "/denominator", optional "%".
# The sign counts only when it does not follow a word character ("3-5" is 3 and 5, not 3 and -5).
_NUMBER = re.compile(
    r"(?:(?<![\w)])(?P<sign>[-\u2212])(?=\$?\d))?\$?"
    r"(?P<int>\d(?:[\d,]*\d)?)(?P<frac>\.\d+)?"
    r"(?:\s?/\s?(?P<den>\d+(?:\.\d+)?))?%?"
)
_HASHES = re.compile(r"####")
_BOXED = re.compile(r"\\boxed\{")
_ANSWER_IS = re.compile(r"answer\s*(?:is|:|=)", re.IGNORECASE)


def parse_number(token: str) -> float | None:
    """The value of one number token ("$1,250.00" -> 1250.0, "-3/4" -> -0.75, "25%" -> 25.0); None if none."""
    match = _NUMBER.search(token)
    return None if match is None else _value(match)


def _value(match: re.Match) -> float | None:
    value = float(match["int"].replace(",", "") + (match["frac"] or ""))
    if match["den"] is not None:
        den = float(match["den"])
        if den == 0:
            return None
        value /= den
    return -value if match["sign"] else value


def _first_number(text: str) -> float | None:
    for match in _NUMBER.finditer(text):
        value = _value(match)
        if value is not None:
            return value
    return None


def extract_number(text: str) -> float | None:
    """The final numeric answer of a worked solution, or None when the text holds no number.

    Preference: the first number after the last "####" (GSM8K's answer marker), else inside the last
    `\\boxed{...}`, else the first number after the last "answer is" / "answer:", else the last number
    anywhere. Commas, "$", "%", a trailing period and U+2212 minus are handled; "a/b" is a fraction.
    """
    for marker in (_HASHES, _BOXED, _ANSWER_IS):
        hits = list(marker.finditer(text))
        if hits:
            value = _first_number(text[hits[-1].end():])
            if value is not None:
                return value
    values = [v for v in (_value(m) for m in _NUMBER.finditer(text)) if v is not None]
    return values[-1] if values else None


def numbers_equal(a: float | None, b: float | None, tol: float = 1e-6) -> bool:
    """a == b within an absolute tolerance `tol` (18.00 == 18); False when either is None."""
    return a is not None and b is not None and math.isclose(a, b, rel_tol=0.0, abs_tol=tol)


# --- multiple choice --------------------------------------------------------------------------------

@functools.lru_cache(maxsize=16)
def _choice_patterns(letters: str) -> list[re.Pattern]:
    upper, lower = f"[{letters}]", f"[{letters.lower()}]"
    # a lower-case letter counts only where it cannot be a word ("a)", "(b)", "c.", "d" at the end)
    low = rf"({lower})(?=[\)\]\.:\*]|\s*$)"
    others = letters.replace("A", "")
    return [
        # "Answer: C", "the answer is (c)", "correct answer is **B**", "answer is option D"
        re.compile(rf"(?i:answer)\s*(?:is|:)?\s*[:\-]?\s*(?:(?i:option|choice)\s*)?[\*\(\[]*"
                   rf"(?:({upper})(?![\w'])|{low})"),
        # a reply that opens with the option: "C", "(C) Paris", "c) Paris", "B. 42"
        re.compile(rf"^\s*[\*\(\[]*(?:({upper})(?=[\)\]\.:\*]|\s*$|\s+[A-Z\d])|{low})"),
        # the option in parentheses or before a closing parenthesis anywhere: "(C)", "c)"
        re.compile(rf"(?<!\w)\(({upper}|{lower})\)|(?<![\w(])({upper}|{lower})\)"),
        # a standalone capital letter; "A" before a lower-case word is the article ("A is right" counts)
        re.compile(rf"(?<![\w'])(?:(A)(?![\w'])(?!\s+(?!(?:is|or|and)\b)[a-z])|([{others}])(?![\w']))"),
    ]


def extract_choice(text: str, letters: str = "ABCD") -> str | None:
    """The option letter a reply picks (upper case), or None when it names none.

    Tried in order, the first hit wins: an explicit "answer is X" / "Answer: X"; a reply that opens
    with the letter ("C", "(C) ...", "c) ...", "B. ..."); "(C)" or "c)" anywhere; the first standalone
    capital letter among `letters` (the article "A" followed by a lower-case word is skipped).
    """
    for pattern in _choice_patterns(letters):
        match = pattern.search(text)
        if match:
            return next(g for g in match.groups() if g).upper()
    return None


def choice_from_logprobs(top_logprobs: list[dict[str, float]] | None, letters: str = "ABCD") -> str | None:
    """The option letter most likely as the next token, from the first generated position's alternatives.

    A token counts for a letter when, stripped of whitespace, it is that letter (" B" and "B" both count;
    "Be" does not); a letter's log-probability is its best such token's. Letters absent from the top-k
    count as impossible. None when no letter is among the alternatives (or none were returned).
    This is the usual log-likelihood scoring of multiple choice (as in Hendrycks et al.'s MMLU harness):
    the answer is read from the model's distribution instead of from free text.
    """
    if not top_logprobs:
        return None
    best: dict[str, float] = {}
    for token, logprob in top_logprobs[0].items():
        letter = token.strip()
        if len(letter) == 1 and letter in letters and logprob > best.get(letter, float("-inf")):
            best[letter] = logprob
    return max(best, key=best.__getitem__) if best else None


# --- the graders ------------------------------------------------------------------------------------

def _squash(text: str) -> str:
    return " ".join(str(text).split()).casefold()


def grade_exact(answer: str, reference: Any) -> float:
    """1.0 when the answer equals the reference after trimming, collapsing whitespace and case-folding."""
    return float(_squash(answer) == _squash(reference))


def grade_contains(answer: str, reference: Any) -> float:
    """1.0 when the reference (whitespace-collapsed, case-folded) occurs in the answer."""
    return float(_squash(reference) in _squash(answer))


def grade_numeric(answer: str, reference: Any) -> float:
    """1.0 when `extract_number(answer)` equals the reference number within 1e-6.

    Raises:
        ValueError: a reference that holds no number.
    """
    gold = float(reference) if isinstance(reference, (int, float)) else parse_number(str(reference))
    if gold is None:
        raise ValueError(f"numeric grader: the reference {reference!r} holds no number")
    return float(numbers_equal(extract_number(answer), gold))


def grade_choice(answer: str, reference: Any) -> float:
    """1.0 when the extracted option letter equals the reference letter ("C"); letters A..max(D, ref).

    Raises:
        ValueError: a reference that is not a single letter.
    """
    ref = str(reference).strip().upper()
    if len(ref) != 1 or not "A" <= ref <= "Z":
        raise ValueError(f"choice grader: the reference must be one letter, got {reference!r}")
    letters = "".join(chr(c) for c in range(ord("A"), max(ord("D"), ord(ref)) + 1))
    return float(extract_choice(answer, letters) == ref)


def grade_regex(answer: str, reference: Any) -> float:
    """1.0 when the regular expression `reference` matches somewhere in the answer (`re.search`)."""
    return float(re.search(str(reference), answer) is not None)


_FENCE = re.compile(r"```(?:json)?\s*\n?(.*?)```", re.DOTALL)


def parse_json_answer(answer: str) -> Any:
    """The JSON value in a reply: the whole text, else a ```json fenced block, else the first
    '{'/'[' that starts a valid document. Raises ValueError when there is none."""
    candidates = [answer.strip(), *(m.group(1).strip() for m in _FENCE.finditer(answer))]
    for candidate in candidates:
        try:
            return json.loads(candidate)
        except json.JSONDecodeError:
            pass
    decoder = json.JSONDecoder()
    for i, ch in enumerate(answer):
        if ch in "{[":
            try:
                return decoder.raw_decode(answer, i)[0]
            except json.JSONDecodeError:
                continue
    raise ValueError("no JSON document in the answer")


def grade_json(answer: str, reference: Any) -> float:
    """1.0 when the answer's JSON value (see `parse_json_answer`) equals the reference.

    A string reference is parsed as JSON first (so "{\\"a\\": 1}" and {"a": 1} are the same reference).
    """
    if isinstance(reference, str):
        try:
            reference = json.loads(reference)
        except json.JSONDecodeError:
            pass
    try:
        return float(parse_json_answer(answer) == reference)
    except ValueError:
        return 0.0


Grader = Callable[[str, Any], float]

GRADERS: dict[str, Grader] = {
    "exact": grade_exact,
    "contains": grade_contains,
    "numeric": grade_numeric,
    "choice": grade_choice,
    "regex": grade_regex,
    "json": grade_json,
}


def get_grader(name: str) -> Grader:
    """The grader called `name`. Raises ValueError naming the available graders."""
    try:
        return GRADERS[name]
    except KeyError:
        raise ValueError(f"unknown grader {name!r}; available: {', '.join(sorted(GRADERS))}") from None
