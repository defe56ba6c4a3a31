"""Where the response cache (link/response_cache.py) keeps its answers: this process's memory, or Redis.

    store = MemoryStore(max_entries=1000, max_bytes=64 << 20)     # LRU, per policy; called on the event loop
    store.put("k", b"{...}", ttl_s=300); store.get("k")          # bytes, or None (absent or expired)
    redis = RedisStore("redis://127.0.0.1:6379/0", "link:cache", timeout_s=0.25, cooldown_s=5)
    await redis.get("k"); await redis.put("k", b"...", ttl_s=300)  # never raise: an outage is a miss

The memory store is an LRU bounded twice: by entries and by bytes (the JSON of each answer); an entry is dropped
once its TTL passes (checked when read) or when it is the least recently used and the bounds are exceeded.
Redis keeps each answer under `<prefix>:<key>` with its TTL (`SET ... PX`); its size is Redis's own business
(`maxmemory` with an LRU policy). Each Redis call gives up after `timeout_s` without retries (as the rate-limit
counters do, link/counters.py); a failure logs one warning and keeps Redis out for `cooldown_s`, during which
every lookup is a miss and nothing is written: a cache outage never fails a request, it only costs its hits.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict

logger = logging.getLogger(__name__)


class MemoryStore:
    """An LRU of answers (bytes) with a TTL each, bounded by `max_entries` and `max_bytes`. Not thread-safe: the
    gateway calls it from its event loop only."""

    def __init__(self, max_entries: int, max_bytes: int, *, clock=time.monotonic):
        self.max_entries, self.max_bytes, self.clock = max_entries, max_bytes, clock
        self._entries: OrderedDict[str, tuple[float, bytes]] = OrderedDict()  # key -> (expires_at, value)
        self.num_bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> bytes | None:
        found = self._entries.get(key)
        if found is None:
            return None
        if found[0] <= self.clock():
            self._drop(key)
            return None
        self._entries.move_to_end(key)
        return found[1]

    def put(self, key: str, value: bytes, ttl_s: float) -> bool:
        """Keep `value` for `ttl_s` seconds; False (nothing kept) when it exceeds a quarter of `max_bytes`."""
        if len(value) > self.max_bytes // 4:
            return False
        if key in self._entries:
            self._drop(key)
        self._entries[key] = (self.clock() + ttl_s, value)
        self.num_bytes += len(value)
        while len(self._entries) > self.max_entries or self.num_bytes > self.max_bytes:
            self._drop(next(iter(self._entries)))
        return True

    def _drop(self, key: str) -> None:
        _, value = self._entries.pop(key)
        self.num_bytes -= len(value)


class RedisStore:
    """Answers in Redis under `<prefix>:<key>`; every failure is a miss (module docstring).

    Args:
        url: the Redis URL (`LINK_REDIS_URL`).
        prefix: the key prefix (`LINK_CACHE_REDIS_PREFIX`).
        timeout_s: the longest one call may take (connect, send, answer), in seconds.
        cooldown_s: seconds Redis is left alone after a failure.
    """

    def __init__(self, url: str, prefix: str, *, timeout_s: float = 0.25, cooldown_s: float = 5.0):
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self.client = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                                           retry=Retry(NoBackoff(), 0))
        self.url, self.prefix, self.cooldown_s = url, prefix, cooldown_s
        self.down_until = 0.0  # monotonic time before which Redis is not called
        self.num_failures = 0

    def _name(self, key: str) -> str:
        return f"{self.prefix}:{key}"

    def _call(self, operation):
        if time.monotonic() < self.down_until:
            return None
        try:
            result = operation()
        except Exception as exc:  # redis.RedisError, OSError: an outage, never the request's failure
            self.num_failures += 1
            if self.down_until == 0.0 or self.num_failures == 1:
                logger.warning("response cache: Redis at %s failed (%s: %s); lookups miss and answers are not stored "
                               "for %.1f s, then Redis is tried again", self.url, type(exc).__name__, exc, self.cooldown_s)
            self.down_until = time.monotonic() + self.cooldown_s
            return None
        if self.num_failures:
            logger.warning("response cache: Redis at %s answers again", self.url)
            self.num_failures = 0
        return result

    async def get(self, key: str) -> bytes | None:
        return await asyncio.to_thread(self._call, lambda: self.client.get(self._name(key)))

    async def put(self, key: str, value: bytes, ttl_s: float) -> bool:
        done = await asyncio.to_thread(self._call, lambda: self.client.set(self._name(key), value,
                                                                           px=max(1, int(ttl_s * 1000))))
        return bool(done)

    def close(self) -> None:
        self.client.close()
