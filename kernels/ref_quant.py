"""PyTorch references for weight-only quantization: quantize, dequantize, and dequantize-then-matmul.

Two schemes, both weight-only (activations stay in floating point) and both round-to-nearest with no
calibration data, as in the weight-only modes of gpt-fast and torchao that PyTorch's CPU kernels
(`torch.ops.aten._weight_int8pack_mm`, `_weight_int4pack_mm_for_cpu`) were written for:

- int8, per output channel, symmetric: s[n] = max_k |w[n, k]| / 127, q = round(w / s) in [-127, 127],
  w ~ q * s. One float scale per row of the [out, in] weight.
- int4, per group of G consecutive input features, asymmetric (min/max, the "tinygemm" layout): for
  each row n and group g, s = (max - min) / 15, z = min + 8 s, q = round((w - min) / s) in [0, 15],
  w ~ (q - 8) * s + z. G is one of 32, 64, 128, 256 (what the CPU kernel supports).

Rounding puts every element within s / 2 of its dequantized value (the bound the tests check). This is
not LLM.int8() (Dettmers et al. 2022, arXiv:2208.07339), which also quantizes activations and keeps
outlier features in fp16; nor GPTQ/AWQ, which choose the rounding from calibration data.

Shapes: weight [N, K] = [out features, in features]; x [..., K].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

INT4_GROUP_SIZES = (32, 64, 128, 256)


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-channel symmetric int8 quantization, computed in float32.

    Args:
        weight: [N, K] float weight.
    Returns:
        (q, scale): q [N, K] int8 in [-127, 127]; scale [N] float32, max |w[n]| / 127 (a row of zeros
        gets scale 1, so q = 0 reproduces it).
    Raises:
        ValueError: weight is not 2-D.
    """
    if weight.dim() != 2:
        raise ValueError(f"expected a 2-D [out, in] weight, got shape {tuple(weight.shape)}")
    w = weight.float()
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / 127, torch.ones_like(amax))
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """q [N, K] int8, scale [N] -> [N, K] float32, q * scale."""
    return q.float() * scale.float()[:, None]


def check_int4_shape(shape: tuple[int, ...] | torch.Size, group_size: int) -> None:
    """Raise ValueError unless a [N, K] weight can use the CPU int4 kernel with groups of `group_size`.

    The kernel needs G in (32, 64, 128, 256), K a multiple of G, and N a multiple of 16.
    """
    if len(shape) != 2:
        raise ValueError(f"expected a 2-D [out, in] weight, got shape {tuple(shape)}")
    out_features, in_features = shape
    if group_size not in INT4_GROUP_SIZES:
        raise ValueError(f"int4 group size must be one of {INT4_GROUP_SIZES}, got {group_size}")
    if in_features % group_size:
        raise ValueError(f"int4: in features {in_features} is not a multiple of the group size {group_size}")
    if out_features % 16:
        raise ValueError(f"int4: out features {out_features} is not a multiple of 16 (the CPU kernel's tile)")


def quantize_int4(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Group-wise asymmetric int4 quantization along the input features, computed in float32.

    Args:
        weight: [N, K] float weight.
        group_size: G, consecutive input features sharing one scale and zero.
    Returns:
        (q, scale, zero): q [N, K] uint8 in [0, 15]; scale and zero [N, K / G] float32, so that
        w ~ (q - 8) * scale + zero. A constant group gets scale 1 (then q = 8, exact).
    Raises:
        ValueError: the shape or group size is not supported (`check_int4_shape`).
    """
    check_int4_shape(weight.shape, group_size)
    out_features, in_features = weight.shape
    w = weight.float().reshape(out_features, in_features // group_size, group_size)
    low, high = w.amin(dim=-1), w.amax(dim=-1)
    scale = torch.where(high > low, (high - low) / 15, torch.ones_like(low))
    zero = low + 8 * scale
    q = torch.round((w - zero[..., None]) / scale[..., None] + 8).clamp_(0, 15)
    return q.to(torch.uint8).reshape(out_features, in_features), scale, zero


def dequantize_int4(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """q [N, K] in [0, 15], scale and zero [N, K / G] -> [N, K] float32, (q - 8) * scale + zero."""
    group_size = q.shape[1] // scale.shape[1]
    scale = scale.float().repeat_interleave(group_size, dim=1)
    zero = zero.float().repeat_interleave(group_size, dim=1)
    return (q.float() - 8) * scale + zero


def ref_int8_weight_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The int8 weight-only linear, spelled out: F.linear(x, dequantize(quantize_int8(weight))) + bias.

    The scales are rounded to x's dtype first (the CPU kernel takes them in the activation dtype), the
    product is computed in float32 and cast to x's dtype. x: [..., K], weight: [N, K]; returns [..., N].
    """
    q, scale = quantize_int8(weight)
    w = dequantize_int8(q, scale.to(x.dtype))
    out = F.linear(x.float(), w, None if bias is None else bias.float())
    return out.to(x.dtype)


def ref_int4_weight_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *, group_size: int = 64
) -> torch.Tensor:
    """The int4 weight-only linear, spelled out: F.linear(x, dequantize(quantize_int4(weight, G))) + bias.

    Scales and zeros are rounded to x's dtype first, as the CPU kernel takes them; the product is in
    float32, cast to x's dtype. x: [..., K], weight: [N, K]; returns [..., N].
    Raises ValueError for shapes the kernel does not support (`check_int4_shape`).
    """
    q, scale, zero = quantize_int4(weight, group_size)
    w = dequantize_int4(q, scale.to(x.dtype), zero.to(x.dtype))
    out = F.linear(x.float(), w, None if bias is None else bias.float())
    return out.to(x.dtype)
