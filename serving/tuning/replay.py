"""Replay a recorded traffic mix against an in-process engine and measure it.

    result = replay(loaded, EngineConfig(max_num_seqs=8), load_mix("mix.jsonl"), speedup=4.0)
    result.output_tokens_per_s, result.ttft_p99_s

Each `RequestShape` becomes a request of synthetic prompt token ids of its recorded length (seeded,
drawn from the vocabulary less its first and last 256 ids, where special tokens sit; or, given a
`prompt_pool` of real prompts, the pool's prompts in turn, repeated or cut to the length), generating
exactly its recorded output length (`ignore_eos`, `max_tokens`); "greedy" shapes decode at
temperature 0, "sampled" ones at temperature 0.8 with a per-request seed. Arrivals are open loop on
the recorded schedule divided by `speedup` (4.0 plays a 60 s recording in 15 s): a request is added
at the first step boundary after its arrival, so queueing shows in its time to first token.

Measured (seconds, `time.perf_counter`):
- TTFT = first token - scheduled arrival; ITL = (last token - first token) / (output tokens - 1);
- throughput = all output tokens / (last token of the replay - first arrival).
One short request runs before the clock starts, so allocator and first-call costs stay out.
"""

from __future__ import annotations

import dataclasses
import random
import time
from dataclasses import dataclass, field

from serving.engine.llm_engine import EngineConfig, LLMEngine
from serving.model_loader import LoadedModel
from serving.sampling.params import SamplingParams
from serving.tuning.traffic import RequestShape

_SPECIAL_MARGIN = 256  # token ids kept out of synthetic prompts at both ends of the vocabulary


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    import numpy as np

    return float(np.percentile(values, q))


@dataclass(frozen=True)
class ReplayResult:
    """One replay's measurements (seconds; per-request lists in mix order)."""

    num_requests: int
    num_output_tokens: int
    duration_s: float
    ttft_s: list[float] = field(default_factory=list)
    itl_s: list[float] = field(default_factory=list)
    num_preemptions: int = 0

    @property
    def output_tokens_per_s(self) -> float:
        return self.num_output_tokens / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def ttft_p50_s(self) -> float | None:
        return _percentile(self.ttft_s, 50)

    @property
    def ttft_p99_s(self) -> float | None:
        return _percentile(self.ttft_s, 99)

    @property
    def itl_p50_s(self) -> float | None:
        return _percentile(self.itl_s, 50)

    def summary(self) -> dict:
        """The headline numbers as a JSON-ready dict."""
        return {"num_requests": self.num_requests, "num_output_tokens": self.num_output_tokens,
                "duration_s": self.duration_s, "output_tokens_per_s": self.output_tokens_per_s,
                "ttft_p50_s": self.ttft_p50_s, "ttft_p99_s": self.ttft_p99_s, "itl_p50_s": self.itl_p50_s,
                "num_preemptions": self.num_preemptions}


def synthetic_prompt(length: int, vocab_size: int, rng: random.Random) -> list[int]:
    """`length` token ids drawn uniformly from [256, vocab_size - 256) (the whole vocabulary if small)."""
    low, high = (_SPECIAL_MARGIN, vocab_size - _SPECIAL_MARGIN) if vocab_size > 4 * _SPECIAL_MARGIN else (0, vocab_size)
    return [rng.randrange(low, high) for _ in range(length)]


def pooled_prompt(length: int, pool: list[list[int]], index: int) -> list[int]:
    """Pool prompt `index % len(pool)`, repeated until `length` tokens and cut there (real text keeps the
    repetitions that prompt-lookup speculation finds; random ids have none)."""
    source = pool[index % len(pool)]
    return (source * (length // len(source) + 1))[:length]


def _params(shape: RequestShape, seed: int) -> SamplingParams:
    if shape.kind == "sampled":
        return SamplingParams(temperature=0.8, seed=seed, max_tokens=shape.output_tokens, ignore_eos=True)
    return SamplingParams(temperature=0, max_tokens=shape.output_tokens, ignore_eos=True)


def replay(loaded: LoadedModel, config: EngineConfig, mix: list[RequestShape], *, speedup: float = 1.0,
           seed: int = 0, prompt_pool: list[list[int]] | None = None) -> ReplayResult:
    """Run `mix` against a new `LLMEngine(loaded, config)` on the (scaled) recorded schedule; see the module docstring.

    Stored kernel winners are not installed by this engine (`tuned_kernels` off): they are process-wide,
    so the ones already in place apply to every replay alike.

    Raises:
        ValueError: an empty mix, a non-positive `speedup`, or a request longer than the engine's context.
    """
    if not mix:
        raise ValueError("the mix is empty")
    if speedup <= 0:
        raise ValueError(f"speedup must be positive, got {speedup}")
    engine = LLMEngine(loaded, dataclasses.replace(config, tuned_kernels=False))
    too_long = [s for s in mix if s.prompt_tokens + s.output_tokens > engine.max_model_len]
    if too_long:
        raise ValueError(f"{len(too_long)} requests exceed the engine's {engine.max_model_len} tokens, e.g. {too_long[0]}")
    rng = random.Random(seed)
    vocab = loaded.config.vocab_size
    engine.add_request("warmup", synthetic_prompt(8, vocab, rng), SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    while engine.has_unfinished_requests:
        engine.step()
    order = sorted(range(len(mix)), key=lambda i: mix[i].arrival_s)
    prompts = {i: pooled_prompt(mix[i].prompt_tokens, prompt_pool, i) if prompt_pool else
               synthetic_prompt(mix[i].prompt_tokens, vocab, rng) for i in order}
    arrival = {i: (mix[i].arrival_s - mix[order[0]].arrival_s) / speedup for i in order}
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    num_tokens: dict[int, int] = {}
    preemptions = engine.scheduler.num_preemptions
    t0 = time.perf_counter()
    pending = list(order)
    while pending or engine.has_unfinished_requests:
        now = time.perf_counter() - t0
        while pending and arrival[pending[0]] <= now:
            i = pending.pop(0)
            engine.add_request(str(i), prompts[i], _params(mix[i], seed + i))
        if not engine.has_unfinished_requests:
            time.sleep(max(0.0, arrival[pending[0]] - now))
            continue
        outputs = engine.step()
        now = time.perf_counter() - t0
        for output in outputs:
            i = int(output.request_id)
            count = sum(len(c.token_ids) for c in output.outputs)
            if count and i not in first:
                first[i] = now
            if output.finished:
                last[i], num_tokens[i] = now, count
    ttft = [first[i] - arrival[i] for i in range(len(mix))]
    itl = [(last[i] - first[i]) / (num_tokens[i] - 1) for i in range(len(mix)) if num_tokens[i] > 1]
    return ReplayResult(len(mix), sum(num_tokens.values()), max(last.values()), ttft, itl,
                        engine.scheduler.num_preemptions - preemptions)
