"""Engine-configuration tuning on two recorded traffic mixes, default against tuned in one run.

    python benchmarks/bench_config_tuning.py [--budget 7] [--speedup 1] [--json out.json]

1. record: SmolLM2-135M (float32) behind an in-process `AsyncLLMEngine` with a `TrafficRecorder`
   attached serves two real workloads, and the recorder's shapes become the two mixes:
   - "long-trickle": repetitive prompts (`benchmarks/link_bench/workloads.py`: HumanEval code edits, two problems
     per prompt, ~400-700 tokens) arriving one at a time, `--trickle-gap-s` apart, `--trickle-tokens`
     output tokens (default 128: long enough for the decode phase, where speculation acts, to matter);
   - "short-bursts": bursts of `--burst-min` to `--burst-max` concurrent default prompts (AlpacaEval /
     MT-Bench, ~30-120 tokens), a burst when the previous one finished, `--burst-tokens` output tokens
     (default 16). Bursts of 40-48, beyond the default batch limit of 32 sequences, are a mix that the
     default configuration does not serve best; bursts of 12-16 are one it does.
2. tune: `benchmarks.config_tuning.tune_config` on each mix (replays on the recorded schedule with the
   workload's own prompt tokens as the pool, coordinate descent over prefill chunk, batch size,
   speculation on/off with lookahead bounds and KV block size, `--budget` replays, then one more
   alternating replay of the default and the winner; medians), into a fresh winner table.
3. report: per mix the default's and the winner's throughput (output tokens/s) and p99 TTFT (s),
   both measured in this run, and the two winning configurations; the load average before and after
   (the machine may be shared: the numbers are only as quiet as it is).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODEL = "smollm2-135m-instruct"


async def _serve(engine, schedule: list[tuple[float, list[int], int]]) -> None:
    """Send each (arrival s, prompt ids, output tokens) at its time; wait for every answer."""
    from serving.sampling.params import SamplingParams

    t0 = time.perf_counter()

    async def one(i: int, at: float, ids: list[int], max_tokens: int) -> None:
        await asyncio.sleep(max(0.0, at - (time.perf_counter() - t0)))
        async for _ in engine.generate(f"r{i}", ids, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)):
            pass

    await asyncio.gather(*(one(i, *item) for i, item in enumerate(schedule)))


async def _serve_bursts(engine, bursts: list[list[list[int]]], max_tokens: int) -> None:
    from serving.sampling.params import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    for b, burst in enumerate(bursts):
        async def one(i: int, ids: list[int]) -> None:
            async for _ in engine.generate(f"b{b}-{i}", ids, params):
                pass

        await asyncio.gather(*(one(i, ids) for i, ids in enumerate(burst)))


def record(loaded, serve) -> list:
    """Run `serve(engine)` on a fresh AsyncLLMEngine with a TrafficRecorder; the recorded shapes."""
    from serving.engine.async_engine import AsyncLLMEngine
    from serving.engine.llm_engine import EngineConfig, LLMEngine
    from serving.tuning.traffic import TrafficRecorder

    async def main():
        engine = AsyncLLMEngine(LLMEngine(loaded, EngineConfig(tuned_kernels=False)))
        engine.traffic = TrafficRecorder()
        try:
            await serve(engine)
        finally:
            await engine.shutdown()
        return engine.traffic.shapes()

    return asyncio.run(main())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=int, default=7, help="replays per mix during the search")
    parser.add_argument("--repeats", type=int, default=1, help="replays per candidate visit (median)")
    parser.add_argument("--speedup", type=float, default=1.0, help="replay arrivals this many times faster")
    parser.add_argument("--trickle", type=int, default=8, help="requests of the long-trickle mix")
    parser.add_argument("--trickle-gap-s", type=float, default=2.5)
    parser.add_argument("--trickle-tokens", type=int, default=128, help="output tokens per long-trickle request")
    parser.add_argument("--bursts", type=int, default=3, help="bursts of the short-bursts mix")
    parser.add_argument("--burst-tokens", type=int, default=16, help="output tokens per short-bursts request")
    parser.add_argument("--burst-min", type=int, default=12, help="fewest requests of a burst")
    parser.add_argument("--burst-max", type=int, default=16, help="most requests of a burst")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    import random

    from benchmarks.config_tuning import tune_config
    from benchmarks.link_bench.workload import default_data_dir, load_workload, render_prompts
    from benchmarks.link_bench.workloads import load_repetitive
    from kernels.config_winners import ConfigWinnerTable
    from serving.model_loader import load_model
    from serving.registry import default_registry
    from serving.spec_decode.config import SpeculativeConfig
    from serving.tuning.config_search import describe, from_json
    from serving.tuning.traffic import save_mix

    load_before = os.getloadavg()
    data_dir = default_data_dir()
    loaded = load_model(default_registry().get(MODEL), "float32")
    _, code = render_prompts(MODEL, load_repetitive(data_dir, seed=0)[: 2 * args.trickle])
    long_prompts = [code[2 * i] + code[2 * i + 1] for i in range(args.trickle)]
    short_texts = [t for t in load_workload(data_dir, seed=0) if len(t) < 400]
    rng = random.Random(0)
    sizes = [rng.randint(args.burst_min, args.burst_max) for _ in range(args.bursts)]
    _, short = render_prompts(MODEL, short_texts[: sum(sizes)])
    bursts, start = [], 0
    for size in sizes:
        bursts.append(short[start : start + size])
        start += size

    print(f"recording long-trickle: {args.trickle} prompts of {min(map(len, long_prompts))}-{max(map(len, long_prompts))} tokens", flush=True)
    trickle_mix = record(loaded, lambda e: _serve(e, [(i * args.trickle_gap_s, p, args.trickle_tokens) for i, p in enumerate(long_prompts)]))
    print(f"recording short-bursts: bursts of {sizes}", flush=True)
    burst_mix = record(loaded, lambda e: _serve_bursts(e, bursts, args.burst_tokens))

    space = {"max_num_batched_tokens": (128, 512, 2048), "max_num_seqs": (8, 32, 64),
             "speculative": (None, SpeculativeConfig(num_speculative_tokens=5)), "block_size": (16, 64)}
    table = ConfigWinnerTable(Path(tempfile.mkdtemp()) / "winners.sqlite")
    out = {"model": MODEL, "budget": args.budget, "repeats": args.repeats, "speedup": args.speedup, "space": {k: [describe({k: v}) for v in vs] for k, vs in space.items()},
           "mixes": {}, "machine": {"cpu_count": os.cpu_count(), "load_average_before": list(load_before)}}
    for name, mix, pool in (("long-trickle", trickle_mix, long_prompts), ("short-bursts", burst_mix, short)):
        save_mix(mix, Path(table.path).parent / f"{name}.jsonl")
        print(f"tuning {name}: {len(mix)} requests", flush=True)
        result = tune_config(MODEL, mix, loaded=loaded, speedup=args.speedup, budget=args.budget, confirm=1, space=space, repeats=args.repeats,
                             table=table, prompt_pool=pool, progress=lambda m: print("  ", m, flush=True))
        row = result.stored
        out["mixes"][name] = {"signature": row.signature, "fingerprint": row.fingerprint, "num_requests": row.num_requests,
                              "winner": row.config, "winner_label": describe(from_json(row.config)),
                              "default_tokens_per_s": row.default_tokens_per_s, "default_ttft_p99_s": row.default_ttft_p99_s,
                              "tuned_tokens_per_s": row.tokens_per_s, "tuned_ttft_p99_s": row.ttft_p99_s, "speedup": row.speedup,
                              "tune_s": result.tune_s,
                              "trials": [{"candidate": describe(c), **m.summary} for c, m in result.outcome.trials]}
    out["machine"]["load_average_after"] = list(os.getloadavg())

    print(f"\n{'mix':<14} {'default tok/s':>13} {'p99 TTFT s':>10} {'tuned tok/s':>11} {'p99 TTFT s':>10} {'speedup':>7}  winner")
    for name, m in out["mixes"].items():
        print(f"{name:<14} {m['default_tokens_per_s']:>13.1f} {m['default_ttft_p99_s']:>10.3f} {m['tuned_tokens_per_s']:>11.1f} "
              f"{m['tuned_ttft_p99_s']:>10.3f} {m['speedup']:>6.2f}x  {m['winner_label']}  [{m['signature']}]")
    print(f"load average before {load_before[0]:.2f}, after {out['machine']['load_average_after'][0]:.2f} "
          f"({os.cpu_count()} CPUs, shared machine)")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
