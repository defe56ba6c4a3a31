"""Timing helpers shared by the benchmarks: per-request records, percentiles and timed calls.

    record = record_from_times(num_prompt_tokens=12, num_output_tokens=8, start=t0, first=t1, last=t2)
    percentile([0.1, 0.2, 0.3], 99)         # -> 0.298 (linear interpolation, numpy's default)
    seconds = time_call(generate, 64)       # wall seconds of generate(64), perf_counter clock
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence


@dataclass(frozen=True)
class TimedRequest:
    """One generation request's timings (seconds); `itl_s` is None for a single output token; `start_s`:
    when it was sent (perf_counter instant; None where a system does not report it)."""

    num_prompt_tokens: int
    num_output_tokens: int
    ttft_s: float
    itl_s: float | None
    latency_s: float
    start_s: float | None = None


def record_from_times(num_prompt_tokens: int, num_output_tokens: int, start: float, first: float, last: float) -> TimedRequest:
    """A TimedRequest from perf_counter instants (s): request sent, first token, last token.

    ITL = (last - first) / (num_output_tokens - 1); TTFT = first - start; latency = last - start.
    """
    itl = (last - first) / (num_output_tokens - 1) if num_output_tokens > 1 else None
    return TimedRequest(num_prompt_tokens, num_output_tokens, first - start, itl, last - start, start)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (q in 0..100, linear interpolation) of `values`; None when there are none."""
    import numpy as np

    return float(np.percentile(values, q)) if len(values) else None


def time_call(fn: Callable, *args) -> float:
    """Wall seconds (perf_counter) that fn(*args) takes; its result is dropped."""
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start
