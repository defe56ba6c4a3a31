"""Parity of the Triton paged decode attention with `ref_paged_attention`.

The cache the kernel reads is poisoned with NaN everywhere a query must not look (positions past a
sequence's length, before its sliding window, and blocks no table names), so reading one wrong slot fails
the test; the reference reads a clean copy with the same visible values.
"""

from __future__ import annotations

import pytest
import torch

from kernels import ref
from tests.kernels.triton_devices import DEVICES, DTYPES, assert_close

from kernels.triton import paged_attention as triton_attention  # noqa: E402  (after TRITON_INTERPRET is set)

# (atol, rtol) against the float32 reference on the same inputs.
TOLERANCE = {
    torch.float32: (1e-5, 1e-5),  # online softmax and summation order
    torch.bfloat16: (2e-2, 2e-2),  # one bfloat16 rounding of the output; scores and weights stay float32
}
BLOCK_SIZE = 16
SEQ_LENS = [1, 17, 45]


def _paged_batch(heads, kv_heads, head_dim, seq_lens, window, seed=0):
    """q [B, H, D], a clean and a NaN-poisoned cache [num_blocks, 16, K, D], shuffled block tables [B, 4]."""
    gen = torch.Generator().manual_seed(seed)
    num_blocks = 14
    blocks = torch.randperm(num_blocks, generator=gen).tolist()
    block_tables = torch.zeros(len(seq_lens), 4, dtype=torch.int64)
    clean = torch.randn(2, num_blocks, BLOCK_SIZE, kv_heads, head_dim, generator=gen)
    poisoned = torch.full_like(clean, float("nan"))
    for b, length in enumerate(seq_lens):
        for logical in range(-(-length // BLOCK_SIZE)):
            block_tables[b, logical] = blocks.pop()
        start = 0 if window is None else max(0, length - window)
        for pos in range(start, length):
            block, offset = block_tables[b, pos // BLOCK_SIZE], pos % BLOCK_SIZE
            poisoned[:, block, offset] = clean[:, block, offset]
    q = torch.randn(len(seq_lens), heads, head_dim, generator=gen)
    return q, clean, poisoned, block_tables


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(9, 3, 24), (4, 1, 40)])
@pytest.mark.parametrize("window", [None, 20])
@pytest.mark.parametrize("partition_tokens", [512, 16], ids=["whole", "split"])
def test_paged_decode(device, dtype, heads, kv_heads, head_dim, window, partition_tokens):
    q, clean, poisoned, tables = _paged_batch(heads, kv_heads, head_dim, SEQ_LENS, window)
    out = triton_attention.paged_decode_attention(
        q.to(device, dtype), poisoned[0].to(device, dtype), poisoned[1].to(device, dtype), tables.to(device), SEQ_LENS,
        scale=head_dim**-0.5, sliding_window=window, partition_tokens=partition_tokens,
    )
    assert out.shape == q.shape and out.dtype == dtype
    # The reference on the values the kernel saw (rounded to dtype), in float32.
    k, v = clean[0].to(dtype).float(), clean[1].to(dtype).float()
    expected = ref.ref_paged_attention(q.to(dtype).float(), k, v, tables, SEQ_LENS, [1, 1, 1],
                                       scale=head_dim**-0.5, sliding_window=window)
    assert_close(out, expected, TOLERANCE, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_paged_attention_contract_falls_back_for_prefill(device):
    q, clean, _, tables = _paged_batch(9, 3, 24, SEQ_LENS, None, seed=1)
    q = torch.cat([q[:1], torch.randn(3, 9, 24), q[2:]])  # sequence 1 brings a 3-token prefill chunk
    args = (clean[0].to(device), clean[1].to(device), tables.to(device), SEQ_LENS)
    out = triton_attention.paged_attention(q.to(device), *args, [1, 3, 1], scale=0.2, sliding_window=None)
    expected = ref.ref_paged_attention(q, clean[0], clean[1], tables, SEQ_LENS, [1, 3, 1], scale=0.2)
    assert_close(out, expected, TOLERANCE, torch.float32)
    decode = triton_attention.paged_attention(q[[0, 3, 4]].to(device), *args, [1, 1, 1], scale=0.2)
    assert_close(decode, ref.ref_paged_attention(q[[0, 3, 4]], clean[0], clean[1], tables, SEQ_LENS, [1, 1, 1], scale=0.2),
                 TOLERANCE, torch.float32)


@pytest.mark.parametrize("device", DEVICES)
def test_paged_decode_rejects_bad_inputs(device):
    q, clean, _, tables = _paged_batch(9, 3, 24, SEQ_LENS, None)
    q, k, v, tables = q.to(device), clean[0].to(device), clean[1].to(device), tables.to(device)
    with pytest.raises(ValueError, match="does not fit a cache"):
        triton_attention.paged_decode_attention(q[:, :8], k, v, tables, SEQ_LENS, scale=1.0)
    with pytest.raises(ValueError, match="block table capacity"):
        triton_attention.paged_decode_attention(q, k, v, tables, [1, 17, 65], scale=1.0)
    with pytest.raises(ValueError, match="must match"):
        triton_attention.paged_decode_attention(q, k, v.half(), tables, SEQ_LENS, scale=1.0)
    with pytest.raises(ValueError, match="3 queries, 2 block tables"):
        triton_attention.paged_decode_attention(q, k, v, tables[:2], SEQ_LENS, scale=1.0)
    with pytest.raises(ValueError, match="sliding_window"):
        triton_attention.paged_decode_attention(q, k, v, tables, SEQ_LENS, scale=1.0, sliding_window=0)
