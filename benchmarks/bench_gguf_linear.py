"""Matmuls on GGUF blocks (`kernels.gguf_weight`) against float32 `F.linear` on the same weights, decoded.

    python benchmarks/bench_gguf_linear.py [--model qwen2.5-coder-1.5b-instruct] [--rows 1 --rows 8] [--repeat 5]
                                           [--reference] [--json out.json]

For one decoder layer of the model's GGUF file (its fused q/k/v, o, gate/up and down, types as the file has them)
and its LM head: the median wall time of `GGUFWeight.linear` on the backend in use (the C++ module where it builds;
`--reference` also times the PyTorch reference, which decodes the weight on every call) and of float32
`F.linear` on the decoded weight, per row count, with the bytes each reads. At decode (1 row) a matmul reads its
whole weight once, so the packed one should win by about the bytes ratio (4-7x) once it is memory-bound.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels import gguf_ref  # noqa: E402
from kernels.gguf_weight import GGUFWeight, cat_weights, has_native  # noqa: E402
from serving.loader.gguf_loader import open_gguf  # noqa: E402
from serving.registry import default_registry  # noqa: E402

LAYER_PARTS = {"qkv": ("q_proj", "k_proj", "v_proj"), "o": ("o_proj",), "gate_up": ("gate_proj", "up_proj"),
               "down": ("down_proj",)}


def layer_weights(model: str) -> dict[str, GGUFWeight]:
    """Layer 0's projections (fused as the model fuses them) and the LM head of `model`'s file, packed."""
    found: dict[str, GGUFWeight] = {}
    for name, tensor in open_gguf(default_registry().get(model).resolve_path()).tensors(packed=True):
        short = name.removeprefix("model.")
        if short.startswith("layers.0.") and short.endswith(".weight"):
            found[short.split(".")[-2]] = tensor  # "q_proj", ...
        elif short in ("lm_head.weight", "embed_tokens.weight"):
            found[short] = tensor
    weights = {label: cat_weights([found[p] for p in parts]) for label, parts in LAYER_PARTS.items()}
    weights["lm_head"] = found.get("lm_head.weight", found["embed_tokens.weight"])
    return weights


def median_ms(fn, repeat: int) -> float:
    fn()  # warm up (a first call may build or page in)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--rows", type=int, action="append")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--reference", action="store_true", help="also time the PyTorch reference (slow)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    print(f"backend: {'C++ module' if has_native() else 'PyTorch reference (the C++ module did not load)'}; "
          f"threads {torch.get_num_threads()}")
    results = []
    for label, weight in layer_weights(args.model).items():
        dense = weight.dequantize()
        for rows in args.rows or [1, 8]:
            x = torch.randn(rows, weight.in_features)
            row = {"weight": label, "shape": list(weight.shape), "types": weight.ggml_types, "rows": rows,
                   "packed_mb": weight.nbytes / 1e6, "float_mb": dense.numel() * 4 / 1e6,
                   "packed_ms": median_ms(lambda: weight.linear(x), args.repeat),
                   "float_ms": median_ms(lambda: F.linear(x, dense), args.repeat)}
            if args.reference:
                blocks, types = [s.blocks for s in weight.segments], weight.ggml_types
                row["reference_ms"] = median_ms(lambda: gguf_ref.linear(x, blocks, types, weight.in_features), 1)
            results.append(row)
            print(f"{label:8s} {str(tuple(weight.shape)):14s} types {str(weight.ggml_types):9s} rows {rows:3d}  "
                  f"packed {row['packed_ms']:8.2f} ms ({row['packed_mb']:6.1f} MB)  float {row['float_ms']:8.2f} ms "
                  f"({row['float_mb']:6.1f} MB)" + (f"  reference {row['reference_ms']:8.1f} ms" if args.reference else ""))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
