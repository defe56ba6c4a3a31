"""Serving benchmark: our engine's OpenAI server against `transformers` and llama.cpp on real prompts.

A thin script over `benchmarks.link_bench.run_serving_benchmark` (the same as `link bench serving`); the module
docstring of `benchmarks/link_bench/serving.py` says what each system runs and what each number measures.

Run from the repository root (about 10-20 minutes on a 2-core CPU for the defaults):

    python benchmarks/bench_serving.py [--model smollm2-135m-instruct] [--concurrency 1 4 16] [--num-prompts 32]
        [--max-tokens 64] [--systems link transformers llama-cpp] [--data-dir ../shared/data] [--json out.json]
        [--prefill-tokens 512] [--prefill-prompts 8] [--fresh] [--warmup-s 180]

llama-cpp runs only when `llama_cpp` imports (`make install-bench`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from rich.console import Console

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as a script from a checkout, without installing the package

from benchmarks.link_bench import SYSTEMS, render_report, run_serving_benchmark, show_and_save  # noqa: E402


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16], help="(default: %(default)s)")
    parser.add_argument("--num-prompts", type=int, default=32, help="requests per level (default: %(default)s)")
    parser.add_argument("--max-tokens", type=int, default=64, help="output tokens per request (default: %(default)s)")
    parser.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-dir", type=Path, help="default: $LINK_DATASETS_DIR or ../shared/data")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--kv-cache-mb", type=int, default=256)
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--prefill-tokens", type=int, default=512, help="prefill-phase prompt tokens, 0: none (default: %(default)s)")
    parser.add_argument("--prefill-prompts", type=int, default=8, help="prefill-phase requests (default: %(default)s)")
    parser.add_argument("--fresh", action="store_true", help="run the link server with an empty temporary LINK_HOME")
    parser.add_argument("--warmup-s", type=float, help="seconds of warm-up traffic to link (default: 180 with --fresh, else 0)")
    parser.add_argument("--json", type=Path, help="also write the full results (every request) to this JSON file")
    args = parser.parse_args(argv)
    log = Console(stderr=True)
    result = run_serving_benchmark(args.model, args.concurrency, args.num_prompts, args.max_tokens, args.systems, args.seed,
                                   args.data_dir, args.dtype, args.kv_cache_mb, args.max_num_seqs,
                                   progress=lambda message: log.log(message, markup=False), prefill_tokens=args.prefill_tokens,
                                   num_prefill_prompts=args.prefill_prompts, fresh=args.fresh, warmup_s=args.warmup_s)
    show_and_save(render_report(result), result, args.json)
    return result


if __name__ == "__main__":
    main()
