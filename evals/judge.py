"""LLM-as-judge: our prompts and robust verdict parsing, for MT-Bench (1-10 ratings) and AlpacaEval (pairwise).

    messages = single_answer_messages(question, answer, reference=None)   # a 1-10 rating of one answer
    rating, completion = await rate(judge, messages)                     # rating None when unparsable
    parse_rating("... Rating: [[7]]")                                     # 7.0
    result = await compare_both_orders(judge, instruction, output, baseline_output)
    result.score                                                          # 1 win, 0.5 tie, 0 loss (mean of the two orders)

Methods after Zheng et al. 2023, "Judging LLM-as-a-Judge with MT-Bench and Chatbot Arena" (single-answer
grading on 1-10 with a reference answer for math, reasoning and coding; the second turn judged in the
context of the whole conversation; pairwise comparison in both orders to cancel position bias). The prompt
texts are our own; only the verdict formats "[[N]]" and "[[A]]"/"[[B]]"/"[[C]]" follow the paper's
convention, so the parser also reads the recorded GPT-4 judgments in ../shared/data.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from typing import Any

from evals.targets import Completion, Target

# Judges answer greedily so that a rerun gives the same verdicts (and the cache can serve them).
JUDGE_SAMPLING: dict[str, Any] = {"temperature": 0.0, "max_tokens": 512}

SYSTEM = "You are a careful, impartial evaluator of answers written by AI assistants."

_RATING_FORMAT = ("First explain your assessment in a few sentences. Then write the rating on the last line exactly as "
                  "\"Rating: [[N]]\", where N is a whole number from 1 to 10.")
_RATING_RULES = (
    "Give a rating from 1 to 10: 1 means useless, wrong or harmful, 10 means a correct, complete and clear answer "
    "that could not reasonably be improved. Weigh correctness first, then how well it follows the request, then "
    "helpfulness, depth and clarity. Length is not a merit in itself.{reference_rule}\n" + _RATING_FORMAT
)
_REFERENCE_RULE = (" A reference answer is given and is correct: compare the assistant's result with it, and rate "
                   "an answer that reaches a different result as wrong however well it is written.")

_VERDICT_FORMAT = ("First explain your comparison in a few sentences. Then write your verdict on the last line as exactly "
                   "one of: \"[[A]]\" if Response A is better, \"[[B]]\" if Response B is better, \"[[C]]\" if they "
                   "are equally good.")
_PAIRWISE_RULES = (
    "Two AI assistants answered the same instruction. Decide which response serves the user better: correct, "
    "following the instruction, helpful, clear. The order in which the responses appear says nothing about "
    "their quality, and a longer response is not better for being longer.\n" + _VERDICT_FORMAT
)
# When the judgment carries no verdict (small judges often ramble past the format line), one follow-up turn asks
# for the verdict alone, constrained by a JSON schema (OpenAI `response_format` json_schema, which the gateway's
# local engines enforce by guided decoding).
_RATING_FOLLOW_UP = "Now give only your rating of the assistant's answer, as a whole number from 1 to 10."
_VERDICT_FOLLOW_UP = "Now give only your verdict: A if Response A is better, B if Response B is better, C for a tie."
_RATING_SCHEMA = {"type": "object", "properties": {"rating": {"type": "integer", "enum": list(range(1, 11))}},
                  "required": ["rating"], "additionalProperties": False}
_VERDICT_SCHEMA = {"type": "object", "properties": {"verdict": {"type": "string", "enum": ["A", "B", "C"]}},
                   "required": ["verdict"], "additionalProperties": False}

# A weak judge may repeat the instructions; their format line (which shows the verdict tags) is not a verdict.
_ECHOES = tuple(" ".join(line.split()) for line in (_RATING_FORMAT, _VERDICT_FORMAT))

_DOUBLE = re.compile(r"\[\[\s*(\d+(?:\.\d+)?)\s*(?:/\s*10\s*)?\]\]")
_LABELLED = re.compile(r"rating\s*[:=]?\s*\**\s*\[?\s*(\d+(?:\.\d+)?)\s*(?:/\s*10)?\s*\]?", re.IGNORECASE)
_SINGLE = re.compile(r"(?<!\[)\[\s*(\d+(?:\.\d+)?)\s*\](?!\])")
_VERDICT = re.compile(r"\[\[\s*(A|B|C|tie)\s*\]\]", re.IGNORECASE)


def _without_echo(text: str) -> str:
    text = " ".join((text or "").split())
    for echo in _ECHOES:
        text = text.replace(echo, " ")
    return text


def _in_range(value: float) -> bool:
    return 1.0 <= value <= 10.0


def parse_rating(text: str) -> float | None:
    """The 1-10 rating in a judge's output, or None when there is none.

    Looked for in order: "[[N]]" (the last one; N may have decimals, "[[7/10]]" too), then "Rating: N",
    then a lone "[N]". A number outside 1-10 counts as no rating. A copy of our prompt's format line is ignored.
    """
    text = _without_echo(text)
    for pattern in (_DOUBLE, _LABELLED, _SINGLE):
        found = [float(m) for m in pattern.findall(text)]
        if found:
            return found[-1] if _in_range(found[-1]) else None
    return None


def parse_verdict(text: str) -> str | None:
    """"A", "B" or "C" (tie) from a pairwise judge's output: its last "[[A]]"/"[[B]]"/"[[C]]" ("[[tie]]" is C), a copy
    of our prompt's format line ignored; None if absent."""
    found = _VERDICT.findall(_without_echo(text))
    if not found:
        return None
    verdict = found[-1].upper()
    return "C" if verdict == "TIE" else verdict


def single_answer_messages(question: str, answer: str, reference: str | None = None) -> list[dict[str, str]]:
    """Judge messages rating one answer to one question (MT-Bench turn 1)."""
    rules = _RATING_RULES.format(reference_rule=_REFERENCE_RULE if reference else "")
    parts = [rules, f"[Question]\n{question}"]
    if reference:
        parts.append(f"[Reference answer]\n{reference}")
    parts.append(f"[Assistant's answer]\n{answer}")
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "\n\n".join(parts)}]


def multi_turn_messages(questions: list[str], answers: list[str], references: list[str] | None = None) -> list[dict[str, str]]:
    """Judge messages rating the assistant's LAST answer of a conversation, in its context (MT-Bench turn 2).

    Args:
        questions, answers: the user turns and the assistant's replies, same length (>= 1).
        references: correct answers per turn (math, reasoning, coding), or None.
    Raises:
        ValueError: questions and answers differ in length or are empty.
    """
    if not questions or len(questions) != len(answers):
        raise ValueError(f"need one answer per question, got {len(questions)} questions and {len(answers)} answers")
    rules = _RATING_RULES.format(reference_rule=_REFERENCE_RULE if references else "")
    rules = "Rate only the assistant's final answer, reading it in the context of the whole conversation. " + rules
    turns = []
    for i, (question, answer) in enumerate(zip(questions, answers), start=1):
        turns.append(f"### User (turn {i}):\n{question}\n\n### Assistant (turn {i}):\n{answer}")
    parts = [rules, "[Conversation]\n" + "\n\n".join(turns)]
    if references:
        parts.append("[Reference answer to the final question]\n" + references[min(len(questions), len(references)) - 1])
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "\n\n".join(parts)}]


def pairwise_messages(instruction: str, response_a: str, response_b: str) -> list[dict[str, str]]:
    """Judge messages comparing two responses to one instruction (verdict [[A]], [[B]] or [[C]])."""
    body = f"{_PAIRWISE_RULES}\n\n[Instruction]\n{instruction}\n\n[Response A]\n{response_a}\n\n[Response B]\n{response_b}"
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": body}]


def require_judge(judge: Target | None, suite: str) -> Target:
    """`judge`, or ValueError naming the flag when a judge-graded suite was given none."""
    if judge is None:
        raise ValueError(f"{suite} is graded by a judge model; pass one (--judge)")
    return judge


def judged_score(score: float | None, details: dict[str, Any], judge_cost_usd: float, what: str = "rating"):
    """The `Grade` of a judge's verdict: `score`, or 0.0 with details["error"] when the judge gave no
    parsable `what` ("rating", "verdict")."""
    from evals.base import Grade

    if score is None:
        return Grade(0.0, {**details, "error": f"the judge gave no parsable {what}"}, judge_cost_usd=judge_cost_usd)
    return Grade(score, details, judge_cost_usd=judge_cost_usd)


def _response_format(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": name, "strict": True, "schema": schema}}


def _json_field(text: str, key: str) -> Any:
    """`key` of the JSON object in `text`, or None when `text` is no such object."""
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        return None
    return value.get(key) if isinstance(value, dict) else None


def _merged(first: Completion, second: Completion) -> Completion:
    """`first` (its text kept) with the usage, cost and latency of both calls."""
    return dataclasses.replace(
        first, prompt_tokens=first.prompt_tokens + second.prompt_tokens,
        completion_tokens=first.completion_tokens + second.completion_tokens,
        cost_usd=first.cost_usd + second.cost_usd, latency_s=first.latency_s + second.latency_s)


async def _ask_again(judge: Target, messages: list[dict[str, str]], judgment: Completion, question: str,
                     name: str, schema: dict[str, Any], key: str) -> tuple[Any, Completion]:
    """The follow-up turn: `judgment` as the judge's reply, then `question` answered as JSON under `schema`."""
    follow_up = [*messages, {"role": "assistant", "content": judgment.text}, {"role": "user", "content": question}]
    answer = await judge.chat(follow_up, **JUDGE_SAMPLING, response_format=_response_format(name, schema))
    return _json_field(answer.text, key), _merged(judgment, answer)


async def rate(judge: Target, messages: list[dict[str, str]]) -> tuple[float | None, Completion]:
    """Ask `judge` for a rating; returns (1-10 rating or None when unparsable, the judge's completion).

    When the judgment holds no parsable rating, one follow-up turn asks for the rating alone as JSON
    ({"rating": 1..10}, OpenAI `response_format` json_schema); the returned completion keeps the judgment's
    text and adds the follow-up's usage and cost.

    Raises:
        evals.targets.TargetError: the judge call failed.
    """
    completion = await judge.chat(messages, **JUDGE_SAMPLING)
    rating = parse_rating(completion.text)
    if rating is not None:
        return rating, completion
    value, completion = await _ask_again(judge, messages, completion, _RATING_FOLLOW_UP, "rating", _RATING_SCHEMA, "rating")
    return (float(value) if isinstance(value, int) and _in_range(value) else None), completion


async def _verdict(judge: Target, messages: list[dict[str, str]]) -> tuple[str | None, Completion]:
    """The judge's "A"/"B"/"C" for pairwise `messages`, with the JSON follow-up when the judgment has none."""
    completion = await judge.chat(messages, **JUDGE_SAMPLING)
    verdict = parse_verdict(completion.text)
    if verdict is not None:
        return verdict, completion
    value, completion = await _ask_again(judge, messages, completion, _VERDICT_FOLLOW_UP, "verdict", _VERDICT_SCHEMA, "verdict")
    return (value if value in ("A", "B", "C") else None), completion


@dataclass(frozen=True)
class PairwiseResult:
    """A model's output judged against a baseline's, in both orders.

    Attributes:
        score: mean over the parsed orders of 1 (model better), 0.5 (tie), 0 (baseline better); 0.5 when neither
            order could be parsed.
        verdicts: the raw verdict per order, ("A"|"B"|"C"|None) with the model as A first, then as B.
        cost_usd: USD of the two judge calls.
    """

    score: float
    verdicts: tuple[str | None, str | None]
    cost_usd: float
    judgments: tuple[str, str] = field(default=("", ""), repr=False)

    @property
    def is_parsed(self) -> bool:
        return any(v is not None for v in self.verdicts)


async def compare_both_orders(judge: Target, instruction: str, output: str, baseline_output: str) -> PairwiseResult:
    """Judge `output` against `baseline_output` twice, swapping positions, and average (Zheng et al. 2023, sec. 3.3).

    An order whose judgment has no verdict gets the JSON follow-up turn of `rate`.

    Raises:
        evals.targets.TargetError: a judge call failed.
    """
    v1, first = await _verdict(judge, pairwise_messages(instruction, output, baseline_output))
    v2, second = await _verdict(judge, pairwise_messages(instruction, baseline_output, output))
    points = []
    if v1 is not None:
        points.append({"A": 1.0, "C": 0.5, "B": 0.0}[v1])
    if v2 is not None:
        points.append({"B": 1.0, "C": 0.5, "A": 0.0}[v2])
    score = sum(points) / len(points) if points else 0.5
    return PairwiseResult(score, (v1, v2), first.cost_usd + second.cost_usd, (first.text, second.text))
