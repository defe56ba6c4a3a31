"""Fast CPU implementations in plain PyTorch, installed over the references by default.

The references in `ref.py` spell each formula out (grouped-query attention by repeating K/V heads,
einsums over a padded gather); they are the ground truth for parity tests. The variants here compute
the same values through `torch.nn.functional.scaled_dot_product_attention` (SDPA), whose CPU kernel
handles grouped-query attention (`enable_gqa`, no K/V copy per query head) and fuses the softmax:
about 10x faster than the reference for a batch of 16 decode tokens over 100-600 cached tokens.

Parity against the references: `tests/kernels/test_cpu.py`. Timing: `benchmarks/bench_attention.py`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from kernels.native import load_rows_linear, unavailable_reason
from kernels.quant_cpu import PackCache
from kernels.ref import ref_gated_activation

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


# --- linear layers for a few rows ---------------------------------------------------------------------
#
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


def _has_rows_linear() -> bool:
    return load_rows_linear() is not None


def _has_mkl() -> bool:
    return torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear")


def cpu_variants() -> list:
    """The CPU variants the tuner may pick per bucket (not registered; `kernels.candidates`): plain PyTorch,
    our AVX-512 few-rows linear, and our C++ decode step with its GGUF-block linear (`kernels.native_step`)."""
    from kernels.native_step import native_variants
    from kernels.variants import Variant

    return [Variant("paged_attention", "bmm-decode", bmm_paged_attention,
                    description="decode batches as batched matmuls and a float32 softmax (no SDPA call setup)"),
            Variant("linear", "kn", kn_linear,
                    description="x @ W^T on a cached [K, N] copy of the weight (no per-call repacking from 4 rows on)"),
            Variant("linear", "mkl-packed", mkl_packed_linear, dtypes=(torch.float32,), available=_has_mkl,
                    description="MKL's packed sgemm, the weight packed once (float32)"),
            Variant("linear", "rows-avx512", few_rows_linear, dtypes=(torch.float32,), available=_has_rows_linear,
                    description="from 4 rows, our AVX-512 kernel: each weight row read once per call for all rows (float32)"),
            Variant("gated_mlp", "kn", kn_gated_mlp,
                    description="both projections on cached [K, N] copies of their weights"),
            Variant("gated_mlp", "mkl-packed", mkl_packed_gated_mlp, dtypes=(torch.float32,), available=_has_mkl,
                    description="both projections through MKL's packed sgemm (float32)"),
            Variant("gated_mlp", "rows-avx512", few_rows_gated_mlp, dtypes=(torch.float32,), available=_has_rows_linear,
                    description="both projections through our AVX-512 kernel from 4 rows, F.linear below (float32)"),
            *native_variants()]
