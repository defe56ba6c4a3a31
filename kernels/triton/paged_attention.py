"""Decode attention over the paged KV cache (PagedAttention, Kwon et al. 2023, arXiv:2309.06180) in Triton.

Each sequence has one new query token per head. A program takes one sequence and one KV head with the
G = H / K query heads that share it (grouped-query attention, Ainslie et al. 2023, arXiv:2305.13245),
walks the sequence's block table one cache block at a time and keeps an online softmax (running max,
running sum, weighted values; Milakov & Gimelshein 2018, arXiv:1805.02867) in float32. Long sequences are
split into partitions of blocks run by separate programs whose partial results a second kernel merges
(the flash-decoding split, so a batch of one still fills the GPU). With a sliding window W only the blocks
holding the last W positions are read. The cache layout is `serving.engine.paged_cache`'s:
[num_blocks, block_size, K, D], block tables [B, max_blocks]. Reference: `kernels.ref.ref_paged_attention`;
parity tests: tests/kernels/test_triton_paged_attention.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import ref
from kernels.triton.common import check_devices, check_tensor, next_power_of_2

PARTITION_TOKENS = 512  # keys per program before a long sequence is split across programs
NO_WINDOW = 2**30  # the window passed for global attention: longer than any sequence


@triton.jit
def _paged_decode_kernel(
    Q, K_CACHE, V_CACHE, BLOCK_TABLES, SEQ_LENS, OUT, M_PART, L_PART, ACC_PART,
    stride_qb, stride_qh, stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh,
    stride_bt, stride_ob, stride_oh,
    scale, window, head_dim, block_size, blocks_per_partition, num_partitions,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    IS_SPLIT: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    part = tl.program_id(2)
    heads = kv_head * GROUP + tl.arange(0, GROUP_PAD)  # the query heads reading this KV head
    head_mask = tl.arange(0, GROUP_PAD) < GROUP
    dims = tl.arange(0, BLOCK_D)
    dim_mask = dims < head_dim
    slots = tl.arange(0, BLOCK_N)

    q = tl.load(Q + seq * stride_qb + heads[:, None] * stride_qh + dims[None, :],
                mask=head_mask[:, None] & dim_mask[None, :], other=0.0).to(tl.float32) * scale  # [G, D]
    seq_len = tl.load(SEQ_LENS + seq)
    start = tl.maximum(seq_len - window, 0)  # the query at seq_len - 1 sees keys in [start, seq_len)
    first_block = start // block_size + part * blocks_per_partition
    last_block = tl.minimum(first_block + blocks_per_partition, (seq_len + block_size - 1) // block_size)

    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, BLOCK_D], tl.float32)
    for logical in range(first_block, last_block):
        block_id = tl.load(BLOCK_TABLES + seq * stride_bt + logical).to(tl.int64)
        positions = logical * block_size + slots
        valid = (slots < block_size) & (positions >= start) & (positions < seq_len)  # never empty here
        kv_mask = valid[:, None] & dim_mask[None, :]
        k = tl.load(K_CACHE + block_id * stride_kb + slots[:, None] * stride_kt + kv_head * stride_kh + dims[None, :],
                    mask=kv_mask, other=0.0).to(tl.float32)  # [N, D]
        v = tl.load(V_CACHE + block_id * stride_vb + slots[:, None] * stride_vt + kv_head * stride_vh + dims[None, :],
                    mask=kv_mask, other=0.0).to(tl.float32)
        scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2)  # [G, N]
        scores = tl.where(valid[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        m_i = m_new

    if IS_SPLIT:  # partial results [B, H, P] (+ [D]) for the merge kernel; an empty partition has l = 0
        part_row = (seq * tl.num_programs(1) * GROUP + heads) * num_partitions + part
        tl.store(M_PART + part_row, m_i, mask=head_mask)
        tl.store(L_PART + part_row, l_i, mask=head_mask)
        tl.store(ACC_PART + part_row[:, None] * head_dim + dims[None, :], acc, mask=head_mask[:, None] & dim_mask[None, :])
    else:
        out = acc / l_i[:, None]
        tl.store(OUT + seq * stride_ob + heads[:, None] * stride_oh + dims[None, :],
                 out.to(OUT.dtype.element_ty), mask=head_mask[:, None] & dim_mask[None, :])


@triton.jit
def _merge_partitions_kernel(
    M_PART, L_PART, ACC_PART, OUT, stride_ob, stride_oh, num_heads, head_dim, num_partitions,
    BLOCK_P: tl.constexpr, BLOCK_D: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    parts = tl.arange(0, BLOCK_P)
    dims = tl.arange(0, BLOCK_D)
    part_mask = parts < num_partitions
    rows = (seq * num_heads + head) * num_partitions + parts
    m = tl.load(M_PART + rows, mask=part_mask, other=float("-inf"))
    l = tl.load(L_PART + rows, mask=part_mask, other=0.0)
    m_max = tl.max(m, axis=0)
    weight = tl.where(l > 0, tl.exp(m - m_max), 0.0)  # empty partitions (m = -inf) weigh nothing
    acc = tl.load(ACC_PART + rows[:, None] * head_dim + dims[None, :],
                  mask=part_mask[:, None] & (dims < head_dim)[None, :], other=0.0)
    out = tl.sum(acc * weight[:, None], axis=0) / tl.sum(l * weight, axis=0)
    tl.store(OUT + seq * stride_ob + head * stride_oh + dims, out.to(OUT.dtype.element_ty), mask=dims < head_dim)


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: list[int],
    *,
    scale: float,
    sliding_window: int | None = None,
    partition_tokens: int = PARTITION_TOKENS,
) -> torch.Tensor:
    """Attention of one new token per sequence over its cached keys and values.

    Sequence b's query sits at position seq_lens[b] - 1 and sees positions [0, seq_lens[b]), or the last
    W of them with a sliding window W; its own key and value must already be in the cache.

    Args:
        q: [B, H, D] queries (last dimension contiguous), H a multiple of K.
        k_cache, v_cache: [num_blocks, block_size, K, D], same dtype as q.
        block_tables: [B, max_blocks] int32/int64 physical block ids; entries past a sequence's last block
            (and, with a window, before its first visible block) are never read.
        seq_lens: B sequence lengths (each >= 1, within max_blocks * block_size).
        scale: multiplier of q.k, usually D ** -0.5.
        sliding_window: W >= 1, or None for global attention.
        partition_tokens: keys one program reads before a sequence is split across programs (a multiple of
            block_size is used).
    Returns:
        [B, H, D] in q's dtype.
    Raises:
        ValueError: shapes, dtypes or devices that do not fit together, or lengths out of range.
    """
    check_tensor("q", q, dim=3)
    check_tensor("k_cache", k_cache, dim=4)
    check_tensor("v_cache", v_cache, dim=4)
    check_tensor("block_tables", block_tables, dim=2, dtypes=(torch.int32, torch.int64))
    num_seqs, num_heads, head_dim = q.shape
    num_blocks, block_size, num_kv_heads, cache_dim = k_cache.shape
    if v_cache.shape != k_cache.shape or k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise ValueError(f"k_cache {tuple(k_cache.shape)} {k_cache.dtype} and v_cache {tuple(v_cache.shape)} "
                         f"{v_cache.dtype} must match each other and q's dtype {q.dtype}")
    if cache_dim != head_dim or num_heads % num_kv_heads:
        raise ValueError(f"q [B, H, D] = {tuple(q.shape)} does not fit a cache of {num_kv_heads} KV heads of size {cache_dim}")
    if block_tables.shape[0] != num_seqs or len(seq_lens) != num_seqs:
        raise ValueError(f"{num_seqs} queries, {block_tables.shape[0]} block tables, {len(seq_lens)} seq_lens")
    max_len = max(seq_lens, default=1)
    if min(seq_lens, default=1) < 1 or max_len > block_tables.shape[1] * block_size:
        raise ValueError(f"seq_lens must be in [1, {block_tables.shape[1] * block_size}] (block table capacity)")
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"sliding_window must be >= 1 or None, got {sliding_window}")
    check_devices(q=q, k_cache=k_cache, v_cache=v_cache, block_tables=block_tables)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if num_seqs == 0:
        return out

    # The most blocks one sequence reads: its visible span may straddle one more block than it fills.
    visible = max_len if sliding_window is None else min(max_len, sliding_window)
    max_blocks_read = min(-(-max_len // block_size), -(-visible // block_size) + 1)
    blocks_per_partition = max(1, partition_tokens // block_size)
    num_partitions = -(-max_blocks_read // blocks_per_partition)
    group = num_heads // num_kv_heads
    block_d = next_power_of_2(head_dim)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=q.device)
    is_split = num_partitions > 1
    if is_split:
        m_part = torch.empty(num_seqs, num_heads, num_partitions, dtype=torch.float32, device=q.device)
        l_part = torch.empty_like(m_part)
        acc_part = torch.empty(num_seqs, num_heads, num_partitions, head_dim, dtype=torch.float32, device=q.device)
    else:
        m_part = l_part = acc_part = out  # unused by the kernel
    _paged_decode_kernel[(num_seqs, num_kv_heads, num_partitions)](
        q, k_cache, v_cache, block_tables, lens, out, m_part, l_part, acc_part,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), block_tables.stride(0), out.stride(0), out.stride(1),
        scale, NO_WINDOW if sliding_window is None else sliding_window, head_dim, block_size, blocks_per_partition, num_partitions,
        GROUP=group, GROUP_PAD=next_power_of_2(group), BLOCK_N=next_power_of_2(block_size), BLOCK_D=block_d,
        IS_SPLIT=is_split,
    )
    if is_split:
        _merge_partitions_kernel[(num_seqs, num_heads)](
            m_part, l_part, acc_part, out, out.stride(0), out.stride(1), num_heads, head_dim, num_partitions,
            BLOCK_P=next_power_of_2(num_partitions), BLOCK_D=block_d,
        )
    return out


def paged_attention(
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
    """The contract of `kernels.ref.ref_paged_attention` (dispatch op "paged_attention").

    A decode-only batch (every query length 1) runs `paged_decode_attention`; a batch with a prefill chunk
    runs the reference.

    Args:
        q: [N, H, D], N = sum(query_lens); k_cache, v_cache: [num_blocks, block_size, K, D];
        block_tables: [B, max_blocks]; seq_lens, query_lens: B ints; scale; sliding_window: W or None.
    Returns:
        [N, H, D].
    Raises:
        ValueError: as `paged_decode_attention`.
    """
    if any(n != 1 for n in query_lens):
        return ref.ref_paged_attention(q, k_cache, v_cache, block_tables, seq_lens, query_lens,
                                       scale=scale, sliding_window=sliding_window)
    return paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale=scale, sliding_window=sliding_window)
