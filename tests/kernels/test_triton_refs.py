"""The references added for the Triton kernels: GGML Q8_0/Q4_0 blocks (`ref_ggml_quantize`, `ref_ggml_dequantize`,
`ref_ggml_linear`) against the `gguf` package's implementation of ggml's formats, `ref_add_rms_norm`, `ref_gated_activation`."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from kernels import ref

GGML_TYPES = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0}


@pytest.mark.parametrize("qtype", ["q8_0", "q4_0"])
def test_quantize_matches_gguf_byte_for_byte(qtype):
    torch.manual_seed(0)
    weight = torch.randn(5, 96)
    weight[0, :32] = 0  # an all-zero block: scale 0
    weight[1, 40] = 9.0  # a block dominated by one outlier
    scales, quants = ref.ref_ggml_quantize(weight, qtype)
    assert scales.shape == (5, 3) and scales.dtype == torch.float16
    assert quants.shape == ((5, 96) if qtype == "q8_0" else (5, 48))
    expected = gguf.quants.quantize(weight.numpy(), GGML_TYPES[qtype]).reshape(5, 3, -1)
    ours = np.concatenate([scales.numpy().reshape(5, 3, 1).view(np.uint8), quants.numpy().view(np.uint8).reshape(5, 3, -1)], axis=-1)
    np.testing.assert_array_equal(ours, expected)
    dequantized = gguf.quants.dequantize(expected.reshape(5, -1), GGML_TYPES[qtype])
    np.testing.assert_array_equal(ref.ref_ggml_dequantize(scales, quants, qtype).numpy(), dequantized)


@pytest.mark.parametrize("qtype,max_step", [("q8_0", 1 / 127), ("q4_0", 1 / 8)])
def test_dequantize_error_is_within_half_a_step(qtype, max_step):
    weight = torch.randn(7, 64, generator=torch.Generator().manual_seed(1))
    error = (ref.ref_ggml_dequantize(*ref.ref_ggml_quantize(weight, qtype), qtype) - weight).abs()
    block_max = weight.abs().reshape(7, 2, 32).amax(-1, keepdim=True).expand(7, 2, 32).reshape(7, 64)
    # half a quantization step, plus the float16 rounding of the scale (Q4_0's top code 15 clips the +max side by one step)
    bound = block_max * max_step * (2 if qtype == "q4_0" else 0.5) + block_max * 2e-3
    assert (error <= bound).all()


def test_quant_linear_is_linear_on_the_dequantized_weight():
    gen = torch.Generator().manual_seed(2)
    x, weight, bias = torch.randn(3, 64, generator=gen), torch.randn(10, 64, generator=gen), torch.randn(10, generator=gen)
    scales, quants = ref.ref_ggml_quantize(weight, "q4_0")
    expected = x @ ref.ref_ggml_dequantize(scales, quants, "q4_0").T + bias
    torch.testing.assert_close(ref.ref_ggml_linear(x, scales, quants, "q4_0", bias), expected)


def test_quant_references_reject_bad_inputs():
    with pytest.raises(ValueError, match="multiple of 32"):
        ref.ref_ggml_quantize(torch.randn(4, 40), "q8_0")
    with pytest.raises(ValueError, match="unknown quantization"):
        ref.ref_ggml_quantize(torch.randn(4, 32), "q5_1")
    scales, quants = ref.ref_ggml_quantize(torch.randn(4, 64), "q4_0")
    with pytest.raises(ValueError, match="do not fit"):
        ref.ref_ggml_dequantize(scales, quants[:, :16], "q4_0")


def test_add_rms_norm_and_gated_activation_references():
    gen = torch.Generator().manual_seed(3)
    x, residual, weight = torch.randn(4, 12, generator=gen), torch.randn(4, 12, generator=gen), torch.randn(12, generator=gen)
    normed, new_residual = ref.ref_add_rms_norm(x, residual, weight, 1e-6, offset=1.0)
    torch.testing.assert_close(new_residual, x + residual)
    torch.testing.assert_close(normed, ref.ref_rms_norm(x + residual, weight, 1e-6, offset=1.0))
    with pytest.raises(ValueError, match="must match"):
        ref.ref_add_rms_norm(x, residual[:2], weight, 1e-6)
    gate_up = torch.randn(3, 20, generator=gen)
    gate, up = gate_up[:, :10].double(), gate_up[:, 10:].double()
    torch.testing.assert_close(ref.ref_gated_activation(gate_up, "silu").double(), gate * torch.sigmoid(gate) * up)
    gelu = 0.5 * gate * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (gate + 0.044715 * gate**3)))
    torch.testing.assert_close(ref.ref_gated_activation(gate_up, "gelu_tanh").double(), gelu * up)
    with pytest.raises(ValueError, match="unknown MLP activation"):
        ref.ref_gated_activation(gate_up, "relu")
