"""The `ShapeRecorder`'s cost against the SmolLM2-135M decode step (the goal: under 2% of step time).

    python benchmarks/bench_recorder.py [--batch 1 --batch 16] [--steps 30] [--threads 1] [--step native] [--json out.json]

Two measurements, printed with the load average (the machine may be shared):
1. per call: `dispatch("rms_norm", x[1, 576], ...)` with a no-op registered for the op (so only the
   dispatch path is timed), with nothing attached, with a recorder, and with a recorder plus an
   installed winner of another bucket (the memoized bucket lookup); the median of 5 runs of 40,000
   calls per path, in nanoseconds. Overhead per step = extra ns per call x dispatched calls
   per decode step (counted by the recorder) / median step time.
2. whole steps: the decode step (model forward + logits) timed alternately without and with the
   recorder, `--steps` pairs, medians and their ratio (noisy under load; the per-call figure is the
   stable one). `--step eager` (default) is the eager forward, ~150 dispatched calls a step; `--step
   native` is the tuned step of `kernels.native_step` ("native-gguf", 3-6x faster at batch 1) as the
   engine runs it: the step recorded through `kernels.step_variant`, then the C++ step and the LM head.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kernels  # noqa: E402
from kernels.recorder import Bucket  # noqa: E402
from kernels.tuner_inputs import step_cases  # noqa: E402


def _noop(x, weight, eps, *, offset=0.0):
    return x


def per_call_ns(num_calls: int = 200_000) -> dict[str, float]:
    x, w = torch.randn(1, 576), torch.randn(576)
    out = {}
    for path in ("plain", "recorder", "recorder+winner"):
        kernels.reset()
        kernels.register("rms_norm", _noop)
        kernels.attach_recorder(kernels.ShapeRecorder() if path != "plain" else None)
        if path == "recorder+winner":
            kernels.install(Bucket("rms_norm", ((64, 576),), "float32"), "other", _noop)
            kernels.apply_pending()
        samples = []
        for _ in range(5):
            start = time.perf_counter_ns()
            for _ in range(num_calls // 5):
                kernels.dispatch("rms_norm", x, w, 1e-5)
            samples.append((time.perf_counter_ns() - start) / (num_calls // 5))
        out[path] = statistics.median(samples)
    kernels.reset()
    kernels.attach_recorder(None)
    return out


def _native_forward(model, batch_size: int):
    """The tuned C++ step as the engine's model runner calls it: the step recorded, then run."""
    from kernels.native_step import NativeDecodeStep

    native = NativeDecodeStep(model, "gguf")

    def forward(token_ids, batch, cache):
        kernels.step_variant("decode_step", batch_size, torch.float32, "smollm2-135m-instruct")
        return native(model, token_ids, batch, cache)

    return forward


@torch.inference_mode()
def step_times(model, batch_size: int, steps: int, kind: str = "eager") -> dict:
    (args, _), *_ = step_cases(model, batch_size)
    model_, token_ids, batch, cache = args
    forward = model_ if kind == "eager" else _native_forward(model_, batch_size)

    def step():
        hidden = forward(token_ids, batch, cache)
        model_.compute_logits(hidden)

    recorder = kernels.ShapeRecorder()
    for _ in range(3):
        step()
    plain, recorded = [], []
    for _ in range(steps):
        for attach, times in ((None, plain), (recorder, recorded)):
            kernels.attach_recorder(attach)
            start = time.perf_counter()
            step()
            times.append((time.perf_counter() - start) * 1e3)
    kernels.attach_recorder(None)
    calls_per_step = sum(recorder.snapshot().values()) / steps
    return {"batch": batch_size, "plain_ms": statistics.median(plain), "recorded_ms": statistics.median(recorded),
            "calls_per_step": calls_per_step}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, action="append", help="decode batch sizes (default 1 and 16)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: a shared 2-core machine)")
    parser.add_argument("--step", choices=("eager", "native"), default="eager", help="the decode step timed")
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from serving.model_loader import load_model
    from serving.registry import default_registry

    model = load_model(default_registry().get("smollm2-135m-instruct"), "float32", weights="float").model
    load_before = os.getloadavg()
    calls = per_call_ns()
    extra_ns = calls["recorder"] - calls["plain"]
    print(f"dispatch per call: plain {calls['plain']:.0f} ns, recorder {calls['recorder']:.0f} ns, "
          f"recorder + winner {calls['recorder+winner']:.0f} ns (+{extra_ns:.0f} ns recorded)")
    rows = []
    for batch_size in args.batch or [1, 16]:
        row = step_times(model, batch_size, args.steps, args.step)
        row["overhead_from_calls_pct"] = 100 * row["calls_per_step"] * extra_ns * 1e-6 / row["plain_ms"]
        row["overhead_from_steps_pct"] = 100 * (row["recorded_ms"] / row["plain_ms"] - 1)
        rows.append(row)
        print(f"{args.step} decode step B={batch_size}: {row['plain_ms']:.1f} ms plain, {row['recorded_ms']:.1f} ms recorded, "
              f"{row['calls_per_step']:.0f} dispatched calls/step; overhead {row['overhead_from_calls_pct']:.3f}% "
              f"(per-call cost x calls), {row['overhead_from_steps_pct']:+.2f}% (step medians)")
    load_after = os.getloadavg()
    print(f"load average (1, 5, 15 min): before {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}, "
          f"after {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}; {os.cpu_count()} CPUs, {args.threads} torch threads")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps({"per_call_ns": calls, "steps": rows, "load_before": load_before,
                                                    "load_after": load_after, "threads": args.threads, "step": args.step}, indent=2))


if __name__ == "__main__":
    main()
