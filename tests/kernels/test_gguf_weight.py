"""`GGUFWeight` on GGUF blocks against dequantize-then-matmul, for every block type, on shapes that are not
powers of two; fused weights of mixed types; the embedding lookup; row permutation; the dispatch route.

The expected values come from the loader's dequantizer (`serving.loader.dequant`), which shares no code with the
reference module (`kernels.gguf_ref`, the `gguf` package's numpy decoding) nor with the C++ module: with the C++
module built here, these tests check it.

    .venv/bin/python -m pytest -q tests/kernels/test_gguf_weight.py
"""

from __future__ import annotations

import pytest
import torch

from kernels import dispatch, gguf_ref
from kernels.gguf_weight import GGUFWeight, backend, cat_weights
from kernels.ref import ref_gated_mlp
from serving.loader.dequant import dequantize
from tests.kernels.gguf_blocks import K_QUANTS, LEGACY, quantized_blocks, random_blocks

TYPES = [*LEGACY, *K_QUANTS]
# float32 results against a float64 matmul of the same weights: relative to the largest output (sums of K terms)
RTOL_F32 = 1e-5
# a bf16 input is cast to float32, the product cast back: one bf16 rounding (8 bits of mantissa)
RTOL_BF16 = 2**-8


def cols_for(ggml_type: int) -> int:
    """A row width that is not a power of two: 3 blocks of 256 (K-quants) or 7 blocks of 32."""
    return 768 if ggml_type in K_QUANTS else 224


def exact(blocks: torch.Tensor, ggml_type: int) -> torch.Tensor:
    """The weight [N, K] the blocks hold, float32, decoded by the loader's dequantizer."""
    rows, cols = blocks.shape[0], cols_for(ggml_type)
    return dequantize(blocks.numpy(), ggml_type, (rows, cols))


def assert_close_rel(got: torch.Tensor, want: torch.Tensor, rtol: float) -> None:
    scale = float(want.abs().max()) or 1.0
    torch.testing.assert_close(got.double(), want.double(), rtol=0, atol=rtol * scale)


@pytest.mark.parametrize("ggml_type", TYPES)
def test_dequantize_equals_the_loader(ggml_type):
    blocks = random_blocks(ggml_type, 11, cols_for(ggml_type), seed=ggml_type)
    w = GGUFWeight.from_blocks(blocks, ggml_type, cols_for(ggml_type))
    assert w.shape == (11, cols_for(ggml_type)) and w.nbytes == blocks.numel() and w.dtype == torch.float32
    assert torch.equal(w.dequantize(), exact(blocks, ggml_type))


@pytest.mark.parametrize("ggml_type", TYPES)
@pytest.mark.parametrize("rows", [1, 5])
def test_linear_equals_dequantize_then_matmul(ggml_type, rows):
    K = cols_for(ggml_type)
    blocks = random_blocks(ggml_type, 13, K, seed=100 + ggml_type)
    w = GGUFWeight.from_blocks(blocks, ggml_type, K)
    gen = torch.Generator().manual_seed(rows)
    x, bias = torch.randn(rows, K, generator=gen), torch.randn(13, generator=gen)
    want = x.double() @ exact(blocks, ggml_type).double().T + bias.double()
    assert_close_rel(w.linear(x, bias), want, RTOL_F32)
    assert_close_rel(dispatch("linear", x, w), want - bias.double(), RTOL_F32)


@pytest.mark.parametrize("ggml_type", LEGACY)
def test_linear_on_weights_the_gguf_package_quantized(ggml_type):
    weight = torch.randn(9, 96, generator=torch.Generator().manual_seed(ggml_type)) * 0.1
    blocks = quantized_blocks(ggml_type, weight)
    w = GGUFWeight.from_blocks(blocks, ggml_type, 96)
    x = torch.randn(3, 96, generator=torch.Generator().manual_seed(7))
    deq = dequantize(blocks.numpy(), ggml_type, (9, 96))
    assert_close_rel(w.linear(x), x.double() @ deq.double().T, RTOL_F32)
    # the blocks do hold the weight: within one 4-bit step (max |w| of a block / 7) of every value
    assert float((deq - weight).abs().max()) < float(weight.abs().max()) / 7


def test_linear_keeps_leading_dims_and_the_input_dtype():
    blocks = random_blocks(12, 6, 512, seed=1)
    w = GGUFWeight.from_blocks(blocks, 12, 512)
    x = torch.randn(2, 3, 512, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    got = w.linear(x)
    assert got.shape == (2, 3, 6) and got.dtype == torch.bfloat16
    want = x.double() @ dequantize(blocks.numpy(), 12, (6, 512)).double().T
    assert_close_rel(got, want, RTOL_BF16)


def test_cat_of_mixed_types_merges_adjacent_segments_and_keeps_the_order():
    """q and k in Q4_K, v in Q6_K (as in the Qwen files): two segments, outputs side by side."""
    q, k, v = random_blocks(12, 7, 512, seed=3), random_blocks(12, 3, 512, seed=4), random_blocks(14, 3, 512, seed=5)
    qkv = cat_weights([GGUFWeight.from_blocks(q, 12, 512), GGUFWeight.from_blocks(k, 12, 512),
                       GGUFWeight.from_blocks(v, 14, 512)])
    assert qkv.ggml_types == [12, 14] and qkv.shape == (13, 512) and qkv.nbytes == q.numel() + k.numel() + v.numel()
    full = torch.cat([dequantize(b.numpy(), t, (b.shape[0], 512)) for b, t in ((q, 12), (k, 12), (v, 14))])
    assert torch.equal(qkv.dequantize(), full)
    x, bias = torch.randn(4, 512, generator=torch.Generator().manual_seed(6)), torch.randn(13)
    assert_close_rel(qkv.linear(x, bias), x.double() @ full.double().T + bias.double(), RTOL_F32)


def test_cat_takes_a_float_weight_as_an_f32_segment():
    packed, dense = random_blocks(8, 4, 64, seed=8), torch.randn(3, 64, generator=torch.Generator().manual_seed(9))
    fused = cat_weights([GGUFWeight.from_blocks(packed, 8, 64), dense])
    assert fused.ggml_types == [8, 0]
    assert torch.equal(fused.dequantize(), torch.cat([dequantize(packed.numpy(), 8, (4, 64)), dense]))


def test_cat_refuses_different_widths():
    with pytest.raises(ValueError, match="different widths"):
        cat_weights([GGUFWeight.from_blocks(random_blocks(8, 2, 64, 0), 8, 64),
                     GGUFWeight.from_blocks(random_blocks(8, 2, 96, 0), 8, 96)])


@pytest.mark.parametrize("ggml_type", [6, 12])
def test_embedding_rows(ggml_type):
    K = cols_for(ggml_type)
    blocks = random_blocks(ggml_type, 29, K, seed=10)
    w = GGUFWeight.from_blocks(blocks, ggml_type, K)
    ids = torch.tensor([[3, 0, 28], [3, 17, 5]])
    got = w.embedding(ids)
    assert got.shape == (2, 3, K) and got.dtype == torch.float32
    assert torch.equal(got, exact(blocks, ggml_type)[ids])
    with pytest.raises(IndexError):
        w.embedding(torch.tensor([29]))


def test_embedding_across_segments():
    a, b = random_blocks(8, 5, 64, seed=11), random_blocks(2, 4, 64, seed=12)
    w = cat_weights([GGUFWeight.from_blocks(a, 8, 64), GGUFWeight.from_blocks(b, 2, 64)])
    ids = torch.tensor([8, 0, 4, 5, 6])
    full = torch.cat([dequantize(a.numpy(), 8, (5, 64)), dequantize(b.numpy(), 2, (4, 64))])
    assert torch.equal(w.embedding(ids), full[ids])


def test_take_rows_moves_rows_with_their_blocks():
    blocks = random_blocks(13, 8, 256, seed=13)
    w = GGUFWeight.from_blocks(blocks, 13, 256)
    order = torch.tensor([5, 2, 7, 0, 1, 6, 3, 4])
    assert torch.equal(w.take_rows(order).dequantize(), w.dequantize()[order])


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
def test_gated_mlp_route_equals_the_reference_on_dequantized_weights(activation):
    gate_up = GGUFWeight.from_blocks(random_blocks(12, 2 * 96, 256, seed=14), 12, 256)
    down = GGUFWeight.from_blocks(random_blocks(8, 256, 96, seed=15), 8, 96)
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(16))
    want = ref_gated_mlp(x.double(), gate_up.dequantize().double(), down.dequantize().double(), activation)
    assert_close_rel(dispatch("gated_mlp", x, gate_up, down, activation), want, RTOL_F32)


def test_bad_blocks_are_refused():
    with pytest.raises(ValueError, match="row"):
        GGUFWeight.from_blocks(torch.zeros(2, 100, dtype=torch.uint8), 12, 256)
    with pytest.raises(ValueError, match="multiple"):
        gguf_ref.row_bytes(12, 100)
    with pytest.raises(ValueError, match="not supported"):
        gguf_ref.row_bytes(10, 256)  # Q2_K


def test_the_reference_and_the_backend_agree():
    """The backend in use (the C++ module where built) against the reference module, call by call."""
    blocks, x = random_blocks(14, 10, 512, seed=17), torch.randn(4, 512, generator=torch.Generator().manual_seed(18))
    mod, ids = backend(), torch.tensor([9, 0, 9])
    assert torch.equal(mod.dequantize(blocks, 14, 512), gguf_ref.dequantize(blocks, 14, 512))
    assert torch.equal(mod.rows(blocks, 14, 512, ids), gguf_ref.rows(blocks, 14, 512, ids))
    assert_close_rel(mod.linear(x, [blocks], [14], 512, None), gguf_ref.linear(x, [blocks], [14], 512, None), RTOL_F32)
