"""`dtype="auto"`: bf16 where the hardware multiplies it natively, else fp32."""

from __future__ import annotations

import builtins
import io

import pytest
import torch

from serving import model_loader
from serving.errors import ServingError


def _fake_cpuinfo(monkeypatch, flags: str) -> None:
    real_open = builtins.open

    def fake_open(path, *args, **kwargs):
        if path == "/proc/cpuinfo":
            return io.StringIO(f"processor\t: 0\nflags\t\t: {flags}\n")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", fake_open)


@pytest.mark.parametrize("flags, has_bf16", [("fpu sse2 avx2 avx512f", False), ("fpu avx512f avx512_bf16", True),
                                             ("fpu amx_tile amx_bf16", True), ("", False)])
def test_cpu_bf16_flags(monkeypatch, flags, has_bf16):
    _fake_cpuinfo(monkeypatch, flags)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert model_loader.cpu_has_bf16() is has_bf16
    assert model_loader.parse_dtype("auto") == (torch.bfloat16 if has_bf16 else torch.float32)


def test_a_cuda_gpu_gets_bf16(monkeypatch):
    _fake_cpuinfo(monkeypatch, "fpu avx2")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert model_loader.parse_dtype("auto") == torch.bfloat16


def test_unknown_names_list_auto():
    with pytest.raises(ServingError, match="auto"):
        model_loader.parse_dtype("int3")
