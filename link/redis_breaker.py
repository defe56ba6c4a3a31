"""Rate-limit counters in Redis that cannot stall the gateway: a short timeout per call, a circuit breaker and a
fallback store.

    counters = FailoverCounters(RedisCounters(url, "link:rl", 60, timeout_s=0.25), DatabaseCounters(engine),
                                CircuitBreaker(max_failures=3, cooldown_s=5.0, name=url))
    num_requests, num_tokens = counters.run(lambda store: store.add(key, window_start, 1, 0))

A frozen Redis (it accepts connections and never answers) used to hold every rate-limited request for 5-10 s and
then fail it with a 500, while the waiting requests filled the worker threads that every other request needs.
Now, with the `LINK_REDIS_*` settings:
1. each Redis call gives up after `LINK_REDIS_TIMEOUT_S` (default 0.25 s), without retries (link/counters.py);
2. after `LINK_REDIS_BREAKER_FAILURES` failures in a row (default 3) the breaker opens: Redis is not called for
   `LINK_REDIS_BREAKER_COOLDOWN_S` (default 5 s);
3. then one call probes Redis (half-open) while the others keep to the fallback: its success closes the breaker,
   its failure opens it for another cool-down;
4. a call that fails, or finds the breaker open, runs on the fallback: the database's counters (the ones the
   limits use without LINK_REDIS_URL, shared by every replica that falls back too), or in-process counters for a
   limiter without a database. The limits stay enforced, on counts of their own: what one store counted is not
   seen by the other, so a window in which the store changes may admit up to its limit once more.
A warning is logged once per change of availability: when the breaker opens, and when Redis answers again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Literal, TypeVar

from link.counters import Counters, RedisCounters

logger = logging.getLogger(__name__)
T = TypeVar("T")


class CircuitBreaker:
    """closed (calls go through) -> open after `max_failures` failures in a row (no calls for `cooldown_s` s) ->
    half-open (one probe call) -> closed on its success, open again on its failure. Thread-safe.

    Args:
        max_failures: failures in a row that open the breaker (>= 1).
        cooldown_s: seconds the breaker stays open before a probe (> 0).
        name: what it guards, for the log ("Redis at redis://...").
        clock: monotonic seconds (tests pass a fake one).
    Raises:
        ValueError: max_failures < 1 or cooldown_s <= 0.
    """

    def __init__(self, max_failures: int = 3, cooldown_s: float = 5.0, *, name: str = "Redis",
                 clock: Callable[[], float] = time.monotonic):
        if max_failures < 1 or not cooldown_s > 0:
            raise ValueError(f"max_failures must be >= 1 and cooldown_s > 0, got {max_failures} and {cooldown_s}")
        self.max_failures, self.cooldown_s, self.name, self.clock = max_failures, cooldown_s, name, clock
        self.state: Literal["closed", "open", "half_open"] = "closed"
        self.num_failures = 0   # in a row
        self.opened_at = 0.0
        self._lock = threading.Lock()

    @property
    def is_closed(self) -> bool:
        return self.state == "closed"

    def allow(self) -> bool:
        """Whether this call may use the guarded service; the first call after a cool-down becomes the probe."""
        with self._lock:
            if self.state == "closed":
                return True
            if self.state == "open" and self.clock() - self.opened_at >= self.cooldown_s:
                self.state = "half_open"
                return True
            return False

    def record_success(self) -> None:
        with self._lock:
            was_closed = self.state == "closed"
            self.state, self.num_failures = "closed", 0
        if not was_closed:
            logger.warning("%s answers again: rate limits count there again", self.name)

    def record_failure(self, exc: BaseException) -> None:
        with self._lock:
            self.num_failures += 1
            was_closed = self.state == "closed"
            if self.state == "half_open" or (was_closed and self.num_failures >= self.max_failures):
                self.state, self.opened_at = "open", self.clock()
            opened = was_closed and self.state == "open"
        if opened:
            logger.warning("%s is unavailable after %d failures in a row (%s: %s): rate limits use the fallback "
                           "counters, and Redis is probed again every %.1f s", self.name, self.num_failures,
                           type(exc).__name__, exc, self.cooldown_s)


class FailoverCounters(Counters):
    """Redis counters behind a circuit breaker, with a fallback store for calls that fail or are not allowed.

    `run(operation)` applies a whole operation (e.g. a rate-limit admission: count, read, undo) to one store, so
    its steps never straddle the two.
    """

    def __init__(self, primary: RedisCounters, fallback: Counters, breaker: CircuitBreaker):
        self.primary, self.fallback, self.breaker = primary, fallback, breaker

    def run(self, operation: Callable[[Counters], T]) -> T:
        import redis

        if self.breaker.allow():
            try:
                result = operation(self.primary)
            except (redis.RedisError, OSError) as exc:
                self.breaker.record_failure(exc)
            else:
                self.breaker.record_success()
                return result
        return operation(self.fallback)

    def add(self, key: str, window_start: int, requests: int, tokens: int) -> tuple[int, int]:
        return self.run(lambda store: store.add(key, window_start, requests, tokens))

    def get(self, key: str, window_start: int) -> tuple[int, int]:
        return self.run(lambda store: store.get(key, window_start))

    def close(self) -> None:
        self.primary.close()
        self.fallback.close()
