"""The CPU's default kernels (`kernels.cpu_defaults`): the table's rule, parity with the reference where the
native kernel serves, the reference itself everywhere else, and staging through the dispatch."""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels import ref
from kernels.cpu_defaults import uses_native, choose_defaults, install_cpu_defaults, native_gated_mlp_default, native_linear_default
from kernels.dispatch import default_names
from kernels.native import has_avx512, load_rows_linear

FP32_TOL = dict(atol=1e-5, rtol=1e-5)  # fp32: another summation order than MKL's


@pytest.fixture(scope="module")
def native():
    if load_rows_linear() is None:  # builds it here (about a minute) where AVX-512 and g++ exist
        pytest.skip("rows_linear cannot run on this machine")


def test_the_rule_takes_float32_plain_weights_at_4_to_16_rows():
    w = torch.randn(10, 24)
    assert [uses_native(torch.randn(n, 24), w) for n in (1, 3, 4, 16, 17, 512)] == [False, False, True, True, False, False]
    assert uses_native(torch.randn(2, 4, 24), w)  # rows are every leading dimension: 8
    assert not uses_native(torch.randn(8, 24, dtype=torch.bfloat16), w.bfloat16())
    assert not uses_native(torch.randn(8, 24), object())  # a packed weight keeps its own path


@pytest.mark.parametrize("rows", [1, 3, 4, 7, 16, 17, 40])
def test_native_default_matches_the_reference(native, rows):
    gen = torch.Generator().manual_seed(rows)
    x, w, b = torch.randn(rows, 72, generator=gen), torch.randn(50, 72, generator=gen), torch.randn(50, generator=gen)
    torch.testing.assert_close(native_linear_default(x, w, b), ref.ref_linear(x.double(), w.double(), b.double()).float(), **FP32_TOL)
    gate_up, down = torch.randn(2 * 36, 72, generator=gen) / 8, torch.randn(72, 36, generator=gen) / 8
    expected = ref.ref_gated_mlp(x.double(), gate_up.double(), down.double(), "silu").float()
    torch.testing.assert_close(native_gated_mlp_default(x, gate_up, down, "silu"), expected, **FP32_TOL)


def test_bfloat16_runs_the_reference_bit_for_bit():
    x, w = torch.randn(8, 64, dtype=torch.bfloat16), torch.randn(33, 64, dtype=torch.bfloat16)
    assert torch.equal(native_linear_default(x, w), ref.ref_linear(x, w))


def test_install_stages_the_row_of_this_cpu(native):
    kernels.reset()
    try:
        chosen = install_cpu_defaults(build=True)
        assert chosen == ({"linear": "rows-avx512", "gated_mlp": "rows-avx512"} if has_avx512() else {})
        assert default_names() == {} and kernels.registered("linear") is ref.ref_linear  # staged, not yet applied
        kernels.apply_pending()
        assert default_names() == chosen
        assert kernels.registered("linear") is native_linear_default
        assert set(choose_defaults()) == set(chosen)  # built now: found without building
    finally:
        kernels.reset()
    assert default_names() == {} and kernels.registered("linear") is ref.ref_linear
