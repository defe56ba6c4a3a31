"""Decode throughput of a local model before and after `link compile tune`, in one run.

    python benchmarks/bench_compile.py [--model smollm2-135m-instruct] [--budget-s 600] [--json out.json]
    python benchmarks/bench_compile.py --quantized --llama-cpp     # lossy winners too; llama.cpp at c=1

1. before: `link bench serving`'s link system (`link engine serve` subprocess, closed-loop streaming
   clients, greedy, EOS ignored) at concurrency 1 (`--prompts-c1` requests) and 16 (`--prompts-c16`),
   with an empty winner table (LINK_COMPILE_DB points at a file that does not exist): the engine as
   it runs untuned;
2. tune: `benchmarks.kernel_tuning.tune_model` on the serving workload into a fresh table (a temp file); with
   `--quantized`, lossy variants too (`link compile tune --quantized`: W8A16/W4A16 matmuls and the
   W4A16 decode step, each within its stated tolerance);
3. after: the same two levels, the servers installing that table's winners at start;
4. greedy outputs: the same prompts generated in-process before and after installing the winners,
   token ids compared (equal, and the share of tokens equal up to each sequence's first difference), and
   the graphs Dynamo compiled during that generation counted (0 expected: the winners are compiled when
   installed, `kernels.warmup`);
5. with `--llama-cpp`: llama-cpp-python on the same GGUF file at concurrency 1 (`link bench serving`'s
   llama-cpp worker, same prompts and token counts), and against it the tuned engine measured the same
   way (`link-engine`: in-process, one request at a time, no HTTP) as well as through its server.
Prints decode tokens/s per request and output tokens/s per level, the ratios, the winners and the
load average before and after (the machine may be shared: the numbers are only as quiet as it is).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def serve_levels(model: str, db: Path, prompts_c1: int, prompts_c16: int, max_tokens: int,
                 system: str = "link") -> dict[int, dict]:
    from benchmarks.link_bench import run_serving_benchmark

    os.environ["LINK_COMPILE_DB"] = str(db)
    out = {}
    levels = ((1, prompts_c1),) if system in ("llama-cpp", "link-engine") else ((1, prompts_c1), (16, prompts_c16))
    for concurrency, num_prompts in levels:
        result = run_serving_benchmark(model, [concurrency], num_prompts, max_tokens, [system],
                                       progress=lambda message: print("  ", message, flush=True))
        if result["errors"]:
            raise RuntimeError(f"serving benchmark failed: {result['errors']}")
        row = result["rows"][0]
        out[concurrency] = {k: row[k] for k in row if k != "requests"}
        print(f"  c={concurrency}: {_fmt(out[concurrency])}", flush=True)
    return out


def _fmt(row: dict) -> str:
    keys = [k for k in row if "tokens_per_s" in k]
    return ", ".join(f"{k} {row[k]:.2f}" for k in keys if isinstance(row[k], (int, float)))


def greedy_outputs(model: str, db: Path | None, prompts: list[list[int]], max_tokens: int) -> tuple[list[list[int]], int]:
    """The greedy token ids of `prompts` (winners of `db` installed, or none) and the number of graphs
    Dynamo compiled during the generation: 0 when every winner was warmed up at engine start."""
    from torch._dynamo.utils import counters

    import kernels
    from serving import LLM, SamplingParams
    from serving.engine.llm_engine import EngineConfig

    kernels.reset()
    if db is not None:
        os.environ["LINK_COMPILE_DB"] = str(db)
    llm = LLM(model, weights="float", engine_config=EngineConfig(tuned_kernels=db is not None))
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    graphs = counters["stats"]["unique_graphs"]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    compiled_in_steps = counters["stats"]["unique_graphs"] - graphs
    kernels.reset()
    return [o.outputs[0].token_ids for o in outs], compiled_in_steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--budget-s", type=float, default=600)
    parser.add_argument("--prompts-c1", type=int, default=4)
    parser.add_argument("--prompts-c16", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--quantized", action="store_true", help="also tune lossy (weight-only quantized) variants")
    parser.add_argument("--llama-cpp", action="store_true", help="also run llama-cpp-python at concurrency 1")
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args()
    from kernels.winners import WinnerTable
    from benchmarks.link_bench.workload import default_data_dir, load_workload, render_prompts
    from benchmarks.kernel_tuning import tune_model

    work = Path(tempfile.mkdtemp(prefix="bench-compile-"))
    empty, tuned = work / "none.sqlite", work / "winners.sqlite"
    report = {"model": args.model, "load_before": os.getloadavg(), "cpus": os.cpu_count(), "settings": vars(args)}
    print(f"load average before: {report['load_before']}", flush=True)
    print("before tuning:", flush=True)
    report["before"] = serve_levels(args.model, empty, args.prompts_c1, args.prompts_c16, args.max_tokens)
    start = time.monotonic()
    outcome = tune_model(args.model, "serving", args.budget_s, table=WinnerTable(tuned), allow_lossy=args.quantized,
                         progress=lambda message, done, total: print(f"  tune [{done}/{total}] {message}", flush=True))
    report["tune_s"] = time.monotonic() - start
    report["winners"] = [{"op": r.bucket.op, "bucket": r.bucket.label, "variant": r.variant, "speedup": r.speedup}
                         for r in outcome.winners]
    print(f"tuned in {report['tune_s']:.0f} s; winners: {report['winners']}", flush=True)
    print("after tuning:", flush=True)
    report["after"] = serve_levels(args.model, tuned, args.prompts_c1, args.prompts_c16, args.max_tokens)
    _, prompts = render_prompts(args.model, load_workload(default_data_dir())[:4])
    before, _ = greedy_outputs(args.model, None, prompts, args.max_tokens)
    after, report["graphs_compiled_in_steps"] = greedy_outputs(args.model, tuned, prompts, args.max_tokens)
    report["greedy_equal"] = [a == b for a, b in zip(before, after)]
    shared = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b))) for a, b in zip(before, after)]
    report["greedy_agreement"] = sum(shared) / sum(map(len, before))  # tokens before each output's first difference
    if args.llama_cpp:
        print("llama-cpp-python, same GGUF file:", flush=True)
        report["llama_cpp"] = serve_levels(args.model, empty, args.prompts_c1, 0, args.max_tokens, system="llama-cpp")
        print("our engine measured as llama.cpp is (in-process, one request at a time), tuned:", flush=True)
        report["engine_inprocess"] = serve_levels(args.model, tuned, args.prompts_c1, 0, args.max_tokens, system="link-engine")
    report["load_after"] = os.getloadavg()
    for c in (1, 16):
        b, a = report["before"][c], report["after"][c]
        ratios = {k: a[k] / b[k] for k in b if isinstance(b[k], (int, float)) and b[k] and ("tokens_per_s" in k)}
        report.setdefault("ratios", {})[c] = ratios
        print(f"c={c}: " + ", ".join(f"{k} {b[k]:.2f} -> {a[k]:.2f} ({r:.2f}x)" for k, r in ratios.items()))
    print(f"greedy outputs equal (4 prompts x {args.max_tokens} tokens): {report['greedy_equal']}; "
          f"tokens before the first difference: {report['greedy_agreement']:.1%}")
    if "llama_cpp" in report:
        key = "decode_tokens_per_s"
        ours, theirs = report["after"][1].get(key), report["llama_cpp"][1].get(key)
        engine = report["engine_inprocess"][1].get(key)
        if ours and theirs:
            report["c1_decode_vs_llama_cpp"] = ours / theirs
            print(f"c=1 decode, tuned server (HTTP, client on the same cores) / llama-cpp-python: {ours:.2f} / {theirs:.2f} = {ours / theirs:.2f}x")
        if engine and theirs:
            report["c1_engine_decode_vs_llama_cpp"] = engine / theirs
            print(f"c=1 decode, tuned engine in-process / llama-cpp-python in-process: {engine:.2f} / {theirs:.2f} = {engine / theirs:.2f}x")
    print(f"graphs compiled inside engine steps with the winners installed (0: all warmed up): {report['graphs_compiled_in_steps']}")
    print(f"load average after: {report['load_after']}")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(report, indent=2, default=str))


if __name__ == "__main__":
    main()
