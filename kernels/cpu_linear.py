"""Float linear layers for a few rows: the "linear" and "gated_mlp" candidates of the "cpu" provider.

    y = kn_linear(x, weight)          # x [..., K], weight [N, K] -> [..., N], on a cached [K, N] copy
    y = few_rows_linear(x, weight)    # our AVX-512 kernel from 4 rows on (`kernels/native/rows_linear.cpp`)

Parity against the references: `tests/kernels/test_cpu.py`. Timing: `benchmarks/bench_linear_rows.py`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from kernels.native import load_rows_linear, unavailable_reason
from kernels.packs import PackCache
from kernels.ref import ref_gated_activation
from kernels.variants import Variant

# `F.linear(x, W)` with W [N, K] (the layout of every checkpoint) runs MKL's sgemm on W transposed. For
# 1-3 rows that is a matrix-vector product at memory speed; from 4 rows on (a decode batch of 4-16, a
# speculative verify step of k + 1 rows per sequence) it becomes a GEMM that repacks W on every call and
# costs about twice as much as the same product on a [K, N] copy of W. Measured on SmolLM2-135M's layer
# shapes (qkv 960x576, o 576x576, gate/up 3072x576, down 576x1536), float32, two threads: one layer's four
# linears 605 / 901 / 1476 us at 4 / 8 / 16 rows with F.linear against 320 / 449 / 647 us on the [K, N]
# copy, and 276 against 243 us at one row. MKL's packed GEMM (the weight packed once for sgemm_compute,
# what Inductor's CPU freezing uses) does as well or better on the wider matrices. Both keep the packed
# copy beside the float weight (a `PackCache` per variant: one more copy of each weight they serve).
# Those timings are on a weight the cache holds. Inside a decode step every layer's weights stream from
# memory, and there both copies gain little (`benchmarks/bench_linear_rows.py`, the four linears of 30
# layers, 425 MB: 32.7 ms at 4 rows on the [K, N] copy against 35.9 ms with F.linear, 19.2 ms at one
# row); `rows_linear`, our AVX-512 kernel, reads each weight row once for all rows and takes 26.8 ms.
# The tuner times these ops on streamed weights (`kernels.tuner`, `stream_bytes`).


def _transposed(weight: torch.Tensor) -> torch.Tensor:
    return weight.detach().t().contiguous()


MKL_PACK_ROWS = 16  # only steers MKL's packing heuristics: the packed weight serves any row count


def _mkl_packed(weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkl._mkl_reorder_linear_weight(weight.detach(), MKL_PACK_ROWS)


KN_PACKS = PackCache(_transposed)
MKL_PACKS = PackCache(_mkl_packed)


def kn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The "linear" contract (`ref.ref_linear`: x [..., K], weight [N, K] -> [..., N]) as x @ W^T with W^T
    a cached contiguous [K, N] copy (same products, another summation order)."""
    out = torch.matmul(x, KN_PACKS.get(weight))
    return out if bias is None else out + bias


def mkl_packed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The "linear" contract through MKL's packed sgemm, the weight packed once (float32 only).

    Raises:
        TypeError: x or weight not float32 (MKL's packed GEMM is single precision).
    """
    if x.dtype != torch.float32 or weight.dtype != torch.float32:
        raise TypeError(f"MKL packed linear is float32 only, got x {x.dtype} and weight {weight.dtype}")
    matrix = x.reshape(-1, x.shape[-1])
    out = torch.ops.mkl._mkl_linear(matrix, MKL_PACKS.get(weight), weight, bias, MKL_PACK_ROWS)
    return out.reshape(*x.shape[:-1], weight.shape[0])


def kn_gated_mlp(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, activation: str) -> torch.Tensor:
    """The "gated_mlp" contract (`ref.ref_gated_mlp`: x [T, E], gate_up [2F, E], down [E, F] -> [T, E]) with
    both projections as `kn_linear`."""
    return kn_linear(ref_gated_activation(kn_linear(x, gate_up), activation), down)


def mkl_packed_gated_mlp(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, activation: str) -> torch.Tensor:
    """The "gated_mlp" contract with both projections as `mkl_packed_linear` (float32 only; TypeError else)."""
    return mkl_packed_linear(ref_gated_activation(mkl_packed_linear(x, gate_up), activation), down)


def rows_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The "linear" contract (x [..., K], weight [N, K] -> [..., N]) through our AVX-512 kernel for a few rows
    (`kernels/native/rows_linear.cpp`): each weight row is read once per call and meets every input row in
    registers, so 4-16 rows cost less than F.linear's GEMM (SmolLM2's layer linears, weights streamed from
    memory, 2 threads: 26.8 / 31.9 / 38.5 ms against F.linear's 35.9 / 41.7 / 47.5 ms per step at 4 / 8 / 16
    rows). A row's result does not depend on the other rows of the call (bit for bit).

    Raises:
        TypeError: x or weight not float32.
        RuntimeError: the kernel cannot run on this machine (`kernels.native.unavailable_reason`).
    """
    if x.dtype != torch.float32 or weight.dtype != torch.float32:
        raise TypeError(f"rows_linear is float32 only, got x {x.dtype} and weight {weight.dtype}")
    module = load_rows_linear()
    if module is None:
        raise RuntimeError(f"rows_linear is unavailable here: {unavailable_reason()}")
    out = module.rows_linear(x.reshape(math.prod(x.shape[:-1]), x.shape[-1]), weight).reshape(*x.shape[:-1], weight.shape[0])
    return out if bias is None else out + bias


def rows_gated_mlp(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, activation: str) -> torch.Tensor:
    """The "gated_mlp" contract with both projections as `rows_linear` (float32 only; TypeError else)."""
    return rows_linear(ref_gated_activation(rows_linear(x, gate_up), activation), down)


ROWS_FROM = 4  # the row count from which `rows_linear` beats F.linear on streamed weights (bench_linear_rows.py)


def few_rows_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The tuner candidate "rows-avx512": `rows_linear` from `ROWS_FROM` rows on, `F.linear` below. A shape
    bucket spans several row counts (bucket 4: 3 and 4 rows), and at 1-3 rows MKL's matrix-vector path is as
    fast or faster (streamed: 24.6 against 28.4 ms per step at 3 rows, 35.9 against 26.8 at 4). Where the
    kernel cannot be built (a stored winner on a machine without a compiler), every call is F.linear.
    Unlike `rows_linear`, a row's result depends on whether its call has 4 rows or fewer.
    Raises TypeError from `ROWS_FROM` rows for inputs that are not float32."""
    if math.prod(x.shape[:-1]) < ROWS_FROM or load_rows_linear() is None:  # a table stored where it built
        return F.linear(x, weight, bias)
    return rows_linear(x, weight, bias)


def few_rows_gated_mlp(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, activation: str) -> torch.Tensor:
    """The "gated_mlp" contract with both projections as `few_rows_linear`."""
    return few_rows_linear(ref_gated_activation(few_rows_linear(x, gate_up), activation), down)


def has_rows_linear() -> bool:
    """Whether our AVX-512 `rows_linear` kernel runs here (built on first call)."""
    return load_rows_linear() is not None


def has_mkl() -> bool:
    """Whether this PyTorch has MKL's packed sgemm (`torch.ops.mkl._mkl_linear`)."""
    return torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear")


def linear_variants() -> list[Variant]:
    """The float "linear" and "gated_mlp" variants the tuner may pick per bucket (not registered; the "cpu"
    provider of `kernels.candidates` gathers them)."""
    return [Variant("linear", "kn", kn_linear,
                    description="x @ W^T on a cached [K, N] copy of the weight (no per-call repacking from 4 rows on)"),
            Variant("linear", "mkl-packed", mkl_packed_linear, dtypes=(torch.float32,), available=has_mkl,
                    description="MKL's packed sgemm, the weight packed once (float32)"),
            Variant("linear", "rows-avx512", few_rows_linear, dtypes=(torch.float32,), available=has_rows_linear,
                    description="from 4 rows, our AVX-512 kernel: each weight row read once per call for all rows (float32)"),
            Variant("gated_mlp", "kn", kn_gated_mlp,
                    description="both projections on cached [K, N] copies of their weights"),
            Variant("gated_mlp", "mkl-packed", mkl_packed_gated_mlp, dtypes=(torch.float32,), available=has_mkl,
                    description="both projections through MKL's packed sgemm (float32)"),
            Variant("gated_mlp", "rows-avx512", few_rows_gated_mlp, dtypes=(torch.float32,), available=has_rows_linear,
                    description="both projections through our AVX-512 kernel from 4 rows, F.linear below (float32)")]
