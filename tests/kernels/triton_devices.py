"""Where the Triton parity tests run; import it before any `kernels.triton` kernel module.

Without a CUDA device it sets TRITON_INTERPRET=1 (Triton reads it when a kernel is decorated, that is
when the kernel modules are imported), so the kernels run on CPU tensors in Triton's interpreter. With
one, the kernels are compiled and the "cuda" cases (marker `gpu`) run instead. Without Triton the
importing test module is skipped.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from kernels.triton.common import is_interpreting  # noqa: E402  (after the variable is set)

DEVICES = [
    pytest.param("cpu", id="interpret", marks=pytest.mark.skipif(
        not is_interpreting(), reason="Triton compiles for the GPU here; the interpreter cases need TRITON_INTERPRET=1")),
    pytest.param("cuda", id="cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
        not torch.cuda.is_available() or is_interpreting(), reason="needs a CUDA device and TRITON_INTERPRET unset")]),
]
DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")]


def assert_close(actual: torch.Tensor, expected: torch.Tensor, tolerance: dict[torch.dtype, tuple[float, float]], dtype: torch.dtype) -> None:
    """Compare on the CPU in float32 with (atol, rtol) = tolerance[dtype]."""
    atol, rtol = tolerance[dtype]
    torch.testing.assert_close(actual.cpu().float(), expected.cpu().float(), atol=atol, rtol=rtol)
