"""Replicas with real engines: two `link engine serve` processes (SmolLM2-135M) behind one model name.

Both serve requests (fewest outstanding requests first); SIGKILLing one mid-run loses no request that had
not started streaming (the gateway retries it on the other replica before the first byte); the dead one
is ejected by the health check and readmitted once an engine answers on its port again.

Each engine gets one intra-op thread (the two share a 2-core machine with the gateway), an empty $LINK_HOME of its own
(no stored kernel winners to warm up) and no background tuning, as in tests/link/test_compose_topology.py. With
torch's default of one thread per core, the two engines' threads spin against each other on a busy machine: a step
took seconds, and since `link engine serve` steps on its event loop, /health waited for it past the gateway's 5 s
probe timeout; one failed probe ejects a replica, and the requests that came while both were ejected were answered
503 `no_healthy_deployment`.
"""

from __future__ import annotations

import asyncio
import re
import sys
from contextlib import ExitStack

import httpx
import pytest

from benchmarks.link_bench.link_server import fresh_link_home
from benchmarks.link_bench.processes import ServerProcess, free_port, python_env
from tests.link.gateway_launch import MASTER_KEY, gateway_settings, start_gateway_thread
from tests.link.test_gateway_replicas import load, replica_health, wait_for

pytestmark = pytest.mark.slow
MODEL = "smollm2-135m-instruct"
# Real engines on a shared 2-core CPU: a request can wait behind prefills well past the mock tests' 30 s
# (the deployments allow 120 s).
CLIENT_TIMEOUT_S = 120.0
AUTH = {"Authorization": f"Bearer {MASTER_KEY}"}


def start_engine(port: int, stack: ExitStack) -> ServerProcess:
    """`link engine serve` of MODEL on `port`, loading at once; its fresh $LINK_HOME is removed and the server stopped
    when `stack` closes."""
    cmd = [sys.executable, "-m", "cli", "engine", "serve", "--model", MODEL, "--port", str(port), "--kv-cache-mb", "64",
           "--no-auto-tune"]
    env = python_env(LINK_HOME=str(stack.enter_context(fresh_link_home())), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.pop("LINK_COMPILE_DB", None)
    server = ServerProcess(cmd, port, env=env)
    stack.callback(server.stop, timeout_s=5)
    return server


def num_finished(server: ServerProcess) -> float:
    """Finished requests counted by the engine's own /metrics (link_engine_requests_total, any reason)."""
    text = httpx.get(server.url + "/metrics").text
    return sum(float(v) for v in re.findall(r'^link_engine_requests_total\{[^}]*\} ([0-9.e+]+)$', text, re.M))


@pytest.fixture
def engine_stack():
    with ExitStack() as processes:
        yield processes


@pytest.fixture
def engines(engine_stack):
    servers = [start_engine(free_port(), engine_stack) for _ in range(2)]
    for server in servers:  # they load side by side
        server.wait_healthy(timeout_s=300)
    return servers


def test_two_engine_servers_share_load_survive_a_kill_and_are_readmitted(engines, engine_stack, new_database_url, tmp_path,
                                                                         monkeypatch):
    from link.config import parse_config

    import tests.link.test_gateway_replicas as replicas_module

    body = {"model": "rep", "messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 6, "temperature": 0}
    monkeypatch.setattr(replicas_module, "BODY", body)  # `load` posts this body
    deployments = [{"name": "rep", "kind": "openai", "model": MODEL, "api_base": server.url + "/v1", "timeout_s": 120,
                    "first_token_timeout_s": 60, "input_cost_per_million": 0.0, "output_cost_per_million": 0.0}
                   for server in engines]
    settings = gateway_settings(new_database_url("sqlite"), tmp_path, health_interval_s=0.3, eject_cooldown_s=1.0)
    with start_gateway_thread(settings, parse_config({"models": deployments})) as gateway:
        responses = asyncio.run(load(gateway.url, 12, 4, timeout_s=CLIENT_TIMEOUT_S))
        assert [r.status_code for r in responses] == [200] * 12
        answers = {r.json()["choices"][0]["message"]["content"] for r in responses}
        assert len(answers) == 1  # greedy: every replica gives the same answer
        served = [num_finished(server) for server in engines]
        assert min(served) >= 1 and sum(served) == 12, served

        victim, killed = engines[0], []

        def kill_midway(i: int) -> None:
            if i == 4 and not killed:
                victim.proc.kill()
                killed.append(i)

        responses = asyncio.run(load(gateway.url, 16, 4, kill_midway, timeout_s=CLIENT_TIMEOUT_S))
        assert killed and [r.status_code for r in responses] == [200] * 16  # no request lost
        assert {r.json()["choices"][0]["message"]["content"] for r in responses} == answers
        assert wait_for(lambda: replica_health(gateway) == [False, True], timeout_s=30)  # ejected

        port = int(victim.url.rsplit(":", 1)[1])
        victim.stop(timeout_s=1)
        engines[0] = start_engine(port, engine_stack)
        engines[0].wait_healthy(timeout_s=300)
        assert wait_for(lambda: replica_health(gateway) == [True, True], timeout_s=60)  # readmitted
        asyncio.run(load(gateway.url, 8, 4))
        assert num_finished(engines[0]) >= 1
        gateway.flush_log()
