"""Parity of the Triton rotary embedding with `ref_rotary` (half-split layout)."""

from __future__ import annotations

import pytest
import torch

from kernels import ref
from tests.kernels.triton_devices import DEVICES, DTYPES, assert_close

from kernels.triton import rotary as triton_rotary  # noqa: E402  (after TRITON_INTERPRET is set)

# (atol, rtol) against the float32 reference on the same inputs.
TOLERANCE = {
    torch.float32: (1e-5, 1e-5),  # x1 cos - x2 sin in a different association order
    torch.bfloat16: (2e-2, 2e-2),  # one bfloat16 rounding of the output
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_on_a_fused_qkv_view(device, dtype):
    # 9 query heads and 3 key heads of size 24 rotated in one call, read in place from a [T, (9+3+3) * 24]
    # projection output (token stride 360, not 12 * 24), at positions that are not consecutive.
    gen = torch.Generator().manual_seed(0)
    num_tokens, heads, kv_heads, head_dim = 5, 9, 3, 24
    qkv = torch.randn(num_tokens, (heads + 2 * kv_heads) * head_dim, generator=gen).to(device, dtype)
    qk = qkv[:, : (heads + kv_heads) * head_dim].view(num_tokens, heads + kv_heads, head_dim)
    positions = torch.tensor([0, 1, 17, 44, 1000])
    cos, sin = ref.ref_rotary_cos_sin(positions, head_dim, 10000.0, torch.float32)
    out = triton_rotary.rotary(qk, cos.to(device, dtype), sin.to(device, dtype))
    assert out.shape == qk.shape and out.dtype == dtype
    expected = ref.ref_rotary(qk.float().cpu(), cos, sin)
    assert_close(out, expected, TOLERANCE, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_rotary_uses_both_table_halves(device):
    # Tables whose halves differ (not from ref_rotary_cos_sin) still follow the reference formula.
    gen = torch.Generator().manual_seed(1)
    x, cos, sin = torch.randn(3, 2, 10, generator=gen), torch.randn(3, 10, generator=gen), torch.randn(3, 10, generator=gen)
    out = triton_rotary.rotary(x.to(device), cos.to(device), sin.to(device))
    assert_close(out, ref.ref_rotary(x, cos, sin), TOLERANCE, torch.float32)


@pytest.mark.parametrize("device", DEVICES)
def test_rotary_rejects_bad_inputs(device):
    x, table = torch.randn(3, 2, 10, device=device), torch.randn(3, 10, device=device)
    with pytest.raises(ValueError, match="must be even"):
        triton_rotary.rotary(x[..., :9], table[:, :9], table[:, :9])
    with pytest.raises(ValueError, match=r"must be \[T, D\]"):
        triton_rotary.rotary(x, table[:2], table[:2])
    with pytest.raises(ValueError, match="3 dimensions"):
        triton_rotary.rotary(x[0], table, table)
