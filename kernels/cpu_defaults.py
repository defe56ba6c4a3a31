"""Defaults chosen from the CPU's capability: what `dispatch` runs for a shape bucket with no tuned winner.

    chosen = install_cpu_defaults()            # {"linear": "rows-avx512", "gated_mlp": "rows-avx512"} or {}
    install_cpu_defaults(build=True)           # the same, building our C++ kernel first if need be (~1 min)

The table, for "linear" and "gated_mlp" with float32 activations and plain tensor weights (every other call,
bfloat16 and packed GGUF weights included, keeps the PyTorch reference, `F.linear`):

| CPU                                    | 1-3 rows (decode) | 4-16 rows (batched decode, verify) | 17+ rows (prefill) |
| -------------------------------------- | ----------------- | ---------------------------------- | ------------------ |
| AVX-512 and `rows_linear.cpp` built    | F.linear          | rows-avx512                        | F.linear           |
| otherwise                              | F.linear          | F.linear                           | F.linear           |

Why these: inside a decode step every layer's weights stream from memory, and there our AVX-512 kernel is the
one variant that wins clearly from 4 rows (SmolLM2-135M's layer linears, 2 threads: 26.8 / 31.9 / 38.5 ms per
step at 4 / 8 / 16 rows against F.linear's 35.9 / 41.7 / 47.5, `benchmarks/bench_linear_rows.py`), which is what
the tuner picks for those buckets. Below 4 rows MKL's matrix-vector path is as fast; above 16 MKL's GEMM is
built for prefill and our kernel was not measured there. The MKL-packed and [K, N] copies are not defaults
even where AVX-512 is missing: they keep a second copy of every weight (twice the memory) for about 1.10x on
streamed weights, so only a measured win (the tuner) installs them. The other ops' defaults are set in
`kernels.dispatch` (`kernels.cpu`); a whole-step variant (`decode_step`) is model-specific and checked on the
model's logits, so it is never a default: background tuning tries it first (`kernels.background`).

The defaults are staged (`dispatch.stage_default`) and take effect at the engine's next step. Without
`build`, the kernel is used only when it was already compiled here (a file check), so an engine never waits a
minute for g++ at start; the background tuner builds it at low priority and installs the defaults then.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from kernels.cpu_linear import ROWS_FROM, rows_linear
from kernels.dispatch import stage_default
from kernels.native import has_avx512, is_built, load_rows_linear
from kernels.ops import REFERENCES
from kernels.ref import ref_gated_activation

ROWS_UP_TO = 16  # the largest row count measured faster on our kernel (bench_linear_rows.py)


def uses_native(x: torch.Tensor, weight) -> bool:
    """The table's rule for one call: float32 plain tensors with ROWS_FROM..ROWS_UP_TO rows."""
    return (isinstance(weight, torch.Tensor) and x.dtype == torch.float32 and weight.dtype == torch.float32
            and ROWS_FROM <= math.prod(x.shape[:-1]) <= ROWS_UP_TO)


def native_linear_default(x: torch.Tensor, weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The "linear" contract (x [..., K], weight [N, K] -> [..., N]): `rows_linear` where the table says so,
    the reference elsewhere. Needs the kernel built (`install_cpu_defaults` checks)."""
    if uses_native(x, weight):
        return rows_linear(x, weight, bias)
    return REFERENCES["linear"](x, weight, bias)


def native_gated_mlp_default(x: torch.Tensor, gate_up, down, activation: str) -> torch.Tensor:
    """The "gated_mlp" contract (x [T, E], gate_up [2F, E], down [E, F] -> [T, E]), both projections as
    `native_linear_default`; packed weights go to the reference whole."""
    if not (isinstance(gate_up, torch.Tensor) and isinstance(down, torch.Tensor)):
        return REFERENCES["gated_mlp"](x, gate_up, down, activation)
    return native_linear_default(ref_gated_activation(native_linear_default(x, gate_up), activation), down)


def choose_defaults(build: bool = False) -> dict[str, tuple[str, Callable]]:
    """{op: (name, fn)} of the table's row for this CPU; {} where the static defaults stay.

    `build`: compile `rows_linear.cpp` when it is not compiled yet (about a minute on 2 cores).
    """
    if not has_avx512() or not (build or is_built("rows_linear")) or load_rows_linear() is None:
        return {}
    return {"linear": ("rows-avx512", native_linear_default), "gated_mlp": ("rows-avx512", native_gated_mlp_default)}


def install_cpu_defaults(build: bool = False) -> dict[str, str]:
    """Stage the table's defaults for this CPU (applied at the next `kernels.apply_pending`); returns {op: name}."""
    chosen = choose_defaults(build)
    for op, (name, fn) in chosen.items():
        stage_default(op, name, fn)
    return {op: name for op, (name, _) in chosen.items()}
