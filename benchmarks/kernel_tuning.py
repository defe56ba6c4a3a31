"""Continuous compilation for a local model: record its shapes on a workload, tune, report the table.

    link compile tune --model smollm2-135m-instruct --workload serving --budget-s 300
    link compile status [--json]

`tune_model` loads the model, gets shape counts (workload "serving": the serving benchmark's prompts,
`benchmarks/link_bench/workload.py`, run through an in-process engine as closed loops at concurrency 1 and 16 with
the `ShapeRecorder` attached; "recorded": the counts engines saved in the winner table, see
`kernels.background.BackgroundTuner`), and runs the `Tuner` on them within the budget. The winners are in
$LINK_HOME/compile/winners.sqlite; every engine started afterwards installs them (`EngineConfig.tuned_kernels`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from kernels.recorder import Bucket, ShapeRecorder
from kernels.winners import Environment, Result, WinnerTable

WORKLOADS = ("serving", "recorded")


@dataclass
class TuneOutcome:
    """What one `tune_model` run did: the counts it tuned from, the rows written, seconds spent."""

    model: str
    counts: dict[Bucket, int]
    results: list[Result] = field(default_factory=list)
    record_s: float = 0.0
    tune_s: float = 0.0

    @property
    def winners(self) -> list[Result]:
        return [r for r in self.results if r.status == "winner" and r.variant != "default"]


def record_workload(engine, prompts: Sequence[list[int]], concurrencies: Sequence[int] = (1, 16), max_tokens: int = 16,
                    recorder: ShapeRecorder | None = None) -> dict[Bucket, int]:
    """Run `prompts` through `engine` (an `LLMEngine`) as a closed loop per concurrency, recording shapes.

    Concurrency c keeps c requests in flight (a new one joins when one finishes) over its own slice
    of the prompts (c=1: 2 prompts; c>1: c prompts); greedy, EOS ignored, `max_tokens` tokens each.
    Returns the recorder's counts per bucket.
    """
    import kernels
    from serving.sampling.params import SamplingParams

    recorder = recorder or ShapeRecorder()
    previous = kernels.attach_recorder(recorder)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    pending = list(prompts)
    try:
        for level, c in enumerate(concurrencies):
            batch, pending = pending[: max(2, c)], pending[max(2, c):]
            queue = list(reversed(batch))
            for _ in range(min(c, len(queue))):
                engine.add_request(f"record-{level}-{len(queue)}", queue.pop(), params)
            while engine.has_unfinished_requests:
                for output in engine.step():
                    if output.finished and queue:
                        engine.add_request(f"record-{level}-{len(queue)}", queue.pop(), params)
    finally:
        kernels.attach_recorder(previous)
    return recorder.snapshot()


def tune_model(model: str = "smollm2-135m-instruct", workload: str = "serving", budget_s: float = 300.0, *,
               dtype: str = "float32", num_prompts: int | None = None, max_tokens: int = 16, concurrencies: Sequence[int] = (1, 16),
               providers: Sequence[str] | None = None, allow_lossy: bool = False, table: WinnerTable | None = None,
               data_dir=None, progress: Callable[[str, int, int], None] = lambda message, done, total: None) -> TuneOutcome:
    """Record (or load) the shape counts of `model` and tune its hot buckets within `budget_s` seconds.

    `num_prompts` (default: what `concurrencies` use, `record_workload`) serving prompts are recorded.

    Raises:
        ValueError: an unknown workload or provider; "recorded" with no saved counts; fewer `num_prompts`
            than the concurrency levels use.
        UnknownModelError, ServingError, FileNotFoundError: the model or the workload data cannot be loaded.
    """
    from kernels.candidates import DEFAULT_PROVIDERS, register_candidates
    from kernels.tuner import Tuner
    from serving.engine.llm_engine import EngineConfig, LLMEngine
    from serving.model_loader import load_model
    from serving.registry import default_registry

    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}; choose from {', '.join(WORKLOADS)}")
    needed = sum(max(2, c) for c in concurrencies)
    if workload == "serving" and num_prompts is not None and num_prompts < needed:
        raise ValueError(f"--num-prompts {num_prompts} is too few for concurrency {', '.join(map(str, concurrencies))}: "
                         f"record_workload uses {needed} (2 at concurrency 1, c at c > 1)")
    table = table or WinnerTable()
    register_candidates(tuple(providers) if providers else DEFAULT_PROVIDERS + (("quantized",) if allow_lossy else ()))
    progress(f"loading {model}", 0, 0)
    loaded = load_model(default_registry().get(model), dtype, weights="float")
    outcome = TuneOutcome(model, {})
    start = time.monotonic()
    prompts = None
    if workload == "recorded":
        outcome.counts = table.counts(model)
        if not outcome.counts:
            raise ValueError(f"no recorded shapes of {model} in {table.path}; serve it with compile_tune on, or use --workload serving")
    else:
        from benchmarks.link_bench.workload import default_data_dir, load_workload, render_prompts

        texts = load_workload(data_dir or default_data_dir())[: num_prompts or needed]
        _, prompts = render_prompts(model, texts)
        progress(f"recording shapes: {len(prompts)} serving prompts at concurrency {', '.join(map(str, concurrencies))}", 0, 0)
        engine = LLMEngine(loaded, EngineConfig(tuned_kernels=False))
        outcome.counts = record_workload(engine, prompts, concurrencies, max_tokens)
        table.add_counts(model, outcome.counts)
    outcome.record_s = time.monotonic() - start
    tuner = Tuner(table, model, model=loaded.model, allow_lossy=allow_lossy, prompts=prompts)
    start = time.monotonic()
    outcome.results = tuner.tune(outcome.counts, budget_s,
                                 progress=lambda b, done, total: progress(f"{b.op} {b.label} {b.dtype}", done, total))
    outcome.tune_s = time.monotonic() - start
    return outcome


def status_rows(table: WinnerTable | None = None, model: str | None = None) -> list[dict]:
    """The table's rows (every model, or `model`), as dicts; `current` says whether a row's device and
    library versions are this process's (only those rows are installed here)."""
    table = table or WinnerTable()
    rows = []
    for r in table.results():
        if model and r.env.model != model:
            continue
        here = Environment.current(r.env.model)
        rows.append({"model": r.env.model, "device": r.env.device, "torch": r.env.torch_version, "triton": r.env.triton_version,
                     "current": here == r.env, "op": r.bucket.op, "bucket": r.bucket.label, "dtype": r.bucket.dtype, "variant": r.variant, "status": r.status,
                     "median_ms": r.median_ms, "baseline_ms": r.baseline_ms, "speedup": r.speedup, "calls": r.calls,
                     "message": r.message, "tuned_at": r.tuned_at})
    return rows
