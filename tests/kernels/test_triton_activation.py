"""Parity of the Triton SwiGLU/GeGLU gating with `ref_gated_activation`, and of the gated MLP built on it
with `ref_gated_mlp`."""

from __future__ import annotations

import pytest
import torch

from kernels import ref
from tests.kernels.triton_devices import DEVICES, DTYPES, assert_close

from kernels.triton import activation as triton_activation  # noqa: E402  (after TRITON_INTERPRET is set)

# (atol, rtol) against the float32 reference on the same inputs.
TOLERANCE = {
    torch.float32: (1e-5, 1e-5),  # sigmoid and tanh (as 2 sigmoid(2z) - 1) against PyTorch's
    torch.bfloat16: (2e-2, 2e-2),  # one bfloat16 rounding of the output
}
MLP_TOLERANCE = {
    torch.float32: (1e-4, 1e-4),  # the activation's float32 differences summed over F = 100 by the down projection
    torch.bfloat16: (3e-2, 3e-2),  # the reference rounds gate, up and their product to bfloat16 separately
}
ACTIVATIONS = ["silu", "gelu_tanh"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_gated_activation(device, dtype, activation):
    gen = torch.Generator().manual_seed(0)
    gate_up = (torch.randn(5, 2 * 100, generator=gen) * 3).to(device, dtype)  # F = 100, values out to the tails
    out = triton_activation.gated_activation(gate_up, activation)
    assert out.shape == (5, 100) and out.dtype == dtype
    assert_close(out, ref.ref_gated_activation(gate_up.float().cpu(), activation), TOLERANCE, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_gated_mlp(device, dtype, activation):
    gen = torch.Generator().manual_seed(1)
    hidden, ffn = 72, 100
    x = torch.randn(3, hidden, generator=gen)
    gate_up, down = torch.randn(2 * ffn, hidden, generator=gen) / hidden**0.5, torch.randn(hidden, ffn, generator=gen) / ffn**0.5
    out = triton_activation.gated_mlp(x.to(device, dtype), gate_up.to(device, dtype), down.to(device, dtype), activation)
    assert out.shape == (3, hidden) and out.dtype == dtype
    assert_close(out, ref.ref_gated_mlp(x, gate_up, down, activation), MLP_TOLERANCE, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_gated_activation_rejects_bad_inputs(device):
    gate_up = torch.randn(2, 10, device=device)
    with pytest.raises(ValueError, match="unknown MLP activation"):
        triton_activation.gated_activation(gate_up, "relu")
    with pytest.raises(ValueError, match="must be even"):
        triton_activation.gated_activation(gate_up[:, :9], "silu")
    with pytest.raises(ValueError, match="2 dimensions"):
        triton_activation.gated_activation(gate_up[0], "silu")
