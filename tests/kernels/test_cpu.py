"""The fast CPU kernels (`kernels/cpu.py`) against the references, on odd shapes, mixed batches and
sliding windows, in fp32 and bf16 (tolerances beside each dtype)."""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels import cpu, ref

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("q_start,num_tokens,window", [(0, 7, None), (5, 3, None), (9, 1, None), (0, 11, 4), (13, 2, 5)])
def test_sdpa_attention_matches_reference(dtype, q_start, num_tokens, window):
    torch.manual_seed(q_start + num_tokens)
    heads, kv_heads, dim = 6, 2, 9
    q = torch.randn(num_tokens, heads, dim, dtype=dtype)
    k = torch.randn(q_start + num_tokens, kv_heads, dim, dtype=dtype)
    v = torch.randn(q_start + num_tokens, kv_heads, dim, dtype=dtype)
    args = dict(scale=dim**-0.5, q_start=q_start, sliding_window=window)
    expected = ref.ref_attention(q.float(), k.float(), v.float(), **args)
    out = cpu.sdpa_attention(q, k, v, **args)
    assert out.dtype == dtype and out.shape == q.shape
    torch.testing.assert_close(out.float(), expected, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


def _paged_batch(seq_lens, query_lens, *, block_size, kv_heads, heads, dim, dtype, seed):
    """Random K/V written into shuffled physical blocks, plus the contiguous K/V of each sequence."""
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(blocks_per_seq) + 3
    k_cache = torch.randn(num_blocks, block_size, kv_heads, dim, generator=gen).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, dim, generator=gen).to(dtype)
    physical = torch.randperm(num_blocks, generator=gen)
    tables = torch.zeros(len(seq_lens), max(blocks_per_seq), dtype=torch.int64)
    contiguous, used = [], 0
    for b, (s, n) in enumerate(zip(seq_lens, blocks_per_seq)):
        tables[b, :n] = physical[used : used + n]
        used += n
        contiguous.append((k_cache[tables[b, :n]].flatten(0, 1)[:s], v_cache[tables[b, :n]].flatten(0, 1)[:s]))
    q = torch.randn(sum(query_lens), heads, dim, generator=gen).to(dtype)
    return q, k_cache, v_cache, tables, contiguous


# (seq_lens, query_lens): decode only, prefill only, and mixed batches with chunks mid-prompt.
BATCHES = [
    ([37, 5, 64, 1], [1, 1, 1, 1]),
    ([45, 60, 38], [1, 1, 1]),
    ([1], [1]),
    ([29], [1]),
    ([64], [1]),
    ([23], [23]),
    ([40, 17, 33, 9], [1, 17, 6, 1]),
    ([70, 3, 51], [12, 1, 1]),
    # speculative verify steps (k + 1 tokens per sequence, padded into one call) beside decode and long prefill
    ([40, 17, 33, 9], [5, 3, 1, 6]),
    ([26], [4]),
    ([50, 41, 64], [1, 30, 7]),
    ([16, 20], [16, 17]),
    ([40, 30, 12, 25], [4, 20, 9, 1]),
]


@pytest.mark.parametrize("paged", [cpu.sdpa_paged_attention, cpu.bmm_paged_attention], ids=["sdpa", "bmm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [None, 7, 20])
@pytest.mark.parametrize("seq_lens,query_lens", BATCHES)
def test_paged_attention_matches_reference(paged, dtype, window, seq_lens, query_lens):
    block_size, heads, kv_heads, dim = 8, 6, 2, 12
    q, k_cache, v_cache, tables, contiguous = _paged_batch(
        seq_lens, query_lens, block_size=block_size, kv_heads=kv_heads, heads=heads, dim=dim, dtype=dtype, seed=len(seq_lens)
    )
    args = dict(scale=dim**-0.5, sliding_window=window)
    out = paged(q, k_cache, v_cache, tables, seq_lens, query_lens, **args)
    expected = ref.ref_paged_attention(q.float(), k_cache.float(), v_cache.float(), tables, seq_lens, query_lens, **args)
    assert out.dtype == dtype and out.shape == q.shape
    torch.testing.assert_close(out.float(), expected, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])
    # The paged reference itself equals contiguous attention per sequence.
    start = 0
    for (k, v), s, n in zip(contiguous, seq_lens, query_lens):
        alone = ref.ref_attention(q[start : start + n].float(), k.float(), v.float(), scale=dim**-0.5, q_start=s - n, sliding_window=window)
        torch.testing.assert_close(expected[start : start + n], alone, atol=1e-5, rtol=1e-5)
        start += n


def test_bmm_decode_is_a_tuner_candidate_not_the_default():
    found = {(v.op, v.name): v for v in cpu.cpu_variants()}
    assert found[("paged_attention", "bmm-decode")].fn is cpu.bmm_paged_attention
    assert not found[("paged_attention", "bmm-decode")].lossy
    assert kernels.registered("paged_attention") is cpu.sdpa_paged_attention


def test_defaults_are_the_cpu_variants_and_references_can_be_installed():
    try:
        assert kernels.registered("paged_attention") is cpu.sdpa_paged_attention
        kernels.use_references()
        assert kernels.registered("paged_attention") is ref.ref_paged_attention
        assert kernels.registered("attention") is ref.ref_attention
    finally:
        kernels.reset()
    assert kernels.registered("attention") is cpu.sdpa_attention


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("offset", [0.0, 1.0])
@pytest.mark.parametrize("shape", [(1, 7), (5, 3, 22)])
def test_fused_rms_norm_matches_reference(dtype, offset, shape):
    torch.manual_seed(len(shape))
    x = (torch.randn(*shape) * 3).to(dtype)
    weight = torch.randn(shape[-1]).to(dtype)
    out = cpu.fused_rms_norm(x, weight, 1e-6, offset=offset)
    expected = ref.ref_rms_norm(x, weight, 1e-6, offset=offset)
    assert out.dtype == dtype and out.shape == x.shape
    torch.testing.assert_close(out.float(), expected.float(), atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])
