"""RMSNorm (Zhang & Sennrich 2019, arXiv:1910.07467) with an optional fused residual add, in Triton.

One program normalizes one row of E values held in registers: it adds the residual (rounded to the
input dtype, as the unfused model rounds it), writes the new residual, and scales by the inverse root
mean square computed in float32. The references are `kernels.ref.ref_rms_norm` and `ref_add_rms_norm`;
parity tests: tests/kernels/test_triton_rms_norm.py; timing: benchmarks/gpu_kernels.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton.common import check_devices, check_tensor, next_power_of_2


@triton.jit
def _rms_norm_kernel(
    X, R, W, Y, RES_OUT,
    stride_x, stride_r, stride_y, stride_res,
    num_cols, eps, offset,
    HAS_RESIDUAL: tl.constexpr, HAS_OFFSET: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < num_cols
    # Everything is computed in float32: the interpreter's bfloat16 arithmetic is wrong, and the
    # reference takes its statistics in float32 too.
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(R + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
        total = (x + r).to(X.dtype.element_ty)  # the residual stream lives in the input dtype
        tl.store(RES_OUT + row * stride_res + cols, total, mask=mask)
        x = total.to(tl.float32)
    rstd = tl.math.rsqrt(tl.sum(x * x, axis=0) / num_cols + eps)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_OFFSET:  # Gemma: (offset + w) applied in float32
        y = x * rstd * (offset + w)
    else:  # Llama: the normalized row is rounded to the input dtype before the weight multiplies it
        y = (x * rstd).to(X.dtype.element_ty).to(tl.float32) * w
    tl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)


def _launch(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float, offset: float):
    """Check inputs, run the kernel over the rows of x [..., E]; returns (normed, new residual or None)."""
    check_tensor("x", x, dim=x.dim())
    check_tensor("weight", weight, dim=1)
    num_cols = x.shape[-1]
    if weight.shape[0] != num_cols:
        raise ValueError(f"weight has {weight.shape[0]} entries for rows of {num_cols}")
    if residual is not None:
        if residual.shape != x.shape or residual.dtype != x.dtype:
            raise ValueError(f"residual {tuple(residual.shape)} {residual.dtype} must match x {tuple(x.shape)} {x.dtype}")
        check_tensor("residual", residual, dim=x.dim())
    check_devices(x=x, weight=weight, **({"residual": residual} if residual is not None else {}))
    rows = x.reshape(-1, num_cols)  # a view whenever the leading dimensions allow one
    res_rows = residual.reshape(-1, num_cols) if residual is not None else rows
    # The output dtype follows the reference: weight * x promotes for Llama; Gemma's result keeps x's dtype.
    out_dtype = x.dtype if offset else torch.promote_types(x.dtype, weight.dtype)
    out = torch.empty(rows.shape, dtype=out_dtype, device=x.device)
    res_out = torch.empty_like(rows) if residual is not None else out
    block = next_power_of_2(num_cols)
    num_warps = 4 if block <= 2048 else 8 if block <= 8192 else 16
    if rows.shape[0]:
        _rms_norm_kernel[(rows.shape[0],)](
            rows, res_rows, weight, out, res_out,
            rows.stride(0), res_rows.stride(0), out.stride(0), res_out.stride(0),
            num_cols, eps, offset,
            HAS_RESIDUAL=residual is not None, HAS_OFFSET=bool(offset), BLOCK=block, num_warps=num_warps,
        )
    new_residual = res_out.view(x.shape) if residual is not None else None
    return out.view(x.shape), new_residual


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, *, offset: float = 0.0) -> torch.Tensor:
    """RMSNorm of x [..., E] with weight [E]: the contract of `kernels.ref.ref_rms_norm` (dispatch op "rms_norm").

    Args:
        x: [..., E] float32/bfloat16/float16 on CUDA (CPU under TRITON_INTERPRET=1), last dimension contiguous.
        weight: [E]; eps: added to the mean square; offset: 0 (Llama) or 1 (Gemma's 1 + weight).
    Returns:
        [..., E]; x's dtype (promoted with weight's for offset 0, as the reference does).
    Raises:
        ValueError: mismatched shapes, an unsupported dtype, a strided last dimension, or tensors on
            different or unsupported devices.
    """
    return _launch(x, None, weight, eps, offset)[0]


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, *, offset: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused residual add and RMSNorm: the contract of `kernels.ref.ref_add_rms_norm`.

    Args:
        x: [..., E] sublayer output; residual: [..., E] same dtype; weight, eps, offset as in `rms_norm`.
    Returns:
        (normed, new_residual), each [..., E]: rms_norm(x + residual) and x + residual (rounded to x's dtype).
    Raises:
        ValueError: as `rms_norm`, and when residual's shape or dtype differs from x's.
    """
    return _launch(x, residual, weight, eps, offset)
