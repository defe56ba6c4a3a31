"""Suites: what a benchmark is made of, and the registry that builds one by name.

A suite loads its items from a data directory laid out like ../shared/data, turns an item into the
request(s) a target answers (`answer`), and grades the answer (`grade`) into a score in [0, 1]:

    suite = make_suite("gsm8k", data_dir=Path("../shared/data"), shots=0)
    items = suite.load("test")                        # list[Item]
    answer = await suite.answer(items[0], target)     # one or more target calls (MT-Bench: two turns)
    grade = await suite.grade(items[0], answer, judge=None)
    grade.score                                       # 1.0 or 0.0 for GSM8K

`Suite.answer` goes through `target.chat` / `target.complete` only, so the runner can wrap the target in a
cache (an interrupted run resumes) and a cost guard without the suite knowing. Suites whose grading
calls a model (MT-Bench, AlpacaEval) set `needs_judge = True` and get a judge target in `grade`.
"""

from __future__ import annotations

import importlib
import json
import random
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from evals.targets import Completion, Target

PromptStyle = Literal["chat", "completion"]


@dataclass(frozen=True)
class Item:
    """One benchmark question.

    Attributes:
        id: stable within the suite and split ("gsm8k/test/17"); the cache and outcome key.
        prompt: the question as text (what outcome tables and routers see).
        reference: the gold answer in the suite's own form (a number, a letter, unit tests, accepted calls).
        metadata: anything else the suite needs (subject, category, tools, second turn...).
    """

    id: str
    prompt: str
    reference: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class Answer:
    """A target's whole answer to one item (all its turns).

    Attributes:
        completions: one per request made (MT-Bench: two), in order.
        error: the last error message when the target failed after retries (then `completions` may be empty).
    """

    completions: list[Completion] = field(default_factory=list)
    error: str | None = None

    @property
    def text(self) -> str:
        """The final turn's text ("" when there is none)."""
        return self.completions[-1].text if self.completions else ""

    @property
    def cost_usd(self) -> float:
        return sum(c.cost_usd for c in self.completions)

    @property
    def prompt_tokens(self) -> int:
        return sum(c.prompt_tokens for c in self.completions)

    @property
    def completion_tokens(self) -> int:
        return sum(c.completion_tokens for c in self.completions)

    @property
    def latency_s(self) -> float:
        return sum(c.latency_s for c in self.completions)

    def to_dict(self) -> dict[str, Any]:
        return {"completions": [asdict(c) for c in self.completions], "error": self.error}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Answer:
        return cls([Completion(**c) for c in data.get("completions", [])], data.get("error"))


@dataclass(frozen=True)
class Grade:
    """A graded answer.

    Attributes:
        score: quality in [0, 1].
        details: JSON-able evidence (extracted answer, judge verdict, failing test...).
        judge_cost_usd: USD spent on judge calls for this grade.
    Raises:
        ValueError: a score outside [0, 1].
    """

    score: float
    details: dict[str, Any] = field(default_factory=dict)
    judge_cost_usd: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.score <= 1.0:
            raise ValueError(f"a grade's score must be in [0, 1], got {self.score}")


class Suite(ABC):
    """A benchmark: items, the requests that answer them, and a grader.

    Args:
        data_dir: a folder laid out like ../shared/data (the suite knows its sub-path).
        shots: few-shot examples per prompt (None: the suite's default).
        style: "chat" (messages to /v1/chat/completions) or "completion" (a text prompt, for base models).
        seed: seeds few-shot sampling and `sample`.
        options: suite-specific settings (e.g. `path` of a JSONL suite, `categories` of BFCL).
    Raises:
        FileNotFoundError: (from `load`) the suite's files are missing under `data_dir`; the message names the path.
    """

    name: str = ""
    splits: tuple[str, ...] = ("test",)
    default_shots: int = 0
    needs_judge: bool = False
    # Sampling for every request of the suite (greedy by default so that runs are reproducible).
    sampling: dict[str, Any] = {"temperature": 0.0, "max_tokens": 512}

    def __init__(self, data_dir: Path, *, shots: int | None = None, style: PromptStyle = "chat", seed: int = 0,
                 **options: Any):
        self.data_dir = Path(data_dir)
        self.shots = self.default_shots if shots is None else shots
        self.style: PromptStyle = style
        self.seed = seed
        self.options = options

    @abstractmethod
    def load(self, split: str) -> list[Item]:
        """All items of `split` (one of `splits`), in the data's order."""

    def sample(self, items: list[Item], limit: int | None) -> list[Item]:
        """A seeded sample of `limit` items (all when None or larger), in the data's order.
        Raises ValueError when `limit` < 1."""
        if limit is not None and limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        if limit is None or limit >= len(items):
            return list(items)
        keep = set(random.Random(self.seed).sample(range(len(items)), limit))
        return [item for i, item in enumerate(items) if i in keep]

    async def answer(self, item: Item, target: Target) -> Answer:
        """Ask `target` the item (default: one request built by `request`). Target errors propagate."""
        kind, payload = self.request(item)
        params = {**self.sampling, **payload.get("params", {})}
        if kind == "chat":
            completion = await target.chat(payload["messages"], **params)
        else:
            completion = await target.complete(payload["prompt"], **params)
        return Answer([completion])

    def request(self, item: Item) -> tuple[PromptStyle, dict[str, Any]]:
        """The request for `item`: ("chat", {"messages": [...], "params": {...}}) or
        ("completion", {"prompt": "...", "params": {...}}). Suites that use the default `answer` implement it."""
        raise NotImplementedError(f"suite {self.name!r} defines neither request() nor answer()")

    @abstractmethod
    async def grade(self, item: Item, answer: Answer, judge: Target | None = None) -> Grade:
        """Score `answer` in [0, 1]. A judge-based suite raises ValueError when `judge` is None."""

    def answer_key(self, item: Item, answer: Answer, grade: Grade) -> str | None:
        """The answer's final answer in a normal form, compared across samples for the agreement signal
        (`routers.signals.agreement`): the grade's extracted answer where the suite records one (`details`
        "extracted": a number, a letter; None when none was found), else its calls ("calls": canonical JSON),
        else the reply's text with whitespace collapsed; None for an empty reply."""
        if "extracted" in grade.details:
            value = grade.details["extracted"]
            return None if value is None else str(value)
        if "calls" in grade.details:
            calls = grade.details["calls"]
            return None if calls is None else json.dumps(calls, sort_keys=True, separators=(",", ":"), default=str)
        text = " ".join(answer.text.split())
        return text or None


# name -> "module:Class"; a suite's module is imported when the suite is first built.
SUITES: dict[str, str] = {
    "gsm8k": "evals.suites.gsm8k:GSM8K",
    "mmlu": "evals.suites.mmlu:MMLU",
    "humaneval": "evals.suites.humaneval:HumanEval",
    "mt-bench": "evals.suites.mt_bench:MTBench",
    "alpaca-eval": "evals.suites.alpaca_eval:AlpacaEval",
    "bfcl": "evals.suites.bfcl:BFCL",
    "jsonl": "evals.suites.jsonl:JSONLSuite",
}


def register_suite(name: str, target: str) -> None:
    """Register a suite class by "module:Class" under `name`."""
    SUITES[name] = target


def make_suite(name: str, data_dir: Path, **kwargs: Any) -> Suite:
    """Build the suite called `name`. Raises ValueError naming the available suites for an unknown name."""
    try:
        module_name, _, class_name = SUITES[name].partition(":")
    except KeyError:
        raise ValueError(f"unknown suite {name!r}; available: {', '.join(sorted(SUITES))}") from None
    cls = getattr(importlib.import_module(module_name), class_name)
    return cls(data_dir, **kwargs)
