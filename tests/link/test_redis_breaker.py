"""link.redis_breaker: the circuit breaker's states on a fake clock, and a rate limiter whose Redis refuses
connections falling back to its other counters (the database's, or this process's without one).

    LINK_HOME=.link .venv/bin/python -m pytest -q tests/link/test_redis_breaker.py
"""

from __future__ import annotations

import logging

import pytest

from link.keys import KeyIdentity
from link.limits import RateLimiter
from link.redis_breaker import CircuitBreaker
from tests.link.mock_launch import free_port


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_breaker_opens_probes_once_and_closes(caplog):
    caplog.set_level(logging.WARNING, logger="link.redis_breaker")
    clock = FakeClock()
    breaker = CircuitBreaker(max_failures=3, cooldown_s=5.0, name="Redis at test", clock=clock)
    for _ in range(2):
        assert breaker.allow()
        breaker.record_failure(TimeoutError("timed out"))
    breaker.record_success()                       # a success resets the count of failures in a row
    for _ in range(3):
        assert breaker.allow()
        breaker.record_failure(TimeoutError("timed out"))
    assert breaker.state == "open" and not breaker.allow()
    clock.now += 4.9
    assert not breaker.allow()                     # still cooling down
    clock.now += 0.1
    assert breaker.allow() and breaker.state == "half_open"
    assert not breaker.allow()                     # one probe at a time; the others use the fallback
    breaker.record_failure(ConnectionError("refused"))
    assert breaker.state == "open" and not breaker.allow()   # a failed probe: another cool-down
    clock.now += 5.0
    assert breaker.allow()
    breaker.record_success()
    assert breaker.is_closed and breaker.allow()
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2                      # one per change of availability
    assert "Redis at test is unavailable after 3 failures in a row (TimeoutError: timed out)" in messages[0]
    assert messages[1] == "Redis at test answers again: rate limits count there again"


def test_the_breaker_checks_its_settings():
    with pytest.raises(ValueError):
        CircuitBreaker(max_failures=0)
    with pytest.raises(ValueError):
        CircuitBreaker(cooldown_s=0.0)


def _fall_back(engine, prefix: str, caplog) -> tuple[list[bool], str]:
    """Five checks of a 3-per-minute key against a Redis nobody listens on: (allowed per check, breaker state)."""
    url = f"redis://:secret@127.0.0.1:{free_port()}/0"   # nothing listens: every connection is refused
    limiter = RateLimiter(engine, redis_url=url, window="fixed", prefix=prefix, breaker_failures=2,
                          breaker_cooldown_s=60.0)
    key = KeyIdentity(key_id=1, name="k", rpm_limit=3)
    try:
        return [limiter.check(key) is None for _ in range(5)], limiter.counters.breaker.state
    finally:
        limiter.close()


def test_a_refused_redis_falls_back_to_the_database(engine, unique_prefix, caplog):
    assert _fall_back(engine, unique_prefix, caplog) == ([True, True, True, False, False], "open")
    assert "secret" not in caplog.text and ":***@127.0.0.1" in caplog.text   # the log never shows the password


def test_a_refused_redis_without_a_database_falls_back_to_this_process(unique_prefix, caplog):
    assert _fall_back(None, unique_prefix, caplog) == ([True, True, True, False, False], "open")
    assert "secret" not in caplog.text and ":***@127.0.0.1" in caplog.text
