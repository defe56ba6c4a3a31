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
    return F.linear(ref_gated_activation(F.linear(x, gate_up), activation), down)


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


def ref_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, *, offset: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual add followed by RMSNorm, the pre-norm transformer's step between sublayers.

    The sum is rounded to x's dtype before it is normalized, as an unfused model does
    (`residual = residual + x; x = norm(residual)`), and is also returned as the next residual.

    Args:
        x: [..., E] sublayer output.
        residual: [..., E] the residual stream, same shape and dtype as x.
        weight: [E] scale; eps and offset as in `ref_rms_norm`.
    Returns:
        (normed, new_residual), each [..., E] in x's dtype: ref_rms_norm(x + residual), x + residual.
    Raises:
        ValueError: residual's shape or dtype differs from x's.
    """
    if residual.shape != x.shape or residual.dtype != x.dtype:
        raise ValueError(f"residual {tuple(residual.shape)} {residual.dtype} must match x {tuple(x.shape)} {x.dtype}")
    new_residual = x + residual
    return ref_rms_norm(new_residual, weight, eps, offset=offset), new_residual


def ref_gated_activation(gate_up: torch.Tensor, activation: str) -> torch.Tensor:
    """The gating step of a gated MLP: act(gate) * up on the fused projection output (Shazeer 2020,
    arXiv:2002.05202; GELU's tanh approximation: Hendrycks & Gimpel 2016, arXiv:1606.08415).

    Args:
        gate_up: [T, 2F], the gate half [..., :F] beside the up half [..., F:] (x @ gate_up_proj.T).
        activation: "silu" (SwiGLU, Llama) or "gelu_tanh" (GeGLU, Gemma).
    Returns:
        [T, F] in gate_up's dtype.
    Raises:
        ValueError: an unknown activation or an odd last dimension.
    """
    if gate_up.shape[-1] % 2:
        raise ValueError(f"gate_up's last dimension {gate_up.shape[-1]} must be even (gate and up halves)")
    gate, up = gate_up.chunk(2, dim=-1)
    if activation == "silu":
        return F.silu(gate) * up
    if activation == "gelu_tanh":
        return F.gelu(gate, approximate="tanh") * up
    raise ValueError(f"unknown MLP activation {activation!r}; expected 'silu' or 'gelu_tanh'")


# GGML's block quantizations (the GGUF specification, github.com/ggml-org/ggml docs/gguf.md, and
# ggml-quants.c): 32 consecutive weights of a row share one float16 scale d; weight = d * q.
GGML_BLOCK_SIZE = 32
GGML_QUANT_TYPES = ("q8_0", "q4_0")


def ref_ggml_quantize(weight: torch.Tensor, qtype: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize a weight matrix into GGML Q8_0 or Q4_0 blocks, stored split: scales beside packed quants.

    Q8_0: d = max|w| / 127, q = round(w / d) in [-127, 127] (rounding half away from zero).
    Q4_0: d = m / -8 with m the block's weight of largest magnitude (sign kept), q = min(15, trunc(w / d + 8.5))
    in [0, 15], weight = d * (q - 8); a row's 16 bytes per block hold weight j in the low nibble of byte j and
    weight j + 16 in its high nibble, as in a GGUF file. q is computed with the float32 1/d, d is stored as
    float16 (as ggml does), so the blocks equal the `gguf` package's `quants.quantize` byte for byte.

    Args:
        weight: [N, K] float weights, K a multiple of 32.
        qtype: "q8_0" or "q4_0".
    Returns:
        (scales, quants): scales [N, K / 32] float16; quants [N, K] int8 (Q8_0) or [N, K / 2] uint8 (Q4_0).
    Raises:
        ValueError: weight is not 2-D, K is not a multiple of 32, or qtype is unknown.
    """
    if weight.dim() != 2 or weight.shape[1] % GGML_BLOCK_SIZE:
        raise ValueError(f"weight {tuple(weight.shape)} must be [N, K] with K a multiple of {GGML_BLOCK_SIZE}")
    if qtype not in GGML_QUANT_TYPES:
        raise ValueError(f"unknown quantization {qtype!r}; expected one of {GGML_QUANT_TYPES}")
    rows, cols = weight.shape
    blocks = weight.float().reshape(rows, cols // GGML_BLOCK_SIZE, GGML_BLOCK_SIZE)
    if qtype == "q8_0":
        d = blocks.abs().amax(-1, keepdim=True) / 127
        scaled = blocks * torch.where(d == 0, 0.0, 1.0 / d)
        q = (scaled.sign() * (scaled.abs() + 0.5).floor()).to(torch.int8)
        return d.squeeze(-1).half(), q.reshape(rows, cols)
    extreme = blocks.gather(-1, blocks.abs().argmax(-1, keepdim=True))
    d = extreme / -8
    q = (blocks * torch.where(d == 0, 0.0, 1.0 / d) + 8.5).trunc().clamp(0, 15).to(torch.uint8)
    packed = q[..., :16] | (q[..., 16:] << 4)  # [N, K / 32, 16]
    return d.squeeze(-1).half(), packed.reshape(rows, cols // 2)


def ref_ggml_dequantize(scales: torch.Tensor, quants: torch.Tensor, qtype: str) -> torch.Tensor:
    """The float32 [N, K] weights of split Q8_0/Q4_0 blocks (the inverse of `ref_ggml_quantize`, up to rounding).

    Args:
        scales: [N, K / 32] float16.
        quants: [N, K] int8 (Q8_0) or [N, K / 2] uint8 (Q4_0).
        qtype: "q8_0" or "q4_0".
    Raises:
        ValueError: unknown qtype or shapes that do not fit together.
    """
    rows, num_blocks = scales.shape
    if qtype == "q8_0":
        if quants.shape != (rows, num_blocks * GGML_BLOCK_SIZE):
            raise ValueError(f"Q8_0 quants {tuple(quants.shape)} do not fit scales {tuple(scales.shape)}")
        q = quants.float().reshape(rows, num_blocks, GGML_BLOCK_SIZE)
    elif qtype == "q4_0":
        if quants.shape != (rows, num_blocks * GGML_BLOCK_SIZE // 2):
            raise ValueError(f"Q4_0 quants {tuple(quants.shape)} do not fit scales {tuple(scales.shape)}")
        packed = quants.reshape(rows, num_blocks, GGML_BLOCK_SIZE // 2)
        q = torch.cat((packed & 0x0F, packed >> 4), dim=-1).float() - 8
    else:
        raise ValueError(f"unknown quantization {qtype!r}; expected one of {GGML_QUANT_TYPES}")
    return (q * scales.float()[..., None]).reshape(rows, num_blocks * GGML_BLOCK_SIZE)


def ref_ggml_linear(
    x: torch.Tensor, scales: torch.Tensor, quants: torch.Tensor, qtype: str, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x @ W.T (+ bias) with W given as split Q8_0/Q4_0 blocks (weight-only quantization).

    Args:
        x: [..., K] activations.
        scales, quants, qtype: W [N, K] as in `ref_ggml_dequantize`.
        bias: [N] or None.
    Returns:
        [..., N] in x's dtype; W is dequantized to float32 and cast to x's dtype first.
    """
    return F.linear(x, ref_ggml_dequantize(scales, quants, qtype).to(x.dtype), bias)
