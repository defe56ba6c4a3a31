"""Replicas: two backend processes behind one model name share the load; killing one mid-run loses no
request that had not started streaming (it is retried on the other replica before the first byte); the
dead replica is ejected, and readmitted once a process answers on its port again.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from tests.link.gateway_launch import MASTER_KEY, gateway_settings, mock_deployment, start_gateway_thread
from tests.link.mock_launch import start_mock_process

AUTH = {"Authorization": f"Bearer {MASTER_KEY}"}
BODY = {"model": "rep", "messages": [{"role": "user", "content": "replicated hello"}]}


@pytest.fixture
def replicas():
    servers = [start_mock_process("ok", chunk_delay_s=0.01) for _ in range(2)]
    yield servers
    for server in servers:
        server.kill()


def replica_health(gateway) -> list[bool]:
    return [r["healthy"] for r in httpx.get(gateway.url + "/health").json()["models"]["rep"]]


def wait_for(predicate, timeout_s: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


async def load(url: str, num_requests: int, concurrency: int, on_progress=None, timeout_s: float = 30.0) -> list[httpx.Response]:
    """`num_requests` whole chat requests, `concurrency` at a time; on_progress(i) after each answer."""
    semaphore = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=timeout_s) as client:
        async def one(i: int) -> httpx.Response:
            async with semaphore:
                response = await client.post(url + "/v1/chat/completions", json=BODY, headers=AUTH)
                if on_progress is not None:
                    await asyncio.to_thread(on_progress, i)
                return response
        return await asyncio.gather(*(one(i) for i in range(num_requests)))


def test_replicas_share_load_survive_a_kill_and_are_readmitted(replicas, new_database_url, tmp_path):
    from link.config import parse_config
    from tests.link.mock_launch import start_mock_process as restart

    config = parse_config({"models": [mock_deployment("rep", r.api_base) for r in replicas]})
    settings = gateway_settings(new_database_url("sqlite"), tmp_path, health_interval_s=0.2, eject_cooldown_s=0.5)
    with start_gateway_thread(settings, config) as gateway:
        responses = asyncio.run(load(gateway.url, 40, 8))
        assert all(r.status_code == 200 for r in responses)
        served = [r.stats()["chat"] for r in replicas]
        assert min(served) >= 10, served  # fewest-outstanding balancing spreads the load

        victim = replicas[0]
        killed = []

        def kill_midway(i: int) -> None:
            if i == 15 and not killed:
                victim.kill()
                killed.append(i)

        responses = asyncio.run(load(gateway.url, 80, 8, kill_midway))
        assert killed and [r.status_code for r in responses] == [200] * 80  # no request lost
        assert all(r.json()["choices"][0]["message"]["content"] == "You said: replicated hello" for r in responses)
        assert wait_for(lambda: replica_health(gateway) == [False, True])  # ejected

        replicas[0] = restart("ok", port=victim.port)
        assert wait_for(lambda: replica_health(gateway) == [True, True])  # readmitted by the health check
        asyncio.run(load(gateway.url, 20, 4))
        assert replicas[0].stats()["chat"] > 0
        gateway.flush_log()
