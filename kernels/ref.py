"""PyTorch reference implementations of the hot operations (the `ref_*` functions).

These are the ground truth every tuned kernel is checked against, and the default implementation
the dispatch table serves. Shapes use: T tokens, H query heads, K key/value heads, D head size,
E hidden size, F feed-forward size.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def ref_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, *, offset: float = 0.0) -> torch.Tensor:
    """Root-mean-square layer norm (Zhang & Sennrich 2019, arXiv:1910.07467).

    y = x / sqrt(mean(x^2) + eps) * (offset + weight), computed in float32 and cast back to x's dtype.
    Llama multiplies by `weight` after casting back; Gemma (offset=1) multiplies by (1 + weight) in
    float32 before casting. Both orders are reproduced exactly.

    Args:
        x: [..., E] activations.
        weight: [E] scale.
        eps: added to the mean square.
        offset: 0 for Llama, 1 for Gemma (whose checkpoints store weight - 1).
    """
    dtype = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if offset:
        return (xf * (offset + weight.float())).to(dtype)
    return weight * xf.to(dtype)


def ref_rotary_cos_sin(positions: torch.Tensor, head_dim: int, base: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables for rotary embeddings (Su et al. 2021, arXiv:2104.09864), half-split layout.

    Args:
        positions: [T] int64 absolute positions.
        head_dim: D, the rotated size (even).
        base: the RoPE base frequency theta.
    Returns:
        (cos, sin), each [T, D] in `dtype`; frequencies are computed in float32.
    """
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    angles = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((angles, angles), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def ref_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Apply rotary embeddings in the half-split ("rotate half", GPT-NeoX) layout.

    Args:
        x: [T, heads, D] queries or keys.
        cos, sin: [T, D] from `ref_rotary_cos_sin`.
    Returns:
        [T, heads, D], x * cos + rotate_half(x) * sin.
    """
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def ref_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float,
    q_start: int,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Causal scaled dot-product attention of new queries over a contiguous KV cache.

    Query i sits at absolute position q_start + i and sees key j when j <= q_start + i and, with a
    sliding window W, when q_start + i - j < W. Grouped-query attention (Ainslie et al. 2023,
    arXiv:2305.13245): H must be a multiple of K.

    Args:
        q: [T, H, D] queries of the T new tokens.
        k, v: [S, K, D] all keys/values so far (S >= q_start + T).
        scale: multiplier of q.k (usually D ** -0.5).
        q_start: absolute position of the first query.
        sliding_window: W, or None for global attention.
    Returns:
        [T, H, D] attention output.
    """
    num_tokens, num_heads = q.shape[0], q.shape[1]
    num_kv = k.shape[0]
    if k.shape[1] != num_heads:
        group = num_heads // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.matmul(q.transpose(0, 1), k.permute(1, 2, 0)) * scale  # [H, T, S]
    q_pos = torch.arange(q_start, q_start + num_tokens)[:, None]
    k_pos = torch.arange(num_kv)[None, :]
    mask = k_pos <= q_pos
    if sliding_window is not None:
        mask = mask & (q_pos - k_pos < sliding_window)
    scores = scores.float().masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(q.dtype)
    return torch.matmul(probs, v.transpose(0, 1)).transpose(0, 1)  # [T, H, D]


def ref_gated_mlp(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, activation: str) -> torch.Tensor:
    """Gated feed-forward block: down(act(gate(x)) * up(x)) (Shazeer 2020, arXiv:2002.05202).

    Args:
        x: [T, E].
        gate_up: [2F, E], the gate projection stacked over the up projection.
        down: [E, F].
        activation: "silu" (SwiGLU, Llama) or "gelu_tanh" (GeGLU with the tanh approximation, Gemma).
    Returns:
        [T, E].
    """
    gate, up = F.linear(x, gate_up).chunk(2, dim=-1)
    if activation == "silu":
        act = F.silu(gate)
    elif activation == "gelu_tanh":
        act = F.gelu(gate, approximate="tanh")
    else:
        raise ValueError(f"unknown MLP activation {activation!r}; expected 'silu' or 'gelu_tanh'")
    return F.linear(act * up, down)


def ref_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T (+ bias). x: [..., in], weight: [out, in]; returns [..., out]."""
    return F.linear(x, weight, bias)
