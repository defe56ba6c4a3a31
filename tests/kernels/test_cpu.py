"""The fast CPU kernels (`kernels/cpu.py`, `kernels/cpu_linear.py`) against the references, on odd shapes, mixed batches and
sliding windows, in fp32 and bf16 (tolerances beside each dtype)."""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels import cpu, cpu_linear, ref
from kernels.candidates import provider_variants
from kernels.native import has_avx512

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
    found = {(v.op, v.name): v for v in provider_variants("cpu")}
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 3, 4, 7, 16, 33])
@pytest.mark.parametrize("bias", [False, True])
def test_kn_linear_matches_reference(dtype, rows, bias):
    torch.manual_seed(rows)
    weight = (torch.randn(97, 45) * 0.1).to(dtype)
    b = torch.randn(97).to(dtype) if bias else None
    x = torch.randn(2, rows, 45).to(dtype)   # leading dimensions kept
    expected = ref.ref_linear(x.float(), weight.float(), None if b is None else b.float())
    out = cpu_linear.kn_linear(x, weight, b)
    assert out.dtype == dtype and out.shape == (2, rows, 97)
    torch.testing.assert_close(out.float(), expected, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


@pytest.mark.skipif(not cpu_linear.has_mkl(), reason="this torch build has no MKL")
@pytest.mark.parametrize("rows", [1, 4, 7, 16, 33])
def test_mkl_packed_linear_matches_reference_and_packs_once(rows):
    torch.manual_seed(rows)
    weight, bias = torch.randn(97, 45) * 0.1, torch.randn(97)
    x = torch.randn(rows, 45)
    packs = cpu_linear.MKL_PACKS
    out = cpu_linear.mkl_packed_linear(x, weight, bias)
    torch.testing.assert_close(out, ref.ref_linear(x, weight, bias), atol=TOLERANCE[torch.float32], rtol=TOLERANCE[torch.float32])
    before = packs.num_packs
    cpu_linear.mkl_packed_linear(x[:1], weight)
    assert packs.num_packs == before   # the same weight object: packed once, for any row count
    with torch.no_grad():
        weight.mul_(2.0)                # an in-place change is repacked
    torch.testing.assert_close(cpu_linear.mkl_packed_linear(x, weight, bias), ref.ref_linear(x, weight, bias), atol=1e-5, rtol=1e-5)
    assert packs.num_packs == before + 1
    with pytest.raises(TypeError, match="float32 only"):
        cpu_linear.mkl_packed_linear(x.bfloat16(), weight.bfloat16())


needs_avx512 = pytest.mark.skipif(not has_avx512(), reason="rows_linear needs an AVX-512 CPU")


@needs_avx512
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 33])
@pytest.mark.parametrize("n, k", [(1, 1), (3, 15), (4, 16), (5, 17), (97, 45), (130, 577)])
def test_rows_linear_matches_a_float64_reference(rows, n, k):
    # N not a multiple of the 4-row weight tile, K not a multiple of the 16-float vector (masked tail)
    torch.manual_seed(rows * 1000 + n + k)
    weight, bias, x = torch.randn(n, k), torch.randn(n), torch.randn(rows, k)
    expected = (x.double() @ weight.double().T + bias.double()).float()
    out = cpu_linear.rows_linear(x, weight, bias)
    assert out.dtype == torch.float32 and out.shape == (rows, n)
    torch.testing.assert_close(out, expected, atol=1e-5 * k ** 0.5, rtol=1e-5)


@needs_avx512
def test_rows_linear_rows_do_not_depend_on_their_batch():
    # each output element is one dot product in a fixed order: a row alone equals the same row in a batch
    torch.manual_seed(0)
    weight, x = torch.randn(203, 577), torch.randn(13, 577)
    batched = cpu_linear.rows_linear(x, weight)
    for i in (0, 3, 4, 12):
        assert torch.equal(cpu_linear.rows_linear(x[i : i + 1], weight), batched[i : i + 1])
    assert torch.equal(cpu_linear.rows_linear(x[4:9], weight), batched[4:9])


@needs_avx512
def test_the_rows_candidate_is_f_linear_below_four_rows_and_rows_linear_from_four(monkeypatch):
    torch.manual_seed(2)
    weight, bias = torch.randn(203, 577), torch.randn(203)
    for rows in (1, 2, 3):   # a bucket spans 3 and 4 rows: MKL's matrix-vector path below 4
        x = torch.randn(rows, 577)
        assert torch.equal(cpu_linear.few_rows_linear(x, weight, bias), torch.nn.functional.linear(x, weight, bias))
    for rows in (4, 9):
        x = torch.randn(2, rows, 577)
        assert torch.equal(cpu_linear.few_rows_linear(x, weight, bias), cpu_linear.rows_linear(x, weight, bias))
    x = torch.randn(5, 577)
    monkeypatch.setattr(cpu_linear, "load_rows_linear", lambda: None)   # a stored winner where the kernel cannot build
    assert torch.equal(cpu_linear.few_rows_linear(x, weight, bias), torch.nn.functional.linear(x, weight, bias))
    monkeypatch.undo()
    gate_up, down, x = torch.randn(2 * 37, 45), torch.randn(45, 37), torch.randn(6, 45)
    torch.testing.assert_close(cpu_linear.few_rows_gated_mlp(x, gate_up, down, "silu"), ref.ref_gated_mlp(x, gate_up, down, "silu"),
                               atol=1e-4, rtol=1e-5)


@needs_avx512
def test_rows_linear_shapes_layouts_and_errors():
    torch.manual_seed(1)
    weight = torch.randn(97, 45)
    x = torch.randn(2, 3, 45)                      # leading dimensions kept
    torch.testing.assert_close(cpu_linear.rows_linear(x, weight), ref.ref_linear(x, weight), atol=1e-5, rtol=1e-5)
    wide = torch.randn(5, 90)[:, ::2]              # a non-contiguous input
    torch.testing.assert_close(cpu_linear.rows_linear(wide, weight), ref.ref_linear(wide, weight), atol=1e-5, rtol=1e-5)
    assert cpu_linear.rows_linear(torch.randn(0, 45), weight).shape == (0, 97)
    empty_k = torch.randn(6, 0)
    assert torch.equal(cpu_linear.rows_linear(empty_k, torch.randn(5, 0)), torch.zeros(6, 5))   # as F.linear: zeros
    with pytest.raises(TypeError, match="float32 only"):
        cpu_linear.rows_linear(x.bfloat16(), weight.bfloat16())
    with pytest.raises(RuntimeError, match="rows_linear needs x"):
        cpu_linear.rows_linear(torch.randn(3, 44), weight)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("rows", [1, 5, 16])
def test_gated_mlp_variants_match_reference(dtype, activation, rows):
    torch.manual_seed(rows)
    gate_up, down = (torch.randn(2 * 37, 45) * 0.1).to(dtype), (torch.randn(45, 37) * 0.1).to(dtype)
    x = torch.randn(rows, 45).to(dtype)
    expected = ref.ref_gated_mlp(x.float(), gate_up.float(), down.float(), activation)
    fns = [cpu_linear.kn_gated_mlp] + ([cpu_linear.mkl_packed_gated_mlp] if dtype == torch.float32 and cpu_linear.has_mkl() else [])
    fns += [cpu_linear.rows_gated_mlp] if dtype == torch.float32 and has_avx512() else []
    for fn in fns:
        out = fn(x, gate_up, down, activation)
        assert out.dtype == dtype and out.shape == (rows, 45)
        torch.testing.assert_close(out.float(), expected, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


def test_linear_variants_are_tuner_candidates_not_the_default():
    found = {(v.op, v.name): v for v in provider_variants("cpu")}
    assert found[("linear", "kn")].fn is cpu_linear.kn_linear and not found[("linear", "kn")].lossy
    assert found[("linear", "mkl-packed")].dtypes == (torch.float32,)
    assert found[("gated_mlp", "kn")].fn is cpu_linear.kn_gated_mlp
    assert found[("gated_mlp", "mkl-packed")].dtypes == (torch.float32,)
    assert found[("linear", "rows-avx512")].fn is cpu_linear.few_rows_linear and found[("linear", "rows-avx512")].dtypes == (torch.float32,)
    assert found[("gated_mlp", "rows-avx512")].fn is cpu_linear.few_rows_gated_mlp
    assert kernels.registered("linear") is ref.ref_linear and kernels.registered("gated_mlp") is ref.ref_gated_mlp
