"""`WinnerTable`: the tuner's persistent results, one SQLite file ($LINK_HOME/compile/winners.sqlite).

Why plain `sqlite3`: `kernels` sits below `link` (it may not use the gateway's SQLModel database),
the table is small (a row per op, bucket and variant), written by one tuner at a time and read at
engine start, and the standard library needs no migration machinery; WAL mode lets `link compile
status` read while a `link serve` tunes.

Every row is keyed by (op, bucket, dtype, device, torch version, triton version or "none", model,
variant) and holds the verdict: "winner" (the variant installed for the bucket; variant "default"
when nothing beat the default implementation), "passed" (correct, slower) or "rejected" (outside the
tolerance or raised; `message` says why). A bucket with any row for this environment counts as tuned. Table `recorded` keeps the shape
counts an engine recorded per model (added up over saves), the input of `link compile tune --workload
recorded`.
"""

from __future__ import annotations

import os
import platform
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from kernels.recorder import Bucket

_SCHEMA = """
CREATE TABLE IF NOT EXISTS results (
    op TEXT NOT NULL, bucket TEXT NOT NULL, dtype TEXT NOT NULL, device TEXT NOT NULL, torch_version TEXT NOT NULL,
    triton_version TEXT NOT NULL, model TEXT NOT NULL, variant TEXT NOT NULL,
    status TEXT NOT NULL, median_ms REAL, baseline_ms REAL, max_error REAL, calls INTEGER NOT NULL DEFAULT 0,
    message TEXT NOT NULL DEFAULT '', tuned_at REAL NOT NULL,
    PRIMARY KEY (op, bucket, dtype, device, torch_version, triton_version, model, variant)
);
CREATE TABLE IF NOT EXISTS recorded (
    model TEXT NOT NULL, op TEXT NOT NULL, bucket TEXT NOT NULL, dtype TEXT NOT NULL, calls INTEGER NOT NULL,
    PRIMARY KEY (model, op, bucket, dtype)
);
"""


def default_path() -> Path:
    """$LINK_COMPILE_DB when set, else $LINK_HOME/compile/winners.sqlite (LINK_HOME defaults to ~/.link)."""
    if os.environ.get("LINK_COMPILE_DB"):
        return Path(os.environ["LINK_COMPILE_DB"])
    return Path(os.environ.get("LINK_HOME") or Path.home() / ".link") / "compile" / "winners.sqlite"


def device_name(device: str = "cpu") -> str:
    """The accelerator's name (CUDA) or the CPU model from /proc/cpuinfo, with the core count."""
    if device == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name()
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), name)
    except OSError:
        pass
    return f"{name} x{os.cpu_count()}"


def triton_version() -> str:
    try:
        import triton
    except ImportError:
        return "none"
    return triton.__version__


@dataclass(frozen=True)
class Environment:
    """What a timing is valid for: the device, the library versions and the model."""

    device: str
    torch_version: str
    triton_version: str
    model: str

    @classmethod
    def current(cls, model: str, device: str = "cpu") -> "Environment":
        return cls(device_name(device), torch.__version__, triton_version(), model)


@dataclass(frozen=True)
class Result:
    """One row: a variant's verdict on a bucket (times in milliseconds)."""

    bucket: Bucket
    variant: str
    status: str
    median_ms: float | None = None
    baseline_ms: float | None = None
    max_error: float | None = None
    calls: int = 0
    message: str = ""
    tuned_at: float = 0.0
    env: Environment | None = None  # filled when read from the table

    @property
    def speedup(self) -> float | None:
        """baseline / median (the default's time over this variant's); None without timings."""
        if not self.median_ms or not self.baseline_ms:
            return None
        return self.baseline_ms / self.median_ms


class WinnerTable:
    """The results table in one SQLite file (created with its folder on first use).

    Args:
        path: the file (default: `default_path()`).
    """

    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path else default_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(_SCHEMA)

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=30)

    def put(self, env: Environment, result: Result) -> None:
        """Insert or replace the row of (env, result.bucket, result.variant)."""
        b = result.bucket
        with self._connect() as db:
            db.execute("INSERT OR REPLACE INTO results VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", (
                b.op, b.label, b.dtype, env.device, env.torch_version, env.triton_version, env.model, result.variant,
                result.status, result.median_ms, result.baseline_ms, result.max_error, result.calls, result.message,
                result.tuned_at or time.time()))

    def results(self, env: Environment | None = None) -> list[Result]:
        """Every row for `env` (every row when None), ordered by op, bucket, status."""
        query, args = "SELECT * FROM results", ()
        if env is not None:
            query += " WHERE device=? AND torch_version=? AND triton_version=? AND model=?"
            args = (env.device, env.torch_version, env.triton_version, env.model)
        with self._connect() as db:
            rows = db.execute(query + " ORDER BY op, bucket, dtype, status DESC, median_ms", args).fetchall()
        return [Result(Bucket.parse(r[0], r[1], r[2], r[6] if r[0] == "decode_step" else ""), r[7], r[8], r[9], r[10], r[11],
                       r[12], r[13], r[14], Environment(r[3], r[4], r[5], r[6])) for r in rows]

    def winners(self, env: Environment) -> dict[Bucket, Result]:
        """{bucket: the winning row} for `env` (variant "default" where nothing beat the default)."""
        return {r.bucket: r for r in self.results(env) if r.status == "winner"}

    def tuned(self, env: Environment) -> set[Bucket]:
        """Buckets with any verdict for `env` (not tuned again)."""
        return {r.bucket for r in self.results(env)}

    def forget(self, env: Environment) -> int:
        """Delete every row of `env` (to re-tune); returns the number deleted."""
        with self._connect() as db:
            cur = db.execute("DELETE FROM results WHERE device=? AND torch_version=? AND triton_version=? AND model=?",
                             (env.device, env.torch_version, env.triton_version, env.model))
            return cur.rowcount

    def add_counts(self, model: str, counts: dict[Bucket, int]) -> None:
        """Add recorded calls per bucket to `model`'s totals (kernel-op buckets and its step buckets)."""
        with self._connect() as db:
            for b, n in counts.items():
                if b.model and b.model != model:
                    continue
                db.execute("INSERT INTO recorded VALUES (?,?,?,?,?) ON CONFLICT(model, op, bucket, dtype) "
                           "DO UPDATE SET calls = calls + excluded.calls", (model, b.op, b.label, b.dtype, n))

    def counts(self, model: str) -> dict[Bucket, int]:
        """The recorded calls per bucket of `model` (empty when none were saved)."""
        with self._connect() as db:
            rows = db.execute("SELECT op, bucket, dtype, calls FROM recorded WHERE model=?", (model,)).fetchall()
        return {Bucket.parse(op, label, dtype, model if op == "decode_step" else ""): calls for op, label, dtype, calls in rows}
