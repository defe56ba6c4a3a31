"""Fast CPU attention and RMSNorm in plain PyTorch, installed over the references by default.

The references in `ref.py` spell each formula out (grouped-query attention by repeating K/V heads,
einsums over a padded gather); they are the ground truth for parity tests. The variants here compute
the same values through `torch.nn.functional.scaled_dot_product_attention` (SDPA), whose CPU kernel
handles grouped-query attention (`enable_gqa`, no K/V copy per query head) and fuses the softmax:
about 10x faster than the reference for a batch of 16 decode tokens over 100-600 cached tokens.

`bmm_paged_attention` (decode batches as batched matmuls) is a tuner candidate, not a default. The float
linears for a few rows are `cpu_linear.py`. Parity against the references: `tests/kernels/test_cpu.py`. Timing: `benchmarks/bench_attention.py`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.variants import Variant

SHORT_QUERY = 16   # query tokens up to which a sequence joins the batched paged-attention call


def _visible(q_pos: torch.Tensor, k_pos: torch.Tensor, sliding_window: int | None) -> torch.Tensor:
    """Boolean mask of keys each query may attend to: causal, and within W positions when windowed."""
    mask = k_pos <= q_pos
    if sliding_window is not None:
        mask = mask & (q_pos - k_pos < sliding_window)
    return mask


def sdpa_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float,
    q_start: int,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Same contract as `ref.ref_attention`: q [T, H, D], k/v [S, K, D] -> [T, H, D].

    Causal attention of T new queries (absolute positions q_start ... q_start + T - 1) over S keys, with
    an optional sliding window W; H must be a multiple of K (grouped-query attention).
    """
    num_tokens, num_keys = q.shape[0], k.shape[0]
    q_pos = torch.arange(q_start, q_start + num_tokens)[:, None]
    mask = _visible(q_pos, torch.arange(num_keys)[None, :], sliding_window)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask, scale=scale, enable_gqa=True
    )
    return out.transpose(0, 1)


def sdpa_paged_attention(
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
    """Same contract as `ref.ref_paged_attention` (PagedAttention, Kwon et al. 2023, arXiv:2309.06180).

    Decode rows (query length 1) run as one SDPA call over keys gathered into [B, K, L, D] (L = the
    longest sequence rounded up to a block) with a length mask; a sliding-window layer gathers only the
    blocks that can still be inside the window. Short queries of several sequences (2 to SHORT_QUERY tokens:
    speculative decoding's k + 1 verified tokens, the tail chunk of a prefill) run as a second such call,
    padded to the longest with a causal mask offset by each sequence's cached length (decode rows are not
    padded into it: 16 decode rows beside one 16-token tail would do 8x the attention work). Longer
    prefill chunks, and a lone short one, run one sequence at a time.

    Args:
        q: [N, H, D]; k_cache, v_cache: [num_blocks, block_size, K, D]; block_tables: [B, max_blocks]
        int64; seq_lens, query_lens: B ints. Returns [N, H, D].
    """
    if all(n == 1 for n in query_lens):
        return _decode(q, k_cache, v_cache, block_tables, seq_lens, scale, sliding_window)
    out = torch.empty_like(q)
    starts = [0]
    for n in query_lens:
        starts.append(starts[-1] + n)
    decode = [b for b, n in enumerate(query_lens) if n == 1]
    if decode:
        rows = torch.tensor([starts[b] for b in decode])
        out[rows] = _decode(q[rows], k_cache, v_cache, block_tables[decode], [seq_lens[b] for b in decode], scale,
                            sliding_window)
    short = [b for b, n in enumerate(query_lens) if 1 < n <= SHORT_QUERY]
    if len(short) > 1:
        rows = torch.cat([torch.arange(starts[b], starts[b + 1]) for b in short])
        out[rows] = _short_queries(q[rows], k_cache, v_cache, block_tables[short], [seq_lens[b] for b in short],
                                   [query_lens[b] for b in short], scale, sliding_window)
    block_size = k_cache.shape[1]
    for b, n in enumerate(query_lens):
        if n == 1 or (len(short) > 1 and n <= SHORT_QUERY):
            continue
        first = 0 if sliding_window is None else max(0, seq_lens[b] - n - sliding_window + 1) // block_size
        table = block_tables[b, first : -(-seq_lens[b] // block_size)]
        k = k_cache[table].flatten(0, 1)[: seq_lens[b] - first * block_size]
        v = v_cache[table].flatten(0, 1)[: seq_lens[b] - first * block_size]
        out[starts[b] : starts[b + 1]] = sdpa_attention(
            q[starts[b] : starts[b + 1]], k, v, scale=scale, q_start=seq_lens[b] - n - first * block_size,
            sliding_window=sliding_window,
        )
    return out


def _gathered_keys(k_cache, v_cache, block_tables, seq_lens, first_pos, sliding_window):
    """Keys and values of B sequences gathered to [B, K, L, D] over the blocks any of them reads, and the
    [L] absolute positions of those slots. `first_pos` is the smallest query position of any sequence (a
    sliding-window layer never reads blocks wholly before first_pos - W + 1)."""
    block_size = k_cache.shape[1]
    last_block = -(-max(seq_lens) // block_size)
    first_block = 0 if sliding_window is None else max(0, first_pos - sliding_window + 1) // block_size
    table = block_tables[:, first_block:last_block]
    k = k_cache[table].flatten(1, 2).transpose(1, 2)  # [B, K, L, D]
    v = v_cache[table].flatten(1, 2).transpose(1, 2)
    return k, v, torch.arange(first_block * block_size, last_block * block_size)


def _short_queries(q, k_cache, v_cache, block_tables, seq_lens, query_lens, scale, sliding_window):
    """B sequences' last T_b tokens (T_b <= SHORT_QUERY) in one SDPA call: q [sum T_b, H, D] -> same.

    Queries are padded to [B, H, Tmax, D]; query t of sequence b sits at position seq_len_b - T_b + t and sees
    the keys at or before it (and within the window). Padding rows repeat the last real position, so no row
    is fully masked (SDPA would return NaN there), and are dropped.
    """
    lens = torch.tensor(query_lens)
    t_max = int(lens.max())
    t = torch.arange(t_max)[None, :]
    valid = t < lens[:, None]                                                      # [B, Tmax]
    q_pos = torch.tensor(seq_lens)[:, None] - lens[:, None] + torch.minimum(t, lens[:, None] - 1)
    k, v, k_pos = _gathered_keys(k_cache, v_cache, block_tables, seq_lens, int(q_pos.min()), sliding_window)
    padded = q.new_zeros(len(query_lens), t_max, *q.shape[1:])                     # [B, Tmax, H, D]
    padded[valid] = q
    mask = _visible(q_pos[:, :, None], k_pos[None, None, :], sliding_window)      # [B, Tmax, L]
    out = F.scaled_dot_product_attention(padded.transpose(1, 2), k, v, attn_mask=mask[:, None], scale=scale,
                                         enable_gqa=True)                            # [B, H, Tmax, D]
    return out.transpose(1, 2)[valid]


def _decode(q, k_cache, v_cache, block_tables, seq_lens, scale, sliding_window):
    """One new token per sequence: q [B, H, D] -> [B, H, D]."""
    block_size = k_cache.shape[1]
    if len(seq_lens) == 1:  # one sequence: slice its visible keys, no mask
        length = seq_lens[0]
        start = 0 if sliding_window is None else max(0, length - sliding_window)
        table = block_tables[0, start // block_size : -(-length // block_size)]
        offset = start - start // block_size * block_size
        k = k_cache[table].flatten(0, 1)[offset : offset + length - start].transpose(0, 1)  # [K, S, D]
        v = v_cache[table].flatten(0, 1)[offset : offset + length - start].transpose(0, 1)
        return F.scaled_dot_product_attention(q.transpose(0, 1), k, v, scale=scale, enable_gqa=True).transpose(0, 1)
    lens = torch.tensor(seq_lens)
    k, v, k_pos = _gathered_keys(k_cache, v_cache, block_tables, seq_lens, min(seq_lens) - 1, sliding_window)
    mask = _visible((lens - 1)[:, None], k_pos[None, :], sliding_window)  # [B, L]
    out = F.scaled_dot_product_attention(q[:, :, None, :], k, v, attn_mask=mask[:, None, None, :], scale=scale, enable_gqa=True)
    return out[:, :, 0, :]


def fused_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, *, offset: float = 0.0) -> torch.Tensor:
    """Same contract as `ref.ref_rms_norm` (x [..., E], weight [E]), through `torch.rms_norm`.

    float32 Llama norms are one fused call; otherwise the statistics are taken in float32 as in the
    reference, and the weight is applied after the cast back (Llama) or before it (Gemma's offset).
    """
    size = (x.shape[-1],)
    if offset:
        return torch.rms_norm(x.float(), size, offset + weight.float(), eps).to(x.dtype)
    if x.dtype == torch.float32:
        return torch.rms_norm(x, size, weight, eps)
    return torch.rms_norm(x.float(), size, None, eps).to(x.dtype) * weight


def bmm_paged_attention(
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
    """Same contract as `sdpa_paged_attention`, with decode-only batches as two batched matmuls and a softmax.

    For one new token per sequence the attention is a [G, D] x [D, L] product per KV head (G = H / K query
    heads share it) and its softmax: a few microseconds of arithmetic that SDPA's CPU kernel wraps in
    ~50-250 us of setup per call (measured, SmolLM2's 9 heads over 3 KV heads, 40-800 keys: 27-283 us
    against 13-66 us on one thread). Query head h reads KV head h // G, as SDPA's `enable_gqa`. Scores,
    softmax and the weighted sum are taken in float32 and the result cast to q's dtype. Batches with a
    longer query (prefill chunks, speculative verify steps) go to `sdpa_paged_attention`.
    """
    if not all(n == 1 for n in query_lens):
        return sdpa_paged_attention(q, k_cache, v_cache, block_tables, seq_lens, query_lens, scale=scale,
                                    sliding_window=sliding_window)
    num_seqs, num_heads, head_dim = q.shape
    num_kv = k_cache.shape[2]
    block_size = k_cache.shape[1]
    if num_seqs == 1:
        length = seq_lens[0]
        start = 0 if sliding_window is None else max(0, length - sliding_window)
        table = block_tables[0, start // block_size : -(-length // block_size)]
        offset = start - start // block_size * block_size
        k = k_cache[table].flatten(0, 1)[offset : offset + length - start].transpose(0, 1).float()  # [K, S, D]
        v = v_cache[table].flatten(0, 1)[offset : offset + length - start].transpose(0, 1).float()
        scores = torch.bmm(q.float().view(num_kv, -1, head_dim), k.transpose(1, 2)).mul_(scale)  # [K, G, S]
        return torch.bmm(torch.softmax(scores, dim=-1), v).view(1, num_heads, head_dim).to(q.dtype)
    lens = torch.tensor(seq_lens)
    k, v, k_pos = _gathered_keys(k_cache, v_cache, block_tables, seq_lens, min(seq_lens) - 1, sliding_window)
    visible = _visible((lens - 1)[:, None], k_pos[None, :], sliding_window)  # [B, L]
    scores = torch.matmul(q.float().view(num_seqs, num_kv, -1, head_dim), k.float().transpose(-1, -2)).mul_(scale)
    scores.masked_fill_(~visible[:, None, None, :], float("-inf"))             # [B, K, G, L]
    out = torch.matmul(torch.softmax(scores, dim=-1), v.float())               # [B, K, G, D]
    return out.reshape(num_seqs, num_heads, head_dim).to(q.dtype)


def attention_variants() -> list[Variant]:
    """The attention variants the tuner may pick per bucket (not registered; the "cpu" provider of
    `kernels.candidates` gathers them with `kernels.cpu_linear`'s and `kernels.native_step`'s)."""
    return [Variant("paged_attention", "bmm-decode", bmm_paged_attention,
                    description="decode batches as batched matmuls and a float32 softmax (no SDPA call setup)")]
