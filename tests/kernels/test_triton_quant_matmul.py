"""Parity of the Triton Q8_0/Q4_0 matmul with `ref_ggml_linear` (the same blocks, dequantized), and of
the quantized "linear" variant with the float weight's `ref_linear` within the quantization tolerance."""

from __future__ import annotations

import gguf
import pytest
import torch

from kernels import ref
from kernels.triton import Q4_0, Q8_0
from tests.kernels.triton_devices import DEVICES, DTYPES, assert_close

from kernels.triton import quant_matmul  # noqa: E402  (after TRITON_INTERPRET is set)

# (atol, rtol) against the reference on the same quantized blocks, in float32.
TOLERANCE = {
    torch.float32: (1e-5, 1e-5),  # summation order over K
    torch.bfloat16: (2e-2, 2e-2),  # the dequantized weight rounded to bfloat16 (as the reference does), float32 sums
}
QTYPES = ["q8_0", "q4_0"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("num_rows,num_in,has_bias", [(1, 96, False), (5, 160, True), (20, 96, False)])
def test_quant_matmul(device, dtype, qtype, num_rows, num_in, has_bias):
    # K = 96 (three blocks: a partial 64-wide K tile) and 160 (five); N = 40, two and a bit of 32-wide N tiles;
    # 20 rows span two 16-row M tiles.
    gen = torch.Generator().manual_seed(num_rows)
    x, weight = torch.randn(num_rows, num_in, generator=gen), torch.randn(40, num_in, generator=gen) / num_in**0.5
    bias = torch.randn(40, generator=gen) if has_bias else None
    qweight = quant_matmul.quantize(weight, qtype)
    on_device = quant_matmul.QuantizedWeight(qtype, qweight.scales.to(device), qweight.quants.to(device))
    out = quant_matmul.quant_matmul(x.to(device, dtype), on_device, bias.to(device, dtype) if has_bias else None)
    assert out.shape == (num_rows, 40) and out.dtype == dtype
    x_seen = x.to(dtype).float()
    bias_seen = bias.to(dtype).float() if has_bias else None
    expected = ref.ref_ggml_linear(x_seen, qweight.scales, qweight.quants, qtype, bias_seen)
    assert_close(out, expected, TOLERANCE, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("qtype,tolerance", [("q8_0", Q8_0), ("q4_0", Q4_0)])
def test_quantized_linear_variant_within_its_tolerance(device, qtype, tolerance):
    gen = torch.Generator().manual_seed(7)
    x, weight = torch.randn(3, 192, generator=gen), torch.randn(72, 192, generator=gen) / 192**0.5
    linear = quant_matmul.QuantizedLinear(qtype)
    weight_on_device = weight.clone().to(device)
    out = linear(x.to(device), weight_on_device)
    assert_close(out, ref.ref_linear(x, weight), tolerance, torch.float32)
    assert linear.quantized(weight_on_device) is linear.quantized(weight_on_device)  # quantized once
    weight_on_device.mul_(2)  # an in-place update re-quantizes
    assert_close(linear(x.to(device), weight_on_device), ref.ref_linear(x, 2 * weight),
                 {torch.float32: (2 * tolerance[torch.float32][0], tolerance[torch.float32][1])}, torch.float32)
    odd = torch.randn(5, 72, generator=gen)  # K = 72 is not whole blocks: plain F.linear
    assert_close(linear(x[:, :72].to(device), odd.to(device)), ref.ref_linear(x[:, :72], odd), {torch.float32: (1e-5, 1e-5)}, torch.float32)


@pytest.mark.parametrize("qtype", QTYPES)
def test_from_gguf_blocks_splits_a_gguf_tensor(qtype):
    weight = torch.randn(6, 128, generator=torch.Generator().manual_seed(3))
    raw = gguf.quants.quantize(weight.numpy(), {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0}[qtype])
    split = quant_matmul.from_gguf_blocks(torch.from_numpy(raw), qtype)
    ours = quant_matmul.quantize(weight, qtype)
    assert torch.equal(split.scales, ours.scales) and torch.equal(split.quants, ours.quants)
    assert split.shape == (6, 128) and split.nbytes == raw.nbytes


@pytest.mark.parametrize("device", DEVICES)
def test_quant_matmul_rejects_bad_inputs(device):
    qweight = quant_matmul.quantize(torch.randn(8, 64, device=device), "q8_0")
    with pytest.raises(ValueError, match="x has 32 features"):
        quant_matmul.quant_matmul(torch.randn(2, 32, device=device), qweight)
    with pytest.raises(ValueError, match="bias"):
        quant_matmul.quant_matmul(torch.randn(2, 64, device=device), qweight, torch.randn(7, device=device))
    with pytest.raises(ValueError, match="do not fit"):
        quant_matmul.QuantizedWeight("q4_0", qweight.scales, qweight.quants)
    with pytest.raises(ValueError, match="unknown quantization"):
        quant_matmul.QuantizedLinear("q2_k")
