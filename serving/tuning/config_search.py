"""The engine-configuration search of the tuner: which `EngineConfig` serves a traffic mix best.

Objective: the highest output throughput (tokens/s) among the candidates whose p99 time to first
token is at most the default configuration's (times `1 + ttft_slack`, 0 by default), both measured
in the same run. A candidate is a dict of `EngineConfig` overrides over the base configuration
(`{}` is the default itself); the search space (`default_space`) covers the prefill chunk
(`max_num_batched_tokens`), the batch size (`max_num_seqs`), speculative decoding off or on with its
lookahead bounds (`SpeculativeConfig` k_min..k_max and the number of running sequences at which it
stops), and the KV block size.

Coordinate descent under a budget of measurements: starting from the default, each dimension in turn
tries its values with the others held at the best so far and keeps the best feasible one. Then the
default and the winner are measured `confirm` more times, alternately, and each is summarized by the
median of all its measurements; a winner that no longer beats the default there is dropped (the
default wins). `measure(candidate)` is a replay of the mix (`serving.tuning.replay`) in production, a fake in
the tests.

    outcome = search(lambda c: measure_replay(loaded, base, c, mix), budget=10)
    outcome.winner, outcome.winner_measurement.output_tokens_per_s
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from dataclasses import dataclass, field
from typing import Callable

from serving.engine.llm_engine import EngineConfig
from serving.spec_decode.config import SpeculativeConfig

Candidate = dict  # EngineConfig field -> value; "speculative" holds a SpeculativeConfig or None


@dataclass(frozen=True)
class Measurement:
    """A candidate's replay: output throughput (tokens/s) and p99 TTFT (s); `summary` the replay's numbers."""

    output_tokens_per_s: float
    ttft_p99_s: float
    summary: dict = field(default_factory=dict, compare=False)


def default_space(with_speculation: bool = True) -> dict[str, tuple]:
    """The searched values per `EngineConfig` field, in the order coordinate descent visits them."""
    space: dict[str, tuple] = {
        "max_num_batched_tokens": (128, 256, 512, 1024, 2048),
        "max_num_seqs": (4, 8, 16, 32, 64),
    }
    if with_speculation:
        space["speculative"] = (None, SpeculativeConfig(num_speculative_tokens=3, disable_by_batch_size=2),
                                SpeculativeConfig(num_speculative_tokens=5, disable_by_batch_size=4),
                                SpeculativeConfig(num_speculative_tokens=8, min_speculative_tokens=2, disable_by_batch_size=8))
    space["block_size"] = (8, 16, 32, 64)
    return space


def canonical(candidate: Candidate, base: EngineConfig = EngineConfig()) -> Candidate:
    """The candidate less the overrides equal to `base`'s values (so {"max_num_seqs": 32} == {})."""
    return {k: v for k, v in sorted(candidate.items()) if getattr(base, k) != v}


def apply(base: EngineConfig, candidate: Candidate) -> EngineConfig:
    """`base` with the candidate's overrides. Raises TypeError on a field EngineConfig lacks."""
    return dataclasses.replace(base, **candidate)


def to_json(candidate: Candidate) -> dict:
    """A JSON-ready candidate (a SpeculativeConfig as its dict)."""
    return {k: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v for k, v in candidate.items()}


def from_json(data: dict) -> Candidate:
    """The inverse of `to_json`. Raises ValueError/TypeError on a malformed speculative entry."""
    return {k: _speculative(v) if k == "speculative" and v is not None else v for k, v in data.items()}


def _speculative(values: dict) -> SpeculativeConfig:
    """A stored `SpeculativeConfig`; one stored before `disable_by_batch_size` carries `max_batch_size`
    B (no drafts when more than B sequences decode), the same cut as `disable_by_batch_size` B + 1."""
    values = dict(values)
    if "max_batch_size" in values:
        values["disable_by_batch_size"] = values.pop("max_batch_size") + 1
    return SpeculativeConfig(**values)


def describe(candidate: Candidate) -> str:
    """A short label: "default", or the overrides ("max_num_seqs=8 speculative=ngram k1-5 b<4")."""
    parts = []
    for k, v in candidate.items():
        if isinstance(v, SpeculativeConfig):
            v = f"{v.method} k{v.min_speculative_tokens}-{v.num_speculative_tokens} b<{v.disable_by_batch_size}"
        elif v is None and k == "speculative":
            v = "off"
        parts.append(f"{k}={v}")
    return " ".join(parts) or "default"


def _key(candidate: Candidate) -> str:
    return json.dumps(to_json(candidate), sort_keys=True)


@dataclass
class SearchOutcome:
    """The search's result: the winner (`{}` = the default), both summarized measurements, every trial."""

    winner: Candidate
    default_measurement: Measurement
    winner_measurement: Measurement
    trials: list[tuple[Candidate, Measurement]] = field(default_factory=list)

    @property
    def speedup(self) -> float:
        """Winner throughput / default throughput (1.0 when the default won)."""
        base = self.default_measurement.output_tokens_per_s
        return self.winner_measurement.output_tokens_per_s / base if base > 0 else 1.0


def _median(measurements: list[Measurement]) -> Measurement:
    return Measurement(statistics.median(m.output_tokens_per_s for m in measurements),
                       statistics.median(m.ttft_p99_s for m in measurements), measurements[-1].summary)


def search(measure: Callable[[Candidate], Measurement], *, base: EngineConfig = EngineConfig(),
           space: dict[str, tuple] | None = None, budget: int = 12, confirm: int = 1, ttft_slack: float = 0.0,
           repeats: int = 1, progress: Callable[[Candidate, Measurement], None] = lambda c, m: None) -> SearchOutcome:
    """Coordinate descent for the highest throughput at a p99 TTFT no worse than the default's (see the module docstring).

    Args:
        measure: replays the mix under `apply(base, candidate)` and returns its `Measurement`.
        base: the configuration the candidates override (its own values are "the default").
        space: values per field (default: `default_space()`).
        budget: measurements during the descent, the default's included (the confirmations are extra).
        confirm: extra alternating measurements of the default and the winner at the end.
        ttft_slack: allowed relative excess of p99 TTFT over the default's (0.0: equal or better).
        repeats: measurements per candidate visit, compared by their median (a noisy, shared machine);
            each counts against `budget`.
        progress: called after every measurement.

    Raises:
        ValueError: a budget or repeats below 1, or a negative slack.
    """
    if budget < 1 or repeats < 1 or ttft_slack < 0:
        raise ValueError(f"budget and repeats must be >= 1 and ttft_slack >= 0, got {budget}, {repeats}, {ttft_slack}")
    space = default_space() if space is None else space
    runs: dict[str, list[Measurement]] = {}
    trials: list[tuple[Candidate, Measurement]] = []

    def run(candidate: Candidate) -> Measurement:
        """`repeats` measurements of the candidate; their median."""
        for _ in range(repeats):
            m = measure(candidate)
            runs.setdefault(_key(candidate), []).append(m)
            trials.append((candidate, m))
            progress(candidate, m)
        return _median(runs[_key(candidate)][-repeats:])

    default = run({})
    limit = default.ttft_p99_s * (1 + ttft_slack)
    best, best_m = {}, default
    for name, values in space.items():
        current = best
        for value in values:
            candidate = canonical({**current, name: value}, base)
            if _key(candidate) in runs:
                continue
            if len(trials) + repeats > budget:
                break
            m = run(candidate)
            if m.ttft_p99_s <= limit and m.output_tokens_per_s > best_m.output_tokens_per_s:
                best, best_m = candidate, m
    if best:
        for _ in range(confirm):
            run({})
            run(best)
    default_m = _median(runs[_key({})])
    winner_m = _median(runs[_key(best)])
    if best and not (winner_m.ttft_p99_s <= default_m.ttft_p99_s * (1 + ttft_slack)
                     and winner_m.output_tokens_per_s > default_m.output_tokens_per_s):
        best, winner_m = {}, default_m
    return SearchOutcome(best, default_m, winner_m, trials)
