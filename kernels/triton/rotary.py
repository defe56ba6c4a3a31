"""Rotary position embedding (RoFormer, Su et al. 2021, arXiv:2104.09864) in the half-split layout, in Triton.

Pair (i, i + D/2) of each head is rotated by its angle: out_i = x_i cos_i - x_{i+D/2} sin_i and
out_{i+D/2} = x_{i+D/2} cos_{i+D/2} + x_i sin_{i+D/2} ("rotate half", GPT-NeoX and Hugging Face Llama).
One program rotates a block of heads of one token; the token and head strides of x are free, so the
q/k views of a fused qkv projection are read in place. Reference: `kernels.ref.ref_rotary`; parity tests:
tests/kernels/test_triton_rotary.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton.common import check_devices, check_tensor, next_power_of_2


@triton.jit
def _rotary_kernel(
    X, COS, SIN, OUT,
    stride_xt, stride_xh, stride_ct, stride_st, stride_ot, stride_oh,
    num_heads, half,
    BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    dims = tl.arange(0, BLOCK_HALF)
    dim_mask = dims < half
    mask = (heads < num_heads)[:, None] & dim_mask[None, :]
    x_first = X + token * stride_xt + heads[:, None] * stride_xh + dims[None, :]  # [BLOCK_H, BLOCK_HALF]
    x1 = tl.load(x_first, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_first + half, mask=mask, other=0.0).to(tl.float32)
    cos1 = tl.load(COS + token * stride_ct + dims, mask=dim_mask, other=0.0).to(tl.float32)[None, :]
    cos2 = tl.load(COS + token * stride_ct + half + dims, mask=dim_mask, other=0.0).to(tl.float32)[None, :]
    sin1 = tl.load(SIN + token * stride_st + dims, mask=dim_mask, other=0.0).to(tl.float32)[None, :]
    sin2 = tl.load(SIN + token * stride_st + half + dims, mask=dim_mask, other=0.0).to(tl.float32)[None, :]
    out_first = OUT + token * stride_ot + heads[:, None] * stride_oh + dims[None, :]
    tl.store(out_first, (x1 * cos1 - x2 * sin1).to(OUT.dtype.element_ty), mask=mask)
    tl.store(out_first + half, (x2 * cos2 + x1 * sin2).to(OUT.dtype.element_ty), mask=mask)


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate queries or keys: the contract of `kernels.ref.ref_rotary` (dispatch op "rotary").

    Args:
        x: [T, heads, D] (D even; token and head strides free, last dimension contiguous).
        cos, sin: [T, D] tables from `ref_rotary_cos_sin`, last dimension contiguous.
    Returns:
        A new contiguous [T, heads, D] tensor in the promoted dtype of x and cos.
    Raises:
        ValueError: wrong ranks, an odd D, tables whose shape is not [T, D], unsupported dtypes, or tensors
            on different or unsupported devices.
    """
    check_tensor("x", x, dim=3)
    check_tensor("cos", cos, dim=2)
    check_tensor("sin", sin, dim=2)
    num_tokens, num_heads, head_dim = x.shape
    if head_dim % 2:
        raise ValueError(f"head size {head_dim} must be even for the half-split layout")
    if cos.shape != (num_tokens, head_dim) or sin.shape != (num_tokens, head_dim):
        raise ValueError(f"cos {tuple(cos.shape)} and sin {tuple(sin.shape)} must be [T, D] = [{num_tokens}, {head_dim}]")
    check_devices(x=x, cos=cos, sin=sin)
    out = torch.empty(x.shape, dtype=torch.promote_types(x.dtype, cos.dtype), device=x.device)
    half = head_dim // 2
    block_half = next_power_of_2(half)
    block_h = min(next_power_of_2(num_heads), max(1, 4096 // block_half))  # at most 4096 pairs per program
    if num_tokens and num_heads:
        grid = (num_tokens, triton.cdiv(num_heads, block_h))
        _rotary_kernel[grid](
            x, cos, sin, out,
            x.stride(0), x.stride(1), cos.stride(0), sin.stride(0), out.stride(0), out.stride(1),
            num_heads, half, BLOCK_H=block_h, BLOCK_HALF=block_half,
        )
    return out
