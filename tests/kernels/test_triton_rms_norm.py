"""Parity of the Triton RMSNorm (and its fused residual add) with `ref_rms_norm` / `ref_add_rms_norm`."""

from __future__ import annotations

import pytest
import torch

from kernels import ref
from tests.kernels.triton_devices import DEVICES, DTYPES, assert_close

from kernels.triton import rms_norm as triton_rms_norm  # noqa: E402  (after TRITON_INTERPRET is set)

# (atol, rtol) against the float32 reference on the same inputs.
TOLERANCE = {
    torch.float32: (1e-5, 1e-5),  # summation order of the mean square
    torch.bfloat16: (2e-2, 2e-2),  # one bfloat16 rounding of the output (and of the residual sum)
}


def _inputs(shape, dtype, device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    width = shape[-1]
    # Rows with a stride larger than E: the kernel reads a view of a wider buffer in place.
    x = torch.randn(*shape[:-1], width + 8, generator=gen)[..., :width]
    residual = torch.randn(shape, generator=gen)
    weight = torch.randn(width, generator=gen) * 0.5 + 1
    return x.to(device, dtype), residual.to(device, dtype), weight.to(device, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,offset", [((7, 72), 0.0), ((7, 72), 1.0), ((2, 3, 24), 1.0)])
def test_rms_norm(device, dtype, shape, offset):
    x, _, weight = _inputs(shape, dtype, device)
    out = triton_rms_norm.rms_norm(x, weight, 1e-6, offset=offset)
    expected = ref.ref_rms_norm(x.float(), weight.float(), 1e-6, offset=offset)
    assert out.shape == x.shape and out.dtype == dtype
    assert_close(out, expected, TOLERANCE, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_add_rms_norm(device, dtype, offset):
    x, residual, weight = _inputs((5, 72), dtype, device, seed=1)
    normed, new_residual = triton_rms_norm.add_rms_norm(x, residual, weight, 1e-5, offset=offset)
    expected_normed, expected_residual = ref.ref_add_rms_norm(x.float(), residual.float(), weight.float(), 1e-5, offset=offset)
    assert normed.dtype == new_residual.dtype == dtype
    assert_close(new_residual, expected_residual, TOLERANCE, dtype)
    assert_close(normed, expected_normed, TOLERANCE, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_rms_norm_rejects_bad_inputs(device):
    x, residual, weight = _inputs((4, 72), torch.float32, device)
    with pytest.raises(ValueError, match="weight has 71 entries"):
        triton_rms_norm.rms_norm(x, weight[:71], 1e-6)
    with pytest.raises(ValueError, match="residual"):
        triton_rms_norm.add_rms_norm(x, residual[:3], weight, 1e-6)
    with pytest.raises(ValueError, match="dtype torch.int64"):
        triton_rms_norm.rms_norm(x.long(), weight, 1e-6)
    with pytest.raises(ValueError, match="contiguous last dimension"):
        triton_rms_norm.rms_norm(x.t(), weight[:4], 1e-6)
