"""Where the rate limiter keeps its window counters: the database (`rate_limit_counter`), Redis, or this process.

    counters = DatabaseCounters(engine)                    # SQLite or PostgreSQL, shared by every replica
    counters = RedisCounters("redis://127.0.0.1:6379/0", "link:rl", window_s=60, timeout_s=0.25)
    counters = MemoryCounters()                            # this process only (Redis's fallback without a database)
    num_requests, num_tokens = counters.add("link:rl:7", window_start, 1, 0)
    counts = counters.run(lambda c: c.add(...))            # an operation on one store (link/redis_breaker.py
                                                           # picks Redis or its fallback per operation)

Each `add` is one atomic step (an upsert with RETURNING, a Redis MULTI, a lock), so concurrent callers in many
processes read back exactly the counts they produced. All methods block.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy import Engine, delete, select
from sqlalchemy.dialects import postgresql, sqlite

from link.db.models import RateLimitCounter

T = TypeVar("T")


class Counters(ABC):
    """Per-window (requests, tokens) counters under string keys."""

    @abstractmethod
    def add(self, key: str, window_start: int, requests: int, tokens: int) -> tuple[int, int]:
        """Add to a window's counters atomically; returns the window's new (requests, tokens)."""

    @abstractmethod
    def get(self, key: str, window_start: int) -> tuple[int, int]:
        """A window's (requests, tokens); (0, 0) when nothing was counted."""

    def sweep(self, before: int) -> None:
        """Forget windows that started before `before` (epoch s); a no-op where entries expire by themselves."""

    def close(self) -> None:
        pass

    def run(self, operation: Callable[[Counters], T]) -> T:
        """Apply `operation` to the store that serves now (this one; a failover store picks one per call)."""
        return operation(self)


class DatabaseCounters(Counters):
    """Window counters in the `rate_limit_counter` table (SQLite or PostgreSQL)."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._insert = postgresql.insert if engine.dialect.name == "postgresql" else sqlite.insert
        self._swept_window: int | None = None

    def add(self, key: str, window_start: int, requests: int, tokens: int) -> tuple[int, int]:
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



class RedisCounters(Counters):
    """Window counters in Redis hashes `<prefix>:<key>:<window_start>` that expire after two windows.

    Every call gives up after `timeout_s` seconds (connecting, sending or waiting for the answer) and is not
    retried: redis-py's defaults (5 s per try, 3 retries with backoff) held each request of a frozen Redis for
    5-10 s. A failure raises `redis.RedisError`; link/redis_breaker.py decides what to do next.
    """

    def __init__(self, url: str, prefix: str, window_s: int, *, timeout_s: float = 0.25):
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self.client = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                                           retry=Retry(NoBackoff(), 0))
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

    def close(self) -> None:
        self.client.close()


class MemoryCounters(Counters):
    """Window counters in this process (thread-safe), each replica its own: the fallback of Redis counters for a
    limiter without a database."""

    def __init__(self):
        self._counts: dict[tuple[str, int], tuple[int, int]] = {}
        self._lock = threading.Lock()

    def add(self, key: str, window_start: int, requests: int, tokens: int) -> tuple[int, int]:
        with self._lock:
            old_requests, old_tokens = self._counts.get((key, window_start), (0, 0))
            counts = self._counts[key, window_start] = (old_requests + requests, old_tokens + tokens)
        return counts

    def get(self, key: str, window_start: int) -> tuple[int, int]:
        with self._lock:
            return self._counts.get((key, window_start), (0, 0))

    def sweep(self, before: int) -> None:
        with self._lock:
            for entry in [e for e in self._counts if e[1] < before]:
                del self._counts[entry]

