"""Per-request routing threads: the embedder's own one-thread OpenMP worker changes no other thread's torch
thread count (unlike torch.set_num_threads), and numpy's OpenBLAS pool can be limited to one thread."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

torch = pytest.importorskip("torch")
threadpoolctl = pytest.importorskip("threadpoolctl")

from routers.embedding import SMALL_BATCH, Embedder  # noqa: E402
from routers.threads import limit_blas_threads, omp_set_num_threads_function, pin_intraop_threads  # noqa: E402


def torch_threads_of_new_thread() -> int:
    """The intra-op thread count a thread gets when it first uses torch now."""
    box = []
    thread = threading.Thread(target=lambda: box.append(torch.get_num_threads()))
    thread.start()
    thread.join()
    return box[0]


def test_a_pinned_thread_runs_one_thread_and_no_other_thread_changes():
    if omp_set_num_threads_function() is None:
        pytest.skip("torch is not built with OpenMP")
    default = torch.get_num_threads()
    with ThreadPoolExecutor(1, initializer=pin_intraop_threads, initargs=(1,)) as pinned:
        assert pinned.submit(torch.get_num_threads).result() == 1
        assert torch.get_num_threads() == default
        assert torch_threads_of_new_thread() == default          # the process default is untouched
        out = pinned.submit(lambda: (torch.ones(256, 256) @ torch.ones(256, 256), torch.get_num_threads())[1]).result()
        assert out == 1


class ThreadRecordingModel:
    """A fake SentenceTransformer: records the thread and torch thread count of each encode; can block."""

    def __init__(self):
        self.calls: list[tuple[str, int, int]] = []
        self.entered, self.release = threading.Event(), threading.Event()
        self.release.set()

    def encode(self, texts, **_):
        self.calls.append((threading.current_thread().name, torch.get_num_threads(), len(texts)))
        self.entered.set()
        self.release.wait(10)
        out = np.zeros((len(texts), 384), dtype=np.float32)
        out[:, 0] = 1.0
        return out


def embedder_with(model, **kwargs) -> Embedder:
    embedder = Embedder(use_cache=False, **kwargs)
    embedder._model = model
    return embedder


def test_small_batches_encode_on_the_embedders_own_one_thread_worker():
    if omp_set_num_threads_function() is None:
        pytest.skip("torch is not built with OpenMP")
    default = torch.get_num_threads()
    model = ThreadRecordingModel()
    embedder = embedder_with(model)
    embedder.encode(["one prompt"])
    embedder.encode([f"text {i}" for i in range(SMALL_BATCH + 1)])
    (small_thread, small_count, _), (big_thread, big_count, big_n) = model.calls
    assert small_thread.startswith("embedder-1t") and small_count == 1
    assert big_thread == threading.current_thread().name and big_count == default and big_n == SMALL_BATCH + 1
    assert embedder.encoder_threads(1) == 1 and embedder.encoder_threads(SMALL_BATCH + 1) is None
    fixed = embedder_with(ThreadRecordingModel(), num_threads=2)
    fixed.encode([f"text {i}" for i in range(20)])
    thread, count, _ = fixed._model.calls[0]
    assert thread.startswith("embedder-2t") and count == 2
    assert fixed.encoder_threads(1) == 2


def test_a_thread_starting_torch_work_during_an_encode_keeps_the_default():
    default = torch.get_num_threads()
    model = ThreadRecordingModel()
    model.release.clear()
    embedder = embedder_with(model)
    encoding = threading.Thread(target=embedder.encode, args=(["a request"],))
    encoding.start()
    assert model.entered.wait(10)
    try:
        assert torch_threads_of_new_thread() == default          # torch.set_num_threads(1) here would give 1
    finally:
        model.release.set()
        encoding.join()


def test_limit_blas_threads_limits_numpys_openblas_only():
    openblas = threadpoolctl.ThreadpoolController().select(internal_api="openblas")
    if not openblas.lib_controllers:
        pytest.skip("numpy does not use OpenBLAS here")
    original = openblas.lib_controllers[0].num_threads
    try:
        assert limit_blas_threads(1) >= 1
        info = threadpoolctl.threadpool_info()
        assert all(lib["num_threads"] == 1 for lib in info if lib["internal_api"] == "openblas")
        assert torch.get_num_threads() >= 1                      # torch's OpenMP pool is not a BLAS library here
    finally:
        openblas.limit(limits=original)
