"""Fakes for the eval tests: a scripted target that counts its calls, a tiny suite, and scripted judges.

    target = FakeTarget("m", answer=lambda request: "42", cost_usd=0.001, delay_s=0.01)
    suite = FakeSuite(n=10)                 # items "fake/test/0".., reference "answer-i"; grade 1 when equal
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from evals.base import Answer, Grade, Item, PromptStyle, Suite
from evals.targets import Completion, Prices, TargetError


def _text_of(request: Any) -> str:
    return request if isinstance(request, str) else "\n".join(str(m.get("content", "")) for m in request)


class FakeTarget:
    """Answers `answer(request_text)`; `fail(request_text, attempt)` may return a TargetError to raise instead.

    Attributes:
        requests: every call started, as (kind, request, params). completed: calls that returned.
        in_flight, max_in_flight: concurrent calls now / at most.
    """

    def __init__(self, name: str, answer: Callable[[str], str] | str = "ok", *, cost_usd: float = 0.0,
                 delay_s: float = 0.0, prices: Prices | None = None,
                 fail: Callable[[str, int], TargetError | None] | None = None):
        self.name, self.prices = name, prices
        self.answer = answer if callable(answer) else (lambda _text, a=answer: a)
        self.cost_usd, self.delay_s, self.fail = cost_usd, delay_s, fail
        self.requests: list[tuple[str, Any, dict]] = []
        self.completed: list[str] = []
        self.attempts: dict[str, int] = {}
        self.in_flight = self.max_in_flight = 0

    async def chat(self, messages, **params) -> Completion:
        return await self._call("chat", messages, params)

    async def complete(self, prompt, **params) -> Completion:
        return await self._call("completion", prompt, params)

    async def _call(self, kind, request, params) -> Completion:
        text = _text_of(request)
        self.requests.append((kind, request, params))
        attempt = self.attempts.get(text, 0)
        self.attempts[text] = attempt + 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay_s)
            error = self.fail(text, attempt) if self.fail else None
            if error is not None:
                raise error
            reply = self.answer(text)
        finally:
            self.in_flight -= 1
        self.completed.append(text)
        return Completion(text=reply, finish_reason="stop", model=self.name, prompt_tokens=len(text.split()),
                          completion_tokens=len(reply.split()), cost_usd=self.cost_usd, latency_s=0.1 + len(text) / 1000)


class FakeSuite(Suite):
    """`n` items "fake/test/i" asking "question i"; a reply equal to "answer-i" scores 1."""

    name = "fake"
    sampling = {"temperature": 0.0, "max_tokens": 10}

    def __init__(self, data_dir: Path = Path("."), *, n: int = 10, **kwargs):
        super().__init__(data_dir, **kwargs)
        self.n = n

    def load(self, split: str = "test") -> list[Item]:
        return [Item(f"fake/{split}/{i}", f"question {i}", f"answer-{i}") for i in range(self.n)]

    def request(self, item: Item) -> tuple[PromptStyle, dict[str, Any]]:
        return "chat", {"messages": [{"role": "user", "content": item.prompt}]}

    async def grade(self, item: Item, answer: Answer, judge=None) -> Grade:
        return Grade(float(answer.text == item.reference), {"reply": answer.text})


def correct_when(predicate: Callable[[int], bool]) -> Callable[[str], str]:
    """An answer function for FakeSuite: "answer-i" for items where predicate(i), else "wrong"."""
    def answer(text: str) -> str:
        i = int(re.search(r"question (\d+)", text).group(1))
        return f"answer-{i}" if predicate(i) else "wrong"
    return answer
