"""Speculative decoding: decode speed with speculation off, a fixed k and adaptive, in one run.

Workloads (prompts from the shared data folder, `benchmarks.link_bench.workloads`):
- concurrency 1, repetitive: HumanEval code edits that repeat their input and MT-Bench writing /
  extraction quote-summaries; each prompt runs once per configuration, the configurations taking
  turns prompt by prompt so a noisy neighbour on the CPU hits them alike.
- bursts: B requests submitted together (B from --bursts, default prompts of AlpacaEval / MT-Bench),
  run to completion; throughput = output tokens / burst wall time. Each burst runs --repeats times per
  configuration, the configurations in a rotated order each round; the table gives each one's median
  and the median over rounds of adaptive / off within a round (paired: one burst of a few seconds moves
  by +-30% across rounds on a shared 2-core machine, more than the 5% the mixed-load target resolves).

Greedy decoding, so every configuration emits the same tokens (checked) and does the same useful work.
Decode tokens/s counts a request's tokens after its first over the time from its first token to its
last (prefill excluded). Acceptance rate = accepted / drafted tokens; mean draft length = drafted tokens
per verification step; speedup = decode tokens/s over the "off" row's.

With `--winners FILE` (a `link compile tune` table) every configuration runs with that table's kernel
winners installed, as a tuned server does (they are process-wide, so off and adaptive share them):
speculation on a tuned engine, where a verify step's k + 1 rows per sequence take the tuned linears.

Run from the repository root (a few minutes on a 2-core CPU at the defaults):

    python benchmarks/bench_spec_decode.py [--num-prompts 6] [--max-tokens 96] [--bursts 1 4 16] [--repeats 3] [--winners FILE] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as a script from a checkout: `benchmarks` is a package of the repository

from benchmarks.link_bench.workload import load_workload  # noqa: E402
from benchmarks.link_bench.workloads import load_repetitive  # noqa: E402
from serving import LLM  # noqa: E402
from serving.engine.llm_engine import EngineConfig, LLMEngine  # noqa: E402
from serving.sampling.params import SamplingParams  # noqa: E402
from serving.spec_decode import SpeculativeConfig  # noqa: E402


@dataclass
class Tally:
    """One configuration's totals over a workload."""

    decode_tokens: int = 0
    decode_seconds: float = 0.0
    drafted: int = 0
    accepted: int = 0
    draft_steps: int = 0
    wall_seconds: float = 0.0
    output_tokens: int = 0
    outputs: list[list[int]] = field(default_factory=list)

    @property
    def decode_tps(self) -> float:
        return self.decode_tokens / self.decode_seconds if self.decode_seconds else 0.0

    @property
    def throughput(self) -> float:
        return self.output_tokens / self.wall_seconds if self.wall_seconds else 0.0


def configs(k: int, disable_by_batch_size: int, step_cost: bool = True) -> dict[str, SpeculativeConfig | None]:
    return {"off": None,
            f"fixed k={k}": SpeculativeConfig(num_speculative_tokens=k, adaptive=False, disable_by_batch_size=disable_by_batch_size),
            "adaptive": SpeculativeConfig(num_speculative_tokens=k, disable_by_batch_size=disable_by_batch_size,
                                          step_cost=step_cost)}


def run_batch(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams, tally: Tally) -> None:
    """Submit `prompts` together, step to completion, add to `tally`."""
    start = time.perf_counter()
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{time.monotonic_ns()}-{i}", prompt, params)
    finals = []
    while engine.has_unfinished_requests:
        finals += [o for o in engine.step() if o.finished]
    tally.wall_seconds += time.perf_counter() - start
    for out in sorted(finals, key=lambda o: int(o.request_id.rsplit("-", 1)[1])):
        tokens = out.outputs[0].token_ids
        tally.outputs.append(tokens)
        tally.output_tokens += len(tokens)
        if len(tokens) > 1 and "itl_seconds" in out.metrics:
            tally.decode_tokens += len(tokens) - 1
            tally.decode_seconds += out.metrics["itl_seconds"] * (len(tokens) - 1)
        if out.speculative is not None:
            tally.drafted += out.speculative.num_draft_tokens
            tally.accepted += out.speculative.num_accepted_tokens
            tally.draft_steps += out.speculative.num_draft_steps


def encode(llm: LLM, text: str) -> list[int]:
    return llm.loaded.tokenizer.encode(llm.loaded.chat_format.render([{"role": "user", "content": text}]), add_special_tokens=False)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--num-prompts", type=int, default=6, help="repetitive prompts at concurrency 1")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--k", type=int, default=5, help="k_max (and the fixed k)")
    parser.add_argument("--disable-by-batch-size", type=int, default=SpeculativeConfig.disable_by_batch_size,
                        help="SpeculativeConfig.disable_by_batch_size: no drafts from this many running sequences on")
    parser.add_argument("--bursts", type=int, nargs="*", default=[1, 4, 16], help="burst sizes; none to skip")
    parser.add_argument("--burst-max-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each burst per configuration (median kept)")
    parser.add_argument("--no-step-cost", action="store_true", help="adaptive without SpeculativeConfig.step_cost (on by default)")
    parser.add_argument("--data-dir", default=os.environ.get("LINK_DATASETS_DIR", "../shared/data"))
    parser.add_argument("--winners", type=Path, help="a `link compile tune` table whose winners every configuration runs with")
    parser.add_argument("--json", dest="json_path", help="also write the results here")
    args = parser.parse_args(argv)

    console = Console()
    if args.winners is not None:
        if not args.winners.is_file():
            parser.error(f"--winners {args.winners}: no such file (write one with `link compile tune`)")
        os.environ["LINK_COMPILE_DB"] = str(args.winners)
    llm = LLM(args.model, engine_config=EngineConfig(tuned_kernels=args.winners is not None))  # installs the winners
    specs = configs(args.k, args.disable_by_batch_size, not args.no_step_cost)
    engines = {name: LLMEngine(llm.loaded, EngineConfig(tuned_kernels=False, speculative=spec)) for name, spec in specs.items()}
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    for engine in engines.values():  # warm-up
        run_batch(engine, [encode(llm, "Say hello.")], SamplingParams(temperature=0, max_tokens=4), Tally())

    repetitive = [encode(llm, t) for t in load_repetitive(Path(args.data_dir))[: args.num_prompts]]
    c1 = {name: Tally() for name in engines}
    for prompt in repetitive:
        for name, engine in engines.items():
            run_batch(engine, [prompt], params, c1[name])
    table = Table(title=f"{args.model}, concurrency 1, repetitive workload ({len(repetitive)} prompts, greedy, <= {args.max_tokens} tokens)")
    for col in ("config", "decode tok/s", "speedup", "acceptance", "mean draft len", "same tokens"):
        table.add_column(col, justify="right")
    base = c1["off"]
    result = {"concurrency_1": {}, "bursts": {}, "winners": None if args.winners is None else str(args.winners)}
    for name, t in c1.items():
        rate = t.accepted / t.drafted if t.drafted else None
        mean = t.drafted / t.draft_steps if t.draft_steps else None
        table.add_row(name, f"{t.decode_tps:.2f}", f"{t.decode_tps / base.decode_tps:.2f}x",
                      "-" if rate is None else f"{rate:.2f}", "-" if mean is None else f"{mean:.2f}", str(t.outputs == base.outputs))
        result["concurrency_1"][name] = {"decode_tps": t.decode_tps, "speedup": t.decode_tps / base.decode_tps,
                                         "acceptance_rate": rate, "mean_draft_length": mean, "same_tokens": t.outputs == base.outputs}
    console.print(table)

    if args.bursts:
        default = [encode(llm, t) for t in load_workload(Path(args.data_dir))]
        bparams = SamplingParams(temperature=0, max_tokens=args.burst_max_tokens)
        btable = Table(title=f"bursts of concurrent requests (default prompts, greedy, <= {args.burst_max_tokens} tokens): "
                             f"output tok/s, median of {args.repeats}")
        btable.add_column("burst size", justify="right")
        for name in engines:
            btable.add_column(name, justify="right")
        btable.add_column("adaptive vs off (paired)", justify="right")
        offset = 0
        for size in args.bursts:
            prompts = (default * (1 + (offset + size) // len(default)))[offset : offset + size]
            offset += size
            runs: dict[str, list[float]] = {name: [] for name in engines}
            names = list(engines)
            for r in range(args.repeats):
                for name in names[r % len(names):] + names[: r % len(names)]:
                    tally = Tally()
                    run_batch(engines[name], prompts, bparams, tally)
                    runs[name].append(tally.throughput)
            medians = {name: statistics.median(v) for name, v in runs.items()}
            # paired: each round's adaptive over the same round's off, then the median (a drift of the
            # machine's speed across rounds cancels within a round)
            ratio = statistics.median(a / o for a, o in zip(runs["adaptive"], runs["off"]))
            btable.add_row(str(size), *(f"{m:.2f}" for m in medians.values()), f"{ratio:.2f}x")
            result["bursts"][size] = medians | {"adaptive_vs_off": ratio, "runs": runs}
        console.print(btable)
        ratios = [r["adaptive_vs_off"] for r in result["bursts"].values()]
        result["bursts_geomean_adaptive_vs_off"] = statistics.geometric_mean(ratios)
        console.print(f"adaptive vs off over the bursts: geometric mean {result['bursts_geomean_adaptive_vs_off']:.3f}x, "
                      f"worst {min(ratios):.3f}x")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
