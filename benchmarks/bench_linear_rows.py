"""Float32 linears for a few rows with the weights streamed from memory, as inside a decode step.

For SmolLM2-135M's four layer shapes (qkv 576->960, o 576->576, gate_up 576->3072, down 1536->576) the
benchmark keeps `--layers` distinct random copies of each weight (30: the model's 425 MB, more than this
machine's caches hold for one process) and times one pass over all of them, each linear once, per
implementation and row count: `F.linear` (the default), the cached [K, N] copy (`kn`), MKL's packed sgemm
(`mkl-packed`) and our AVX-512 kernel (`rows-avx512`, `kernels/native/rows_linear.cpp`). Best of
`--repeats` passes, in ms per pass (= the layer linears of one decode step), with the speedup over F.linear.
`--layers 1` times one cache-resident weight set instead: the condition under which the tuner used to
time, where the [K, N] copy looks 2x faster than it is inside a step.

Run from the repository root (about a minute on a 2-core CPU):

    python benchmarks/bench_linear_rows.py [--rows 1 2 3 4 8 16] [--layers 30] [--repeats 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]   # [N, K] of SmolLM2-135M's layer linears


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 3, 4, 8, 16])
    parser.add_argument("--layers", type=int, default=30, help="distinct copies of each weight (30: a whole step)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args()

    import torch
    import torch.nn.functional as F
    from rich.console import Console
    from rich.table import Table

    from kernels import cpu_linear
    from kernels.native import load_rows_linear, unavailable_reason

    variants = {"F.linear": F.linear, "kn": cpu_linear.kn_linear}
    if cpu_linear.has_mkl():
        variants["mkl-packed"] = cpu_linear.mkl_packed_linear
    if load_rows_linear() is not None:
        variants["rows-avx512"] = cpu_linear.rows_linear
    else:
        print(f"rows-avx512 skipped: {unavailable_reason()}")
    gen = torch.Generator().manual_seed(0)
    weights = [[torch.randn(n, k, generator=gen) * k**-0.5 for n, k in SHAPES] for _ in range(args.layers)]
    megabytes = sum(w.numel() * 4 for layer in weights for w in layer) / 1e6

    def time_pass(fn, rows: int) -> float:
        xs = {k: torch.randn(rows, k, generator=gen) for _, k in SHAPES}
        for layer in weights:   # warm-up: packs the copies a variant caches
            for w in layer:
                fn(xs[w.shape[1]], w)
        best = float("inf")
        for _ in range(args.repeats):
            start = time.perf_counter()
            for layer in weights:
                for w in layer:
                    fn(xs[w.shape[1]], w)
            best = min(best, time.perf_counter() - start)
        return best * 1e3

    result = {"layers": args.layers, "weight_megabytes": megabytes, "threads": torch.get_num_threads(), "ms": {}}
    table = Table(title=f"layer linears of {args.layers} layers ({megabytes:.0f} MB of float32 weights), ms per pass, "
                        f"best of {args.repeats}, {torch.get_num_threads()} threads")
    table.add_column("rows", justify="right")
    for name in variants:
        table.add_column(name, justify="right")
    with torch.inference_mode():
        for rows in args.rows:
            times = {name: time_pass(fn, rows) for name, fn in variants.items()}
            result["ms"][rows] = times
            base = times["F.linear"]
            table.add_row(str(rows), *(f"{t:.1f}" + ("" if name == "F.linear" else f" ({base / t:.2f}x)") for name, t in times.items()))
    Console().print(table)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
