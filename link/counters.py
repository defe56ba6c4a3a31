"""Where the rate limiter keeps its window counters: the database (`rate_limit_counter`) or Redis.

    counters = DatabaseCounters(engine)                    # SQLite or PostgreSQL, shared by every replica
    counters = RedisCounters("redis://127.0.0.1:6379/0", "link:rl", window_s=60)
    num_requests, num_tokens = counters.add("link:rl:7", window_start, 1, 0)

Each `add` is one atomic step (an upsert with RETURNING, a Redis MULTI), so concurrent callers in many
processes read back exactly the counts they produced. All methods block.
"""

from __future__ import annotations

from sqlalchemy import Engine, delete, select
from sqlalchemy.dialects import postgresql, sqlite

from link.db.models import RateLimitCounter


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

