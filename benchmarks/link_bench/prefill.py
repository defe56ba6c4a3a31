"""The serving benchmark's prefill phase: long prompts (about `num_tokens` each) with one output token, one
request at a time, so the time to the first token is almost all prompt processing.

    prompts, used = long_prompts(render, texts, num_prompts=8, num_tokens=512)   # token ids, texts consumed
    record = PrefillRecord(num_prompt_tokens=512, ttft_s=0.40, eval_s=0.35)
    row = summarize_prefill("llama-cpp", [record, ...])     # {"prefill_tokens_per_s": 1462.9, ...}

Prefill tokens/s = sum(prompt tokens) / sum(prefill seconds) over the phase's requests, where a request's
prefill seconds are the system's own prompt-evaluation time when it reports one (`eval_s`: llama.cpp's
`t_p_eval_ms` perf counter) and else its TTFT (`ttft_s`: request sent -> first token, which for our HTTP
server also holds the request's parsing, scheduling, the first token's sampling and its SSE chunk).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable, Sequence

from benchmarks.link_bench.timing import percentile


@dataclass(frozen=True)
class PrefillRecord:
    """One long-prompt request: its prompt tokens, TTFT (s) and, where the system reports it, its own
    prompt-evaluation time (s)."""

    num_prompt_tokens: int
    ttft_s: float
    eval_s: float | None = None

    def __post_init__(self) -> None:
        if self.num_prompt_tokens < 1 or self.ttft_s <= 0 or (self.eval_s is not None and self.eval_s <= 0):
            raise ValueError(f"a prefill record needs prompt tokens and positive times: {self}")

    @property
    def prefill_s(self) -> float:
        """The system's own prompt-evaluation time when it has one, else the TTFT."""
        return self.ttft_s if self.eval_s is None else self.eval_s


def long_prompts(render: Callable[[str], list[int]], texts: Sequence[str], num_prompts: int,
                 num_tokens: int) -> tuple[list[list[int]], int]:
    """`num_prompts` prompts of exactly `num_tokens` token ids: consecutive `texts` joined into one user message
    until its rendered ids reach `num_tokens`, then cut there (no two prompts share a text). Returns the prompts
    and how many texts they used.

    Raises:
        ValueError: `texts` run out first, or sizes are not positive.
    """
    if num_prompts < 1 or num_tokens < 1:
        raise ValueError("num_prompts and num_tokens must be positive")
    prompts, used = [], 0
    for _ in range(num_prompts):
        parts: list[str] = []
        ids: list[int] = []
        while len(ids) < num_tokens:
            if used >= len(texts):
                raise ValueError(f"the workload's texts ran out building {num_prompts} prompts of {num_tokens} tokens")
            parts.append(texts[used])
            used += 1
            ids = render("\n\n".join(parts))
        prompts.append(ids[:num_tokens])
    return prompts, used


def _timer(records: Sequence[PrefillRecord]) -> str:
    has_eval = {r.eval_s is not None for r in records}
    return "mixed" if len(has_eval) == 2 else "own prompt-eval timer" if True in has_eval else "ttft"


def summarize_prefill(system: str, records: Sequence[PrefillRecord]) -> dict:
    """One row of the prefill table (see the module docstring); times in s.

    Raises:
        ValueError: `records` is empty.
    """
    if not records:
        raise ValueError("no prefill records")
    num_tokens = sum(r.num_prompt_tokens for r in records)
    ttfts = [r.ttft_s for r in records]
    return {
        "system": system, "num_requests": len(records), "mean_prompt_tokens": num_tokens / len(records),
        "timer": _timer(records),
        "prefill_tokens_per_s": num_tokens / sum(r.prefill_s for r in records),
        "ttft_prefill_tokens_per_s": num_tokens / sum(ttfts),
        "ttft_p50_s": percentile(ttfts, 50), "ttft_p99_s": percentile(ttfts, 99),
        "requests": [asdict(r) for r in records],
    }
