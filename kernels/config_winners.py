"""`ConfigWinnerTable`: tuned engine configurations, a sibling table in the kernel winners' SQLite file.

A row per (model, device, torch version, triton version, traffic-mix fingerprint): the winning
`EngineConfig` overrides as JSON (`{}` when the default won), the default's and the winner's
throughput (output tokens/s) and p99 TTFT (s) measured in the same run, the mix's readable signature
and size. A different mix (another fingerprint, `serving.tuning.traffic.mix_fingerprint`) is tuned and
stored separately. `kernels` knows nothing of `EngineConfig`: the overrides are plain JSON here and
`serving.tuning.config_search.from_json` turns them back into values.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from kernels.winners import Environment, WinnerTable

_SCHEMA = """
CREATE TABLE IF NOT EXISTS config_winners (
    model TEXT NOT NULL, device TEXT NOT NULL, torch_version TEXT NOT NULL, triton_version TEXT NOT NULL,
    fingerprint TEXT NOT NULL, signature TEXT NOT NULL, num_requests INTEGER NOT NULL, config TEXT NOT NULL,
    default_tokens_per_s REAL NOT NULL, default_ttft_p99_s REAL NOT NULL,
    tokens_per_s REAL NOT NULL, ttft_p99_s REAL NOT NULL, num_trials INTEGER NOT NULL, tuned_at REAL NOT NULL,
    PRIMARY KEY (model, device, torch_version, triton_version, fingerprint)
);
"""


@dataclass(frozen=True)
class ConfigWinner:
    """One tuned mix: the winning overrides (JSON-ready; {} = default) and both configurations' numbers."""

    fingerprint: str
    signature: str
    num_requests: int
    config: dict
    default_tokens_per_s: float
    default_ttft_p99_s: float
    tokens_per_s: float
    ttft_p99_s: float
    num_trials: int = 0
    tuned_at: float = 0.0
    env: Environment | None = field(default=None, compare=False)

    @property
    def speedup(self) -> float:
        return self.tokens_per_s / self.default_tokens_per_s if self.default_tokens_per_s > 0 else 1.0


class ConfigWinnerTable:
    """The `config_winners` table in the winner table's file (default `kernels.winners.default_path()`)."""

    def __init__(self, path: str | Path | None = None):
        self._kernels = WinnerTable(path)  # creates the file, its folder and WAL mode
        self.path = self._kernels.path
        with self._kernels._connect() as db:
            db.executescript(_SCHEMA)

    def put(self, env: Environment, winner: ConfigWinner) -> None:
        """Insert or replace the row of (env, winner.fingerprint)."""
        w = winner
        with self._kernels._connect() as db:
            db.execute("INSERT OR REPLACE INTO config_winners VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)", (
                env.model, env.device, env.torch_version, env.triton_version, w.fingerprint, w.signature, w.num_requests,
                json.dumps(w.config, sort_keys=True), w.default_tokens_per_s, w.default_ttft_p99_s, w.tokens_per_s,
                w.ttft_p99_s, w.num_trials, w.tuned_at or time.time()))

    def get(self, env: Environment, fingerprint: str) -> ConfigWinner | None:
        """The stored winner of a mix fingerprint in `env`, or None."""
        rows = [w for w in self.rows(env) if w.fingerprint == fingerprint]
        return rows[0] if rows else None

    def rows(self, env: Environment | None = None) -> list[ConfigWinner]:
        """Every row for `env` (every row when None), newest first."""
        query, args = "SELECT * FROM config_winners", ()
        if env is not None:
            query += " WHERE model=? AND device=? AND torch_version=? AND triton_version=?"
            args = (env.model, env.device, env.torch_version, env.triton_version)
        with self._kernels._connect() as db:
            rows = db.execute(query + " ORDER BY tuned_at DESC", args).fetchall()
        return [ConfigWinner(r[4], r[5], r[6], json.loads(r[7]), r[8], r[9], r[10], r[11], r[12], r[13],
                             Environment(r[1], r[2], r[3], r[0])) for r in rows]
