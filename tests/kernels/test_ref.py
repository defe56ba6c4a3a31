"""The PyTorch reference kernels against independent, loop-level formulations, and the dispatch table."""

from __future__ import annotations

import math

import pytest
import torch

import kernels
from kernels import ref


def test_rms_norm_matches_formula():
    torch.manual_seed(0)
    x, w = torch.randn(7, 37), torch.randn(37)
    rms = torch.sqrt((x.double() ** 2).mean(-1, keepdim=True) + 1e-5)
    torch.testing.assert_close(ref.ref_rms_norm(x, w, 1e-5), (x.double() / rms * w.double()).float())
    torch.testing.assert_close(ref.ref_rms_norm(x, w, 1e-5, offset=1.0), (x.double() / rms * (1 + w.double())).float())


def test_rotary_is_a_rotation_of_half_split_pairs():
    torch.manual_seed(0)
    x = torch.randn(5, 3, 10)
    positions = torch.tensor([0, 1, 2, 7, 100])
    cos, sin = ref.ref_rotary_cos_sin(positions, 10, 10000.0, torch.float32)
    out = ref.ref_rotary(x, cos, sin)
    # Pair (i, i + D/2) rotated by angle pos * base^(-2i/D), written as complex multiplication.
    for t, pos in enumerate(positions.tolist()):
        for i in range(5):
            angle = pos * 10000.0 ** (-2 * i / 10)
            z = torch.complex(x[t, :, i].double(), x[t, :, i + 5].double()) * complex(math.cos(angle), math.sin(angle))
            torch.testing.assert_close(out[t, :, i].double(), z.real, atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(out[t, :, i + 5].double(), z.imag, atol=1e-4, rtol=1e-4)
    # Rotations keep norms.
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1))


def _loop_attention(q, k, v, scale, q_start, window):
    num_tokens, num_heads, _ = q.shape
    group = num_heads // k.shape[1]
    out = torch.zeros_like(q, dtype=torch.float64)
    for t in range(num_tokens):
        pos = q_start + t
        visible = [j for j in range(k.shape[0]) if j <= pos and (window is None or pos - j < window)]
        for h in range(num_heads):
            kv = h // group
            scores = torch.tensor([float(q[t, h].double() @ k[j, kv].double()) * scale for j in visible], dtype=torch.float64)
            probs = torch.softmax(scores, 0)
            out[t, h] = sum(p * v[j, kv].double() for p, j in zip(probs, visible))
    return out


@pytest.mark.parametrize("q_start,num_tokens,window", [(0, 7, None), (5, 3, None), (9, 1, None), (0, 11, 4), (13, 2, 5)])
def test_attention_matches_loop_reference(q_start, num_tokens, window):
    torch.manual_seed(q_start)
    heads, kv_heads, dim = 6, 2, 9
    q = torch.randn(num_tokens, heads, dim)
    k, v = torch.randn(q_start + num_tokens, kv_heads, dim), torch.randn(q_start + num_tokens, kv_heads, dim)
    out = ref.ref_attention(q, k, v, scale=dim**-0.5, q_start=q_start, sliding_window=window)
    torch.testing.assert_close(out.double(), _loop_attention(q, k, v, dim**-0.5, q_start, window), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("activation,fn", [("silu", lambda g: g * torch.sigmoid(g)),
                                           ("gelu_tanh", lambda g: 0.5 * g * (1 + torch.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g**3))))])
def test_gated_mlp(activation, fn):
    torch.manual_seed(0)
    x, gate, up, down = torch.randn(3, 10), torch.randn(14, 10), torch.randn(14, 10), torch.randn(10, 14)
    expected = (fn(x.double() @ gate.double().T) * (x.double() @ up.double().T)) @ down.double().T
    out = ref.ref_gated_mlp(x, torch.cat([gate, up]), down, activation)
    torch.testing.assert_close(out.double(), expected, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="unknown MLP activation"):
        ref.ref_gated_mlp(x, torch.cat([gate, up]), down, "relu6")


def test_dispatch_swaps_and_resets():
    calls = []

    def traced_linear(x, w, b=None):
        calls.append(tuple(x.shape))
        return ref.ref_linear(x, w, b)

    try:
        previous = kernels.register("linear", traced_linear)
        assert previous is ref.ref_linear
        out = kernels.dispatch("linear", torch.ones(2, 3), torch.ones(4, 3))
        assert calls == [(2, 3)] and torch.equal(out, torch.full((2, 4), 3.0))
    finally:
        kernels.reset()
    assert kernels.registered("linear") is ref.ref_linear
    with pytest.raises(KeyError, match="unknown op"):
        kernels.register("softmax", traced_linear)
