"""Per-key rate limits (requests and tokens per minute), shared by every gateway replica.

    limiter = RateLimiter(engine)                         # counters in the database
    limiter = RateLimiter(engine, redis_url="redis://127.0.0.1:6379/0")   # counters in Redis (the database's
                                                          # while Redis does not answer: link/redis_breaker.py)
    refusal = limiter.admit(identity)                     # None = admitted (and counted); else RateLimited
    retry_after_s = limiter.check(identity)               # the same, as seconds to wait (None = admitted)

The counters live in link/counters.py (Redis behind a circuit breaker: link/redis_breaker.py); the budget ledger in link/budgets.py (its names are re-exported
here, where callers found them before). All methods block: call them from the event loop through
`asyncio.to_thread`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from sqlalchemy import Engine

from link.budgets import BudgetExceeded, BudgetLedger, Reservation, max_cost_usd
from link.counters import Counters, DatabaseCounters, MemoryCounters, RedisCounters
from link.keys import KeyIdentity
from link.redis_breaker import CircuitBreaker, FailoverCounters

__all__ = ["BudgetExceeded", "BudgetLedger", "RateLimited", "RateLimiter", "Reservation", "max_cost_usd"]


def _wait_s(limit: int, need: int, current: int, previous: int, elapsed: float, window_s: int, sliding: bool) -> float:
    """Seconds until `need` more units fit under `limit`, given this window's and the last window's counts."""
    if not sliding:
        return window_s - elapsed
    if current + need <= limit:
        # estimate = previous * (1 - t / W) + current + need <= limit; solve for t in this window.
        return max(0.0, window_s * (1 - (limit - current - need) / previous) - elapsed)
    # Too much in this window alone: wait for the next window, where this window's count decays.
    decay_s = window_s if need > limit else window_s * max(0.0, 1 - (limit - need) / current)
    return window_s - elapsed + decay_s


@dataclass(frozen=True)
class RateLimited:
    """A refused request: which limit refused it ("requests" per minute or "tokens" per minute; the one
    that takes longer to free up when both do) and the seconds after which a retry can succeed."""

    limit: Literal["requests", "tokens"]
    retry_after_s: float


class RateLimiter:
    """Per-key requests-per-minute and tokens-per-minute limits.

    Args:
        engine: the database holding the counters (used when `redis_url` is None, and while Redis fails).
        redis_url: keep the counters in Redis instead (`LINK_REDIS_URL`), e.g. redis://127.0.0.1:6379/0. While
            it fails or times out the limits count in the database (in this process when `engine` is None).
        window: "fixed" (counts reset at each window start) or "sliding" (the last window's count weighs
            in linearly: estimate = previous * (1 - elapsed / window) + current; smooth, no double bursts
            at window edges).
        window_s: window length in seconds (60 for per-minute limits).
        prefix: Redis key prefix and database counter-key prefix (tests use a unique one).
        clock: seconds since the epoch (tests pass a fake clock).
        redis_timeout_s: seconds each Redis call may take (`LINK_REDIS_TIMEOUT_S`).
        breaker_failures, breaker_cooldown_s: Redis failures in a row that open the circuit breaker, and the
            seconds before it probes Redis again (`LINK_REDIS_BREAKER_FAILURES`, `LINK_REDIS_BREAKER_COOLDOWN_S`).
    Raises:
        ValueError: an unknown window, neither a database nor Redis, or breaker settings out of range.
    """

    def __init__(self, engine: Engine | None = None, redis_url: str | None = None, *,
                 window: Literal["fixed", "sliding"] = "sliding", window_s: int = 60, prefix: str = "link:rl",
                 clock: Callable[[], float] = time.time, redis_timeout_s: float = 0.25, breaker_failures: int = 3,
                 breaker_cooldown_s: float = 5.0):
        if window not in ("fixed", "sliding"):
            raise ValueError(f'window must be "fixed" or "sliding", not {window!r}')
        if engine is None and redis_url is None:
            raise ValueError("RateLimiter needs a database engine or a Redis URL")
        self.is_sliding = window == "sliding"
        self.window_s = int(window_s)
        self.prefix = prefix
        self.clock = clock
        self.counters: Counters = DatabaseCounters(engine) if engine is not None else MemoryCounters()
        if redis_url:
            breaker = CircuitBreaker(breaker_failures, breaker_cooldown_s, name=f"Redis at {_without_password(redis_url)}")
            self.counters = FailoverCounters(RedisCounters(redis_url, prefix, self.window_s, timeout_s=redis_timeout_s),
                                             self.counters, breaker)
        self._cached_window: int | None = None
        self._previous: dict[str, tuple[int, int]] = {}

    def admit(self, key: KeyIdentity, tokens: int = 0) -> RateLimited | None:
        """Admit and count one request of `key`, or refuse it.

        Args:
            key: the authenticated key; its `rpm_limit` / `tpm_limit` apply (None = unlimited; the
                master key is never limited).
            tokens: tokens to count now (an estimate; 0 when the real count is recorded afterwards with
                `record_tokens`). A request needs max(tokens, 1) tokens of room under the TPM limit.

        Returns:
            None when admitted; else the limit that refused it and the seconds to wait (for `Retry-After`).
        """
        if key.key_id is None or (key.rpm_limit is None and key.tpm_limit is None):
            return None
        # One store for the whole admission: its count, its read and a refusal's undo never straddle Redis and
        # the fallback.
        return self.counters.run(lambda counters: self._admit(counters, key, tokens))

    def _admit(self, counters: Counters, key: KeyIdentity, tokens: int) -> RateLimited | None:
        now = self.clock()
        window_start = int(now // self.window_s) * self.window_s
        elapsed = now - window_start
        name = f"{self.prefix}:{key.key_id}"
        counters.sweep(window_start - self.window_s)
        num_requests, num_tokens = counters.add(name, window_start, 1, tokens)
        previous = self._previous_counts(counters, name, window_start) if self.is_sliding else (0, 0)
        weight = 1 - elapsed / self.window_s if self.is_sliding else 0.0
        waits: list[tuple[float, str]] = []
        # (kind, limit, units this request needs, counts before it: this window, last window)
        for kind, limit, need, current, last in (("requests", key.rpm_limit, 1, num_requests - 1, previous[0]),
                                                 ("tokens", key.tpm_limit, max(tokens, 1), num_tokens - tokens, previous[1])):
            if limit is not None and last * weight + current + need > limit:
                waits.append((_wait_s(limit, need, current, last, elapsed, self.window_s, self.is_sliding), kind))
        if not waits:
            return None
        counters.add(name, window_start, -1, -tokens)  # refused requests do not count
        wait_s, kind = max(waits)
        return RateLimited(kind, max(0.001, wait_s))

    def check(self, key: KeyIdentity, tokens: int = 0) -> float | None:
        """`admit`, answering only the seconds to wait: None when admitted."""
        refusal = self.admit(key, tokens)
        return None if refusal is None else refusal.retry_after_s

    def _previous_counts(self, counters: Counters, name: str, window_start: int) -> tuple[int, int]:
        """The last window's counts; read once per key and window by this process (a closed window only
        changes by tokens recorded late, which the next window's estimate can miss)."""
        if self._cached_window != window_start:
            self._cached_window, self._previous = window_start, {}
        if name not in self._previous:
            self._previous[name] = counters.get(name, window_start - self.window_s)
        return self._previous[name]

    def record_tokens(self, key: KeyIdentity, tokens: int) -> None:
        """Count `tokens` used by an admitted request of `key` (minus any estimate passed to `check`)."""
        if key.key_id is None or key.tpm_limit is None or tokens == 0:
            return
        window_start = int(self.clock() // self.window_s) * self.window_s
        self.counters.add(f"{self.prefix}:{key.key_id}", window_start, 0, tokens)

    def close(self) -> None:
        self.counters.close()


def _without_password(url: str) -> str:
    """A Redis URL fit for the log: its password replaced by "***"."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()

