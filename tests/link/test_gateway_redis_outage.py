"""Rate limits while Redis is frozen (it accepts connections and never answers), on SQLite and PostgreSQL: requests
are answered promptly and the limits hold on the database's counters, an unrelated request is not slowed, and when
a working Redis is back on the same address the circuit breaker closes and the limits count there again.

The frozen Redis is a tiny TCP server of this test; the working one a `redis-server` of our own on that same port
(the shared Redis at 6379 is never touched).

    LINK_HOME=.link .venv/bin/python -m pytest -q tests/link/test_gateway_redis_outage.py
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import socket
import subprocess
import threading
import time

import httpx
import pytest

from link.config import parse_config
from link.keys import create_key
from tests.link.gateway_launch import gateway_settings, mock_deployment, start_gateway_thread
from tests.link.mock_launch import start_mock_thread

BODY = {"model": "priced", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 5}
COOLDOWN_S = 1.0   # the breaker's cool-down in these tests (LINK_REDIS_BREAKER_COOLDOWN_S)


class FrozenServer:
    """Accepts TCP connections on a loopback port and never reads or answers (a hung Redis)."""

    def __init__(self):
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=128)
        self.port = self.listener.getsockname()[1]
        self.connections: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True, name="frozen-redis")
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:   # closed by stop()
                return
            self.connections.append(connection)

    def stop(self) -> None:
        # close() alone leaves a thread blocked in accept() holding the port in LISTEN (Linux), so the
        # redis-server that takes the port over could not bind it; shutdown() wakes the accept first.
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:   # already stopped
            pass
        self.listener.close()
        for connection in self.connections:
            connection.close()
        self.thread.join(timeout=5)


@pytest.fixture
def frozen_redis():
    server = FrozenServer()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def mock():
    with start_mock_thread() as server:
        yield server


@pytest.fixture
def gateway(db_url, mock, frozen_redis, tmp_path):
    config = parse_config({"models": [mock_deployment("priced", mock.api_base)]})
    settings = gateway_settings(db_url, tmp_path, redis_url=f"redis://127.0.0.1:{frozen_redis.port}/0",
                                redis_timeout_s=0.25, redis_breaker_failures=3, redis_breaker_cooldown_s=COOLDOWN_S)
    with start_gateway_thread(settings, config) as server:
        yield server


def _timed_post(url: str, key: str) -> tuple[int, float]:
    started = time.monotonic()
    response = httpx.post(url + "/v1/chat/completions", json=BODY, headers={"Authorization": f"Bearer {key}"}, timeout=60)
    return response.status_code, time.monotonic() - started


async def _burst(url: str, limited: str, num_limited: int, unrelated: str) -> tuple[list[tuple[int, float]], float]:
    """`num_limited` requests of the limited key at once and, once they are in, one of the unrelated key:
    (status and seconds of each limited request, seconds of the unrelated one)."""
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=num_limited + 1)) as client:
        async def one(key: str) -> tuple[int, float]:
            started = time.monotonic()
            response = await client.post(url + "/v1/chat/completions", json=BODY,
                                         headers={"Authorization": f"Bearer {key}"})
            return response.status_code, time.monotonic() - started

        limited_tasks = [asyncio.create_task(one(limited)) for _ in range(num_limited)]
        await asyncio.sleep(0.05)
        unrelated_status, unrelated_s = await one(unrelated)
        assert unrelated_status == 200
        return await asyncio.gather(*limited_tasks), unrelated_s


def _warnings(caplog, text: str) -> int:
    return sum(text in r.getMessage() for r in caplog.records if r.name == "link.redis_breaker")


def test_a_frozen_redis_costs_a_timeout_then_the_database_counts(gateway, session, caplog):
    caplog.set_level(logging.WARNING, logger="link.redis_breaker")
    _, limited = create_key(session, "frozen-rpm", rpm_limit=4)
    _, unrelated = create_key(session, "frozen-unlimited")
    # Breaker closed: each of these waits for one Redis timeout (0.25 s) at most, where it used to be 5-10 s and
    # then a 500, and the waits do not hold up the unrelated request. The bounds leave room for a loaded 2-core
    # machine (twelve concurrent requests) and stay far below the old 5 s.
    results, unrelated_s = asyncio.run(_burst(gateway.url, limited, 12, unrelated))
    assert unrelated_s < 2.0, f"the unrelated request took {unrelated_s:.2f} s"
    assert all(seconds < 3.0 for _, seconds in results), results
    assert sorted(status for status, _ in results) == [200] * 4 + [429] * 8   # the database's counters enforce it
    breaker = gateway.state.limiter.counters.breaker
    assert breaker.state == "open" and _warnings(caplog, "is unavailable") == 1
    # Breaker open: Redis is skipped, so every request is prompt, and the limit still holds.
    _, other = create_key(session, "frozen-rpm-2", rpm_limit=2)
    answers = [_timed_post(gateway.url, other) for _ in range(5)]
    assert [status for status, _ in answers] == [200, 200, 429, 429, 429]
    assert all(seconds < 2.0 for _, seconds in answers), answers
    assert _warnings(caplog, "is unavailable") == 1   # once per change, not per request


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs a redis-server binary to bring Redis back")
def test_the_breaker_closes_when_redis_is_back(gateway, frozen_redis, session, caplog):
    import redis

    caplog.set_level(logging.WARNING, logger="link.redis_breaker")
    _, limited = create_key(session, "back-rpm", rpm_limit=100)
    assert all(_timed_post(gateway.url, limited)[0] == 200 for _ in range(3))   # three timeouts open the breaker
    breaker = gateway.state.limiter.counters.breaker
    assert breaker.state == "open"
    frozen_redis.stop()
    assert not frozen_redis.thread.is_alive(), "the frozen server still holds its port"
    server = subprocess.Popen(["redis-server", "--port", str(frozen_redis.port), "--bind", "127.0.0.1", "--save", "",
                               "--appendonly", "no"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    client = redis.Redis(port=frozen_redis.port, socket_timeout=2)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if server.poll() is not None:
                    pytest.fail(f"redis-server exited {server.returncode}: {server.stdout.read()[-500:]}")
                assert time.monotonic() < deadline, "redis-server did not answer within 20 s"
                time.sleep(0.1)
        deadline = time.monotonic() + 10 * COOLDOWN_S
        while not breaker.is_closed and time.monotonic() < deadline:   # a request after the cool-down probes
            assert _timed_post(gateway.url, limited)[0] == 200
            time.sleep(0.2)
        assert breaker.is_closed and _warnings(caplog, "answers again") == 1
        key, plaintext = create_key(session, "back-rpm-2", rpm_limit=2)
        assert [_timed_post(gateway.url, plaintext)[0] for _ in range(3)] == [200, 200, 429]
        counted = [client.hgetall(name) for name in client.scan_iter(match=f"*:{key.id}:*")]
        assert counted == [{b"requests": b"2", b"tokens": b"0"}]   # counted in Redis again (the refusal undone)
    finally:
        client.close()
        server.terminate()
        server.wait(timeout=10)
