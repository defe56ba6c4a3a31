"""What a speculative verify step costs against a plain decode step, per running sequences and rows.

Bursts of B default prompts (AlpacaEval / MT-Bench, `benchmarks.link_bench.workload`) run to completion, greedy, on
two engines over the same loaded model: speculation off, and fixed-k n-gram speculation (not adaptive,
batch threshold above every B, so every sequence with an n-gram match drafts k tokens each step). Each
decode-only step (every scheduled sequence decoding; `Speculator.begin_step` / `end_step` on the
speculating engine) is timed and grouped by the sequences running as it started and, for steps with
drafts, the query rows it ran (sequences + drafted tokens). Prints the median ms per group: the cost
curve that the adaptive policy's step-cost rule (`serving/spec_decode/step_cost.py`) measures online.
With `--winners FILE` a `link compile tune` table's winners are installed first (a tuned engine).

Run from the repository root (about 2 minutes on a 2-core CPU):

    python benchmarks/bench_verify_cost.py [--bursts 1 2 3 4] [--k 5] [--rounds 3] [--winners FILE] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--bursts", type=int, nargs="+", default=[1, 2, 3, 4])
    parser.add_argument("--k", type=int, default=5, help="draft tokens per sequence with a match")
    parser.add_argument("--rounds", type=int, default=3, help="bursts per size and engine")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--data-dir", default=os.environ.get("LINK_DATASETS_DIR", "../shared/data"))
    parser.add_argument("--winners", type=Path, help="a `link compile tune` table to install first")
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args()
    if args.winners is not None:
        if not args.winners.is_file():
            parser.error(f"--winners {args.winners}: no such file (write one with `link compile tune`)")
        os.environ["LINK_COMPILE_DB"] = str(args.winners)

    from rich.console import Console
    from rich.table import Table

    from benchmarks.link_bench.workload import load_workload
    from serving import LLM
    from serving.engine.llm_engine import EngineConfig, LLMEngine
    from serving.sampling.params import SamplingParams
    from serving.spec_decode import SpeculativeConfig

    llm = LLM(args.model, engine_config=EngineConfig(tuned_kernels=args.winners is not None))
    tokenizer, chat = llm.loaded.tokenizer, llm.loaded.chat_format
    texts = load_workload(Path(args.data_dir))
    prompts = [tokenizer.encode(chat.render([{"role": "user", "content": t}]), add_special_tokens=False) for t in texts[:64]]
    spec = SpeculativeConfig(num_speculative_tokens=args.k, adaptive=False, disable_by_batch_size=max(args.bursts) + 1)
    off = LLMEngine(llm.loaded, EngineConfig(tuned_kernels=False))
    drafting = LLMEngine(llm.loaded, EngineConfig(tuned_kernels=False, speculative=spec))
    speculator = drafting.speculator
    steps: list[tuple[int, bool, int, float]] = []   # (running, has drafts, rows, seconds) of decode-only steps
    noted: dict = {}
    begin, end = speculator.begin_step, speculator.end_step

    def begin_step(scheduled):
        begin(scheduled)
        noted.update(rows=sum(n for _, n in scheduled), drafts=speculator._step_has_drafts, running=speculator._num_running)

    def end_step(seconds):
        if noted.get("drafts") is not None:
            steps.append((noted["running"], noted["drafts"], noted["rows"], seconds))
        end(seconds)

    speculator.begin_step, speculator.end_step = begin_step, end_step
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    plain: dict[int, list[float]] = {}
    offset = 0
    for size in args.bursts:
        for _ in range(args.rounds):
            burst = (prompts * (1 + (offset + size) // len(prompts)))[offset : offset + size]
            offset += size
            for engine in (off, drafting):
                for i, p in enumerate(burst):
                    engine.add_request(f"{time.monotonic_ns()}-{i}", p, params)
                while engine.has_unfinished_requests:
                    running = engine.scheduler.running
                    decode_only = not engine.scheduler.waiting and all(s.num_computed_tokens == s.num_tokens - 1 for s in running)
                    count = len(running)
                    start = time.perf_counter()
                    engine.step()
                    if engine is off and decode_only and count:
                        plain.setdefault(count, []).append(time.perf_counter() - start)
    groups: dict[tuple[int, int], list[float]] = {}
    for running, has_drafts, rows, seconds in steps:
        if has_drafts:
            groups.setdefault((running, rows), []).append(seconds)
    table = Table(title=f"{args.model}: decode-only step time (median ms), k={args.k}" + (" (tuned)" if args.winners else ""))
    for col in ("running", "plain step", "steps", "rows with drafts: median ms (steps) / x plain"):
        table.add_column(col, justify="right")
    out = {"plain_ms": {}, "drafted_ms": {}}
    for running in sorted(plain):
        base = statistics.median(plain[running])
        out["plain_ms"][running] = base * 1e3
        cells = []
        for (b, rows), values in sorted(groups.items()):
            if b == running and len(values) >= 2:
                m = statistics.median(values)
                out["drafted_ms"][f"{b}x{rows}"] = m * 1e3
                cells.append(f"{rows}: {m * 1e3:.1f} ({len(values)}) {m / base:.2f}x")
        table.add_row(str(running), f"{base * 1e3:.1f}", str(len(plain[running])), "; ".join(cells) or "-")
    Console().print(table)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
