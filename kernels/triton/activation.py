"""The gating of a gated MLP in Triton: act(gate) * up on the fused [T, 2F] gate/up projection output.

SwiGLU (silu, Llama) and GeGLU with GELU's tanh approximation (gelu_tanh, Gemma) (Shazeer 2020,
arXiv:2002.05202). One program handles a block of F columns of one token, in float32. `gated_mlp` wraps
it between the two projections (PyTorch matmuls) to give the dispatch op "gated_mlp". References:
`kernels.ref.ref_gated_activation` and `ref_gated_mlp`; parity tests: tests/kernels/test_triton_activation.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels.triton.common import check_devices, check_tensor, next_power_of_2

ACTIVATIONS = {"silu": 0, "gelu_tanh": 1}


@triton.jit
def _gated_activation_kernel(
    GATE_UP, OUT, stride_in, stride_out, width,
    ACTIVATION: tl.constexpr, BLOCK: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < width
    gate = tl.load(GATE_UP + token * stride_in + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(GATE_UP + token * stride_in + width + cols, mask=mask, other=0.0).to(tl.float32)
    if ACTIVATION == 0:  # silu(g) = g * sigmoid(g)
        act = gate * tl.sigmoid(gate)
    else:  # gelu_tanh(g) = g/2 (1 + tanh(z)), z = sqrt(2/pi) (g + 0.044715 g^3); 1 + tanh(z) = 2 sigmoid(2z)
        z = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)
        act = gate * tl.sigmoid(2.0 * z)
    tl.store(OUT + token * stride_out + cols, (act * up).to(OUT.dtype.element_ty), mask=mask)


def gated_activation(gate_up: torch.Tensor, activation: str) -> torch.Tensor:
    """act(gate) * up: the contract of `kernels.ref.ref_gated_activation`.

    Args:
        gate_up: [T, 2F], gate columns [:F] then up columns [F:], last dimension contiguous.
        activation: "silu" or "gelu_tanh".
    Returns:
        [T, F] in gate_up's dtype.
    Raises:
        ValueError: an unknown activation, an odd 2F, a wrong rank or dtype, or an unsupported device.
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown MLP activation {activation!r}; expected one of {sorted(ACTIVATIONS)}")
    check_tensor("gate_up", gate_up, dim=2)
    if gate_up.shape[1] % 2:
        raise ValueError(f"gate_up's last dimension {gate_up.shape[1]} must be even (gate and up halves)")
    check_devices(gate_up=gate_up)
    num_tokens, width = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(num_tokens, width, dtype=gate_up.dtype, device=gate_up.device)
    block = min(1024, next_power_of_2(width))
    if num_tokens and width:
        grid = (num_tokens, triton.cdiv(width, block))
        _gated_activation_kernel[grid](
            gate_up, out, gate_up.stride(0), out.stride(0), width, ACTIVATION=ACTIVATIONS[activation], BLOCK=block
        )
    return out


def gated_mlp(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, activation: str) -> torch.Tensor:
    """down(act(gate(x)) * up(x)): the contract of `kernels.ref.ref_gated_mlp` (dispatch op "gated_mlp").

    Args:
        x: [T, E]; gate_up: [2F, E] (gate rows over up rows); down: [E, F]; activation: "silu" or "gelu_tanh".
    Returns:
        [T, E]. The projections are PyTorch matmuls; the gating is the Triton kernel.
    Raises:
        ValueError: as `gated_activation`.
    """
    return F.linear(gated_activation(F.linear(x, gate_up), activation), down)
