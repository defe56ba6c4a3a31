"""`kernels.triton.triton_variants()` as the tuner sees them, the lazy Triton import, and the GPU benchmark
script's refusal to run without CUDA."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernels import ref
from kernels.ops import REFERENCES
from tests.kernels.triton_devices import DEVICES, assert_close

from kernels.triton import triton_variants  # noqa: E402  (after TRITON_INTERPRET is set)

ROOT = Path(__file__).resolve().parents[2]


def _op_inputs(op: str, device: str) -> tuple[tuple, dict]:
    """Small arguments of each dispatch op, in float32 on `device`."""
    gen = torch.Generator().manual_seed(0)
    randn = lambda *shape: torch.randn(*shape, generator=gen).to(device)  # noqa: E731
    if op == "rms_norm":
        return (randn(3, 72), randn(72), 1e-6), {"offset": 0.0}
    if op == "rotary":
        cos, sin = ref.ref_rotary_cos_sin(torch.tensor([0, 5, 9]), 24, 10000.0, torch.float32)
        return (randn(3, 4, 24), cos.to(device), sin.to(device)), {}
    if op == "gated_mlp":
        return (randn(2, 72), randn(200, 72) / 72**0.5, randn(72, 100) / 10, "silu"), {}
    if op == "paged_attention":
        tables = torch.tensor([[2, 0], [1, 3]], device=device)
        return (randn(2, 6, 24), randn(4, 16, 2, 24), randn(4, 16, 2, 24), tables, [9, 20], [1, 1]), {"scale": 0.2}
    if op == "linear":
        return (randn(2, 96), randn(40, 96) / 96**0.5), {}
    raise AssertionError(op)


def test_variants_describe_dispatch_ops_on_cuda():
    variants = triton_variants()
    assert {v.op for v in variants} == {"rms_norm", "rotary", "gated_mlp", "paged_attention", "linear"}
    assert len({(v.op, v.name) for v in variants}) == len(variants)
    for v in variants:
        assert v.op in REFERENCES and v.devices == ("cuda",) and not v.exact
        assert set(v.dtypes) <= set(v.tolerance) and v.description
        assert v.available() == torch.cuda.is_available()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", triton_variants(), ids=lambda v: f"{v.op}-{v.name}")
def test_variant_matches_its_op_reference_within_its_tolerance(device, variant):
    args, kwargs = _op_inputs(variant.op, device)
    expected = REFERENCES[variant.op](*(a.cpu() if isinstance(a, torch.Tensor) else a for a in args), **kwargs)
    assert_close(variant.fn(*args, **kwargs), expected, variant.tolerance, torch.float32)


def test_importing_kernels_does_not_import_triton():
    code = "import sys, kernels, kernels.triton; kernels.triton.triton_variants(); assert 'triton' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given without a CUDA device")
def test_gpu_benchmark_refuses_without_cuda(capsys):
    spec = importlib.util.spec_from_file_location("gpu_kernels", ROOT / "benchmarks/gpu_kernels.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    assert module.main(["--skip-tests"]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err
