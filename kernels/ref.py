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


def ref_paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: list[int],
    query_lens: list[int],
    *,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Causal attention of a batch of sequences over a paged KV cache (PagedAttention, Kwon et al.
    2023, arXiv:2309.06180), for any mix of prefill chunks and decode tokens.

    Sequence b contributes query_lens[b] consecutive rows of `q` (its newest tokens, at absolute
    positions seq_lens[b] - query_lens[b] ... seq_lens[b] - 1); their keys and values must already be
    in the cache. Decode rows (query length 1) are computed together with one padded gather; prefill
    chunks one sequence at a time.

    Args:
        q: [N, H, D] queries, N = sum(query_lens), grouped by sequence in batch order.
        k_cache, v_cache: [num_blocks, block_size, K, D].
        block_tables: [B, max_blocks] int64 physical block ids (padding entries are ignored).
        seq_lens: B total lengths (context + new tokens).
        query_lens: B new-token counts (each >= 1, <= seq_lens[b]).
        scale: multiplier of q.k.
        sliding_window: W, or None for global attention.
    Returns:
        [N, H, D].
    """
    block_size = k_cache.shape[1]
    out = torch.empty_like(q)
    decode = [b for b, n in enumerate(query_lens) if n == 1]
    starts = [0]
    for n in query_lens:
        starts.append(starts[-1] + n)
    if decode:
        rows = torch.tensor([starts[b] for b in decode])
        out[rows] = _paged_decode(q[rows], k_cache, v_cache, block_tables[decode], [seq_lens[b] for b in decode], scale, sliding_window)
    for b, n in enumerate(query_lens):
        if n == 1:
            continue
        num_blocks = -(-seq_lens[b] // block_size)
        table = block_tables[b, :num_blocks]
        k = k_cache[table].flatten(0, 1)[: seq_lens[b]]
        v = v_cache[table].flatten(0, 1)[: seq_lens[b]]
        out[starts[b] : starts[b + 1]] = ref_attention(
            q[starts[b] : starts[b + 1]], k, v, scale=scale, q_start=seq_lens[b] - n, sliding_window=sliding_window
        )
    return out


def _paged_decode(q, k_cache, v_cache, block_tables, seq_lens, scale, sliding_window):
    """One new token per sequence: q [B, H, D] -> [B, H, D], keys gathered into [B, L, K, D]."""
    block_size, num_kv = k_cache.shape[1], k_cache.shape[2]
    max_len = max(seq_lens)
    num_blocks = -(-max_len // block_size)
    table = block_tables[:, :num_blocks]
    k = k_cache[table].flatten(1, 2)  # [B, L, K, D], L = num_blocks * block_size
    v = v_cache[table].flatten(1, 2)
    group = q.shape[1] // num_kv
    if group > 1:
        k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    scores = torch.einsum("bhd,blhd->bhl", q, k) * scale
    lens = torch.tensor(seq_lens)[:, None]
    k_pos = torch.arange(k.shape[1])[None, :]
    mask = k_pos < lens
    if sliding_window is not None:
        mask = mask & (lens - 1 - k_pos < sliding_window)
    scores = scores.float().masked_fill(~mask[:, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(q.dtype)
    return torch.einsum("bhl,blhd->bhd", probs, v)
