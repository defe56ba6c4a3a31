"""The GGUF block kernels (`kernels/native/gguf_matmul.cpp`) against the loader's dequantizer.

Blocks are random bytes with their fp16 scale fields set to finite values, so every code pattern of every
type occurs. Each build this CPU can run is checked (AVX-512, AVX2, portable: `LINK_KERNEL_ISA` picks the
same builds in the engine):
- `dequantize` and `rows` equal `serving.loader.dequant.dequantize` bit for bit;
- `linear` is within the stated bound of the float64 product of the dequantized weights:
  |y - x W^T| <= K * 2^-23 * (|x| |W|^T), at every row count of every path (1-4 rows in registers,
  5-31 through decoded slices, 32 and more through the GEMM), odd N, several segments of mixed types, bias;
- a row's result does not depend on the other rows of its call below the GEMM path (bit for bit).
The builds compile at once (`kernels.native.load_all`): two modules build side by side, one module once.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T

import kernels.native as native
from serving.loader.dequant import dequantize

# type -> (values per block, bytes per block, byte offsets of its fp16 scale fields)
LAYOUT = {
    T.Q4_0: (32, 18, (0,)), T.Q4_1: (32, 20, (0, 2)), T.Q5_0: (32, 22, (0,)), T.Q5_1: (32, 24, (0, 2)),
    T.Q8_0: (32, 34, (0,)), T.Q4_K: (256, 144, (0, 2)), T.Q5_K: (256, 176, (0, 2)), T.Q6_K: (256, 210, (208,)),
}
ISAS = [isa for isa in native.ISA_ORDER if native.ISA_ORDER.index(isa) <= native.ISA_ORDER.index(native.cpu_isa())]


def random_blocks(qtype: T, n: int, k: int, seed: int) -> torch.Tensor:
    """uint8 [n, row_bytes]: random codes, scales drawn from +-[2^-10, 2^-4] as fp16."""
    qk, bb, scale_at = LAYOUT[qtype]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(n, k // qk, bb), dtype=np.uint8)
    for off in scale_at:
        halves = (rng.uniform(2**-10, 2**-4, size=(n, k // qk)) * rng.choice([-1, 1], size=(n, k // qk))).astype(np.float16)
        raw[:, :, off:off + 2] = halves.view(np.uint8).reshape(n, k // qk, 2)
    return torch.from_numpy(raw.reshape(n, -1).copy())


def reference(blocks: torch.Tensor, qtype: T, k: int) -> torch.Tensor:
    return dequantize(blocks.numpy(), qtype, (blocks.shape[0], k))


@pytest.fixture(scope="module")
def builds() -> dict:
    """{isa: module or None} for every build this CPU runs, compiled at once on first use (one core each)."""
    return dict(zip(ISAS, native.load_all([("gguf_matmul", isa) for isa in ISAS])))


@pytest.fixture(scope="module", params=ISAS)
def gguf(request, builds):
    module = builds[request.param]
    if module is None:
        pytest.skip(f"the {request.param} build is unavailable: {native.unavailable_reason('gguf_matmul_' + request.param)}")
    assert module.isa() == request.param
    return module


def bound_excess(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> float:
    """The largest |y - x W^T (+ bias)| elementwise, as a multiple of the stated bound (<= 1 holds it)."""
    exact = x.double() @ w.double().T
    if bias is not None:
        exact = exact + bias.double()
    bound = x.shape[1] * 2.0**-23 * (x.double().abs() @ w.double().abs().T) + 1e-30
    return ((y.double() - exact).abs() / bound).max().item()


@pytest.mark.parametrize("qtype", list(LAYOUT))
def test_dequantize_and_rows_equal_the_loader_bit_for_bit(gguf, qtype):
    qk = LAYOUT[qtype][0]
    blocks = random_blocks(qtype, 37, 3 * qk, seed=int(qtype))
    ref = reference(blocks, qtype, 3 * qk)
    assert torch.equal(gguf.dequantize(blocks, int(qtype), 3 * qk), ref)
    ids = torch.tensor([36, 0, 5, 5, 17])
    assert torch.equal(gguf.rows(blocks, int(qtype), 3 * qk, ids), ref[ids])


@pytest.mark.parametrize("qtype", list(LAYOUT))
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 7, 16, 31, 32, 40])
def test_linear_is_within_the_float_bound_of_the_dequantized_product(gguf, qtype, m):
    qk = LAYOUT[qtype][0]
    k = 5 * qk if qk == 32 else 2 * qk
    blocks = random_blocks(qtype, 33, k, seed=100 + m)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    y = gguf.linear(x, [blocks], [int(qtype)], k)
    assert y.shape == (m, 33)
    assert bound_excess(y, x, reference(blocks, qtype, k)) <= 1.0


@pytest.mark.parametrize("m", [1, 3, 9, 40])
def test_segments_of_mixed_types_lie_side_by_side_with_the_bias(gguf, m):
    k = 512
    parts = [(T.Q4_K, 19), (T.Q6_K, 5), (T.Q8_0, 11), (T.Q5_0, 3), (T.F32, 4)]
    blocks = [random_blocks(t, n, k, seed=i) if t != T.F32 else torch.randn(n, k).view(torch.uint8)
              for i, (t, n) in enumerate(parts)]
    weight = torch.cat([reference(b, t, k) for b, (t, _) in zip(blocks, parts)])
    bias = torch.randn(weight.shape[0])
    x = torch.randn(m, k)
    y = gguf.linear(x, blocks, [int(t) for t, _ in parts], k, bias)
    assert y.shape == (m, 42)
    assert bound_excess(y, x, weight, bias) <= 1.0


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q5_0])
def test_a_rows_result_does_not_depend_on_its_batch(gguf, qtype):
    k = 512
    blocks = random_blocks(qtype, 21, k, seed=3)
    x = torch.randn(31, k)
    alone = torch.cat([gguf.linear(x[i:i + 1], [blocks], [int(qtype)], k) for i in range(4)])
    assert torch.equal(gguf.linear(x[:4], [blocks], [int(qtype)], k), alone)
    slices = gguf.linear(x[:12], [blocks], [int(qtype)], k)
    assert torch.equal(gguf.linear(x[:5], [blocks], [int(qtype)], k), slices[:5])


def test_bad_arguments_say_what_to_fix(gguf):
    blocks = random_blocks(T.Q4_K, 4, 256, seed=0)
    with pytest.raises(ValueError, match="not a positive multiple of the type's block of 256"):
        gguf.linear(torch.randn(1, 128), [blocks], [int(T.Q4_K)], 128)
    with pytest.raises(ValueError, match="is not one of F32, Q4_0"):
        gguf.linear(torch.randn(1, 256), [blocks], [int(T.F16)], 256)
    with pytest.raises(ValueError, match="needs 144 bytes, got 143"):
        gguf.dequantize(blocks[:, :143].contiguous(), int(T.Q4_K), 256)
    with pytest.raises(ValueError, match=r"x float32 \[M, 256\]"):
        gguf.linear(torch.randn(1, 256, dtype=torch.float64), [blocks], [int(T.Q4_K)], 256)
    with pytest.raises(IndexError, match="id 4 is out of range for 4 rows"):
        gguf.rows(blocks, int(T.Q4_K), 256, torch.tensor([4]))


def test_a_narrower_isa_can_be_forced_and_a_wider_one_is_refused(monkeypatch):
    monkeypatch.setenv("LINK_KERNEL_ISA", "portable")
    assert native.cpu_isa() == "portable"
    monkeypatch.setenv("LINK_KERNEL_ISA", "sse9")
    with pytest.raises(ValueError, match="not one of portable, avx2, avx512"):
        native.cpu_isa()
    monkeypatch.delenv("LINK_KERNEL_ISA")
    if native.cpu_isa() != "avx512":
        monkeypatch.setenv("LINK_KERNEL_ISA", "avx512")
        with pytest.raises(ValueError, match="needs a CPU this one is not"):
            native.cpu_isa()


def test_load_all_builds_two_modules_side_by_side_and_each_once(tmp_path, monkeypatch):
    """With the compiler replaced by one that returns only when a second build is in progress too: both builds
    finish (they ran at the same time), each once, and a module asked for twice is the same object."""
    import os
    import threading
    import types

    import torch.utils.cpp_extension as cpp

    if (os.cpu_count() or 1) < 2:
        pytest.skip("load_all builds one at a time on one core")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(native, "_loaded", {})
    monkeypatch.setattr(native, "_why_not", {})
    both_running, names = threading.Barrier(2, timeout=20), []

    def fake_load(name, sources, **kwargs):
        names.append(name)
        both_running.wait()  # a BrokenBarrierError here (builds one after another) makes load_native return None
        return types.SimpleNamespace(name=name)

    monkeypatch.setattr(cpp, "load", fake_load)
    monkeypatch.setattr(native.shutil, "which", lambda command: f"/usr/bin/{command}")  # a compiler "found" anywhere
    portable, avx2, again = native.load_all([("gguf_matmul", "portable"), ("gguf_matmul", "avx2"), ("gguf_matmul", "portable")])
    assert native.unavailable_reason("gguf_matmul_portable") is None and native.unavailable_reason("gguf_matmul_avx2") is None
    digest = native.source_digest("gguf_matmul")
    assert (portable.name, avx2.name) == (f"link_gguf_matmul_portable_{digest}", f"link_gguf_matmul_avx2_{digest}")
    assert sorted(names) == sorted([portable.name, avx2.name]) and again is portable
