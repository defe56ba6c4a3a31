"""Per-key rate limits (requests and tokens per minute) and budgets, shared by every gateway replica.

    limiter = RateLimiter(engine)                         # counters in the database
    limiter = RateLimiter(engine, redis_url="redis://127.0.0.1:6379/0")   # counters in Redis
    refusal = limiter.admit(identity)                     # None = admitted (and counted); else RateLimited
    retry_after_s = limiter.check(identity)               # the same, as seconds to wait (None = admitted)

    ledger = BudgetLedger(engine)
    reservation = ledger.reserve(key_id, max_cost_usd)    # raises BudgetExceeded before any backend call
    ledger.settle(reservation, actual_cost_usd)           # or ledger.release(reservation) on failure

Every counter update is one atomic statement (an upsert with RETURNING, a Redis MULTI, a conditional
UPDATE), so concurrent requests in many processes never over-admit. All methods block: call them from
the event loop through `asyncio.to_thread`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from sqlalchemy import Engine, delete, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite

from link.db.models import ApiKey, RateLimitCounter, nano_to_usd, usd_to_nano
from link.keys import KeyIdentity, KeyNotFound

# --- rate limits --------------------------------------------------------------------------------


class DatabaseCounters:
    """Window counters in the `rate_limit_counter` table (SQLite or PostgreSQL)."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._insert = postgresql.insert if engine.dialect.name == "postgresql" else sqlite.insert
        self._swept_window: int | None = None

    def add(self, key: str, window_start: int, requests: int, tokens: int) -> tuple[int, int]:
        """Add to a window's counters atomically; returns the window's new (requests, tokens)."""
        table = RateLimitCounter.__table__
        stmt = self._insert(table).values(key=key, window_start=window_start, requests=requests, tokens=tokens)
        stmt = stmt.on_conflict_do_update(
            index_elements=["key", "window_start"],
            set_={"requests": table.c.requests + stmt.excluded.requests, "tokens": table.c.tokens + stmt.excluded.tokens},
        ).returning(table.c.requests, table.c.tokens)
        with self.engine.begin() as connection:
            row = connection.execute(stmt).one()
        return row.requests, row.tokens

    def get(self, key: str, window_start: int) -> tuple[int, int]:
        table = RateLimitCounter.__table__
        with self.engine.connect() as connection:
            row = connection.execute(select(table.c.requests, table.c.tokens)
                                     .where(table.c.key == key, table.c.window_start == window_start)).first()
        return (row.requests, row.tokens) if row is not None else (0, 0)

    def sweep(self, before: int) -> None:
        """Delete windows that started before `before` (epoch s); once per window per process."""
        if self._swept_window == before:
            return
        self._swept_window = before
        with self.engine.begin() as connection:
            connection.execute(delete(RateLimitCounter.__table__).where(RateLimitCounter.__table__.c.window_start < before))

    def close(self) -> None:
        pass


class RedisCounters:
    """Window counters in Redis hashes `<prefix>:<key>:<window_start>` that expire after two windows."""

    def __init__(self, url: str, prefix: str, window_s: int):
        import redis

        self.client = redis.Redis.from_url(url)
        self.prefix = prefix
        self.ttl_s = 2 * window_s + 5

    def add(self, key: str, window_start: int, requests: int, tokens: int) -> tuple[int, int]:
        name = f"{self.prefix}:{key}:{window_start}"
        pipe = self.client.pipeline(transaction=True)
        pipe.hincrby(name, "requests", requests).hincrby(name, "tokens", tokens).expire(name, self.ttl_s)
        num_requests, num_tokens, _ = pipe.execute()
        return int(num_requests), int(num_tokens)

    def get(self, key: str, window_start: int) -> tuple[int, int]:
        values = self.client.hmget(f"{self.prefix}:{key}:{window_start}", ["requests", "tokens"])
        return int(values[0] or 0), int(values[1] or 0)

    def sweep(self, before: int) -> None:
        pass  # keys expire

    def close(self) -> None:
        self.client.close()


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
        engine: the database holding the counters (used when `redis_url` is None).
        redis_url: keep the counters in Redis instead (`LINK_REDIS_URL`), e.g. redis://127.0.0.1:6379/0.
        window: "fixed" (counts reset at each window start) or "sliding" (the last window's count weighs
            in linearly: estimate = previous * (1 - elapsed / window) + current; smooth, no double bursts
            at window edges).
        window_s: window length in seconds (60 for per-minute limits).
        prefix: Redis key prefix and database counter-key prefix (tests use a unique one).
        clock: seconds since the epoch (tests pass a fake clock).
    """

    def __init__(self, engine: Engine | None = None, redis_url: str | None = None, *,
                 window: Literal["fixed", "sliding"] = "sliding", window_s: int = 60, prefix: str = "link:rl",
                 clock: Callable[[], float] = time.time):
        if window not in ("fixed", "sliding"):
            raise ValueError(f'window must be "fixed" or "sliding", not {window!r}')
        if engine is None and redis_url is None:
            raise ValueError("RateLimiter needs a database engine or a Redis URL")
        self.is_sliding = window == "sliding"
        self.window_s = int(window_s)
        self.prefix = prefix
        self.clock = clock
        self.counters = RedisCounters(redis_url, prefix, self.window_s) if redis_url else DatabaseCounters(engine)
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
        now = self.clock()
        window_start = int(now // self.window_s) * self.window_s
        elapsed = now - window_start
        name = f"{self.prefix}:{key.key_id}"
        self.counters.sweep(window_start - self.window_s)
        num_requests, num_tokens = self.counters.add(name, window_start, 1, tokens)
        previous = self._previous_counts(name, window_start) if self.is_sliding else (0, 0)
        weight = 1 - elapsed / self.window_s if self.is_sliding else 0.0
        waits: list[tuple[float, str]] = []
        # (kind, limit, units this request needs, counts before it: this window, last window)
        for kind, limit, need, current, last in (("requests", key.rpm_limit, 1, num_requests - 1, previous[0]),
                                                 ("tokens", key.tpm_limit, max(tokens, 1), num_tokens - tokens, previous[1])):
            if limit is not None and last * weight + current + need > limit:
                waits.append((_wait_s(limit, need, current, last, elapsed, self.window_s, self.is_sliding), kind))
        if not waits:
            return None
        self.counters.add(name, window_start, -1, -tokens)  # refused requests do not count
        wait_s, kind = max(waits)
        return RateLimited(kind, max(0.001, wait_s))

    def check(self, key: KeyIdentity, tokens: int = 0) -> float | None:
        """`admit`, answering only the seconds to wait: None when admitted."""
        refusal = self.admit(key, tokens)
        return None if refusal is None else refusal.retry_after_s

    def _previous_counts(self, name: str, window_start: int) -> tuple[int, int]:
        """The last window's counts; read once per key and window by this process (a closed window only
        changes by tokens recorded late, which the next window's estimate can miss)."""
        if self._cached_window != window_start:
            self._cached_window, self._previous = window_start, {}
        if name not in self._previous:
            self._previous[name] = self.counters.get(name, window_start - self.window_s)
        return self._previous[name]

    def record_tokens(self, key: KeyIdentity, tokens: int) -> None:
        """Count `tokens` used by an admitted request of `key` (minus any estimate passed to `check`)."""
        if key.key_id is None or key.tpm_limit is None or tokens == 0:
            return
        window_start = int(self.clock() // self.window_s) * self.window_s
        self.counters.add(f"{self.prefix}:{key.key_id}", window_start, 0, tokens)

    def close(self) -> None:
        self.counters.close()


# --- budgets ------------------------------------------------------------------------------------


class BudgetExceeded(Exception):
    """The request's maximum cost does not fit in what is left of the key's budget."""

    def __init__(self, key_id: int, budget_usd: float, spend_usd: float, reserved_usd: float, max_cost_usd: float):
        self.key_id, self.budget_usd, self.spend_usd = key_id, budget_usd, spend_usd
        self.reserved_usd, self.max_cost_usd = reserved_usd, max_cost_usd
        super().__init__(f"budget of API key {key_id} exceeded: budget ${budget_usd:.6f}, spent ${spend_usd:.6f}, "
                         f"reserved by requests in flight ${reserved_usd:.6f}, this request may cost up to "
                         f"${max_cost_usd:.6f}")


@dataclass
class Reservation:
    """Money held for one request in flight, in integer nano-dollars; settled or released exactly once."""

    key_id: int
    amount_nusd: int
    is_open: bool = True

    @property
    def amount_usd(self) -> float:
        return nano_to_usd(self.amount_nusd)


class BudgetLedger:
    """Reserve a request's maximum cost before calling a backend; settle to the real cost afterwards.

    A reservation succeeds only when spend + reserved + max_cost <= budget, checked and applied by one
    conditional UPDATE, so concurrent requests (threads, processes, replicas sharing the database) can
    never jointly pass the budget; spend exceeds it only if a request's real cost exceeds its reserved
    maximum, by at most that request's cost. Keys without a budget are tracked (spend) but never refused.
    """

    def __init__(self, engine: Engine):
        self.engine = engine

    def reserve(self, key_id: int, max_cost_usd: float) -> Reservation:
        """Hold `max_cost_usd` (USD, >= 0) of key `key_id`'s budget.

        Raises:
            BudgetExceeded: it does not fit; nothing is held.
            KeyNotFound: no key with this id.
            ValueError: a negative cost.
        """
        if max_cost_usd < 0:
            raise ValueError(f"max_cost_usd must be >= 0, got {max_cost_usd}")
        amount = usd_to_nano(max_cost_usd)
        c = ApiKey.__table__.c
        stmt = (update(ApiKey.__table__)
                .where(c.id == key_id, or_(c.budget_nusd.is_(None), c.spend_nusd + c.reserved_nusd + amount <= c.budget_nusd))
                .values(reserved_nusd=c.reserved_nusd + amount))
        with self.engine.begin() as connection:
            if connection.execute(stmt).rowcount == 1:
                return Reservation(key_id, amount)
            row = connection.execute(select(c.budget_nusd, c.spend_nusd, c.reserved_nusd).where(c.id == key_id)).first()
        if row is None:
            raise KeyNotFound(f"no API key with id {key_id}")
        raise BudgetExceeded(key_id, nano_to_usd(row.budget_nusd), nano_to_usd(row.spend_nusd),
                             nano_to_usd(row.reserved_nusd), max_cost_usd)

    def settle(self, reservation: Reservation, actual_cost_usd: float) -> None:
        """Replace the hold by the real cost (USD, >= 0): reserved -= held, spend += actual, atomically.

        Raises:
            ValueError: the reservation was already settled or released, or a negative cost.
        """
        if actual_cost_usd < 0:
            raise ValueError(f"actual_cost_usd must be >= 0, got {actual_cost_usd}")
        self._close(reservation, usd_to_nano(actual_cost_usd))

    def release(self, reservation: Reservation) -> None:
        """Give the hold back without spending (the request failed before costing anything).

        Raises:
            ValueError: the reservation was already settled or released.
        """
        self._close(reservation, 0)

    def _close(self, reservation: Reservation, spend_nusd: int) -> None:
        if not reservation.is_open:
            raise ValueError(f"reservation of key {reservation.key_id} was already settled or released")
        reservation.is_open = False
        c = ApiKey.__table__.c
        with self.engine.begin() as connection:
            connection.execute(update(ApiKey.__table__).where(c.id == reservation.key_id).values(
                reserved_nusd=c.reserved_nusd - reservation.amount_nusd, spend_nusd=c.spend_nusd + spend_nusd))


def max_cost_usd(prompt_tokens: int, max_completion_tokens: int, input_cost_per_million: float,
                 output_cost_per_million: float) -> float:
    """Upper bound of a request's cost in USD: every prompt token plus the most completion tokens allowed."""
    return (prompt_tokens * input_cost_per_million + max_completion_tokens * output_cost_per_million) / 1e6
