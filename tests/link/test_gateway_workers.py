"""`link serve --workers 2` as a real process tree on loopback, over the mock OpenAI backend, on a private SQLite
file and on PostgreSQL (link/workers.py):

- 200 concurrent requests with a key whose budget admits exactly K = 30 of them and whose rate limit is R = 70 per
  minute: exactly 200 - R answered 429 `rate_limit_exceeded`, R - K 429 `insufficient_quota` and K 200, the key's
  spend is exactly K times one request's cost (never above the budget), nothing stays reserved, and both workers
  served requests (the log rows' `instance`: "<LINK_INSTANCE_ID>-w0" and "-w1").
- `kill -9` of every process of the gateway under load: every request whose answer completed more than 1 s before
  the kill has its log row; the gateway restarted under the same LINK_INSTANCE_ID releases the killed workers'
  budget holds at once; SIGTERM then lets the requests in flight finish, loses no row and exits 0.

    LINK_HOME=.link .venv/bin/python -m pytest -q tests/link/test_gateway_workers.py
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import httpx
import pytest
from sqlmodel import Session, select

from link.db import make_db_engine, upgrade
from link.db.models import ApiKey, RequestLog
from link.keys import create_key
from tests.link.gateway_launch import MASTER_KEY, UP, GatewayServer, mock_deployment, write_config
from tests.link.mock_launch import ROOT, free_port, start_mock_thread, wait_healthy

NUM_REQUESTS, K, R = 200, 30, 70
MAX_TOKENS = 4
OUTPUT_COST_PER_MILLION = 250.0   # no input price: a request holds and costs exactly 4 * 250 / 1e6 = $0.001
COST_NUSD = 1_000_000             # $0.001 in the ledger's nano-dollars
# The mock answers "You said: a b c d e" cut at max_tokens: exactly MAX_TOKENS completion tokens.
BODY = {"model": "priced", "messages": [{"role": "user", "content": "a b c d e"}], "max_tokens": MAX_TOKENS}
DURABILITY_S = 1.0                # a row of an answer completed this long before a kill -9 must be stored
LOAD_S, NUM_CLIENTS, PAUSE_S = 2.0, 2, 0.01   # the kill -9 test's load: about 100 requests per second in all


@pytest.fixture(scope="module")
def mock():
    # hang_s: a request with metadata {"mock_mode": "hang"} is answered normally after 1 s (in flight at a SIGTERM)
    with start_mock_thread(hang_s=1.0) as server:
        yield server


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request, new_database_url):
    url = new_database_url(request.param)
    upgrade(url)
    engine = make_db_engine(url)
    yield url, engine
    engine.dispose()


def _start(config: Path, database_url: str, home: Path, instance_id: str) -> GatewayServer:
    """`link serve --workers 2` in a session of its own (so that a kill reaches every process); waits for /health."""
    port = free_port()
    environ = {**os.environ, "PYTHONPATH": str(ROOT), "LINK_HOME": str(home), "LINK_DATABASE_URL": database_url,
               "LINK_MASTER_KEY": MASTER_KEY, "LINK_ENVIRONMENT": "development", "LINK_INSTANCE_ID": instance_id,
               "LINK_DRAIN_TIMEOUT_S": "20"}
    environ.pop("LINK_REDIS_URL", None)
    cmd = [sys.executable, "-m", "cli", "serve", "--config", str(config), "--port", str(port), "--workers", "2",
           "--log-level", "warning"]
    gateway = GatewayServer(port, process=subprocess.Popen(cmd, cwd=ROOT, env=environ, start_new_session=True))
    try:
        wait_healthy(gateway.url, 90, gateway.process, statuses=UP)
    except RuntimeError:
        _kill_all(gateway)
        raise
    return gateway


def _kill_all(gateway: GatewayServer) -> None:
    """kill -9 of the parent and every worker at once (their process group)."""
    try:
        os.killpg(gateway.process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    gateway.process.wait()


def _processes(gateway: GatewayServer) -> list[int]:
    found = subprocess.run(["pgrep", "-g", str(gateway.process.pid)], capture_output=True, text=True).stdout.split()
    return [int(pid) for pid in found]


def _rows(engine, ids) -> dict[str, RequestLog]:
    with Session(engine) as session:
        return {row.id: row for row in session.exec(select(RequestLog).where(RequestLog.id.in_(list(ids))))}


def _wait_for(condition, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _wait_workers(gateway: GatewayServer, engine, instance: str) -> None:
    """/health answers once one worker serves: wait until both have answered a request (the rows' `instance`)."""
    ids: list[str] = []

    def both_up() -> bool:
        response = httpx.post(gateway.url + "/v1/chat/completions", json=BODY,
                              headers={"Authorization": f"Bearer {MASTER_KEY}"})  # not limited, not billed
        ids.append(response.headers["x-link-request-id"])
        return {row.instance for row in _rows(engine, ids).values()} == {f"{instance}-w0", f"{instance}-w1"}

    assert _wait_for(both_up), "the second worker did not start"


def _ledger(engine, key_id: int) -> tuple[int, int]:
    with Session(engine) as session:
        key = session.get(ApiKey, key_id)
        return key.spend_nusd, key.reserved_nusd


def _wait_inside_one_window(needed_s: float = 10.0) -> None:
    """The sliding rate-limit window is the epoch minute: start where the whole burst fits in one (an exact count
    needs no earlier window weighing in)."""
    left = 60.0 - time.time() % 60.0
    if left < needed_s:
        time.sleep(left + 0.05)


async def _burst(url: str, key: str) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=NUM_REQUESTS, max_keepalive_connections=NUM_REQUESTS)
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:
        return await asyncio.gather(*[client.post(url + "/v1/chat/completions", json=BODY,
                                                  headers={"Authorization": f"Bearer {key}"})
                                      for _ in range(NUM_REQUESTS)])


def test_budget_and_rate_limit_are_exact_across_two_workers(mock, database, tmp_path):
    url, engine = database
    with Session(engine) as session:
        key, plaintext = create_key(session, "workers", budget_usd=K * COST_NUSD / 1e9, rpm_limit=R)
    config = write_config(tmp_path / "link.yaml", [mock_deployment("priced", mock.api_base, input_cost_per_million=0.0,
                                                                   output_cost_per_million=OUTPUT_COST_PER_MILLION)])
    instance = f"wk-{uuid.uuid4().hex[:8]}"
    gateway = _start(config, url, tmp_path, instance)
    try:
        _wait_workers(gateway, engine, instance)
        assert len(_processes(gateway)) == 3  # the parent and two workers
        _wait_inside_one_window()
        window = int(time.time() // 60)
        responses = asyncio.run(_burst(gateway.url, plaintext))
        assert int(time.time() // 60) == window, "the burst straddled a minute: the rate-limit count is not exact"
    finally:
        gateway.stop()  # SIGTERM: every worker drains and flushes its log
    assert gateway.process.returncode == 0

    codes = [r.json()["error"]["code"] if r.status_code != 200 else "ok" for r in responses]
    assert codes.count("rate_limit_exceeded") == NUM_REQUESTS - R
    assert codes.count("insufficient_quota") == R - K
    assert codes.count("ok") == K
    assert all(r.status_code == 429 for r, code in zip(responses, codes) if code != "ok")
    assert all(r.json()["usage"]["completion_tokens"] == MAX_TOKENS for r in responses if r.status_code == 200)
    assert all(r.headers["x-link-cost-usd"] == "0.001000000" for r in responses if r.status_code == 200)
    assert _ledger(engine, key.id) == (K * COST_NUSD, 0)  # spend is exactly the budget; nothing left held

    rows = _rows(engine, [r.headers["x-link-request-id"] for r in responses])
    assert len(rows) == NUM_REQUESTS  # every request's row, refusals included, written by the clean shutdown at last
    assert sorted(row.status for row in rows.values()) == sorted(
        ["ok"] * K + ["budget_exceeded"] * (R - K) + ["rate_limited"] * (NUM_REQUESTS - R))
    served = Counter(row.instance for row in rows.values())
    assert served.keys() == {f"{instance}-w0", f"{instance}-w1"}, served  # both workers took requests


def _load(url: str, key: str, stop: threading.Event, done: list[tuple[str, float]], failed: list[str]) -> None:
    """Send requests one after another until `stop`; record (request id, time.monotonic() at the answer's end).
    Paced (PAUSE_S between requests) so that no worker queues a full batch of rows: the writer's flush interval,
    not its batch size, then decides when a row is written."""
    with httpx.Client(timeout=10) as client:
        while not stop.wait(PAUSE_S):
            try:
                response = client.post(url + "/v1/chat/completions", json=BODY, headers={"Authorization": f"Bearer {key}"})
            except httpx.HTTPError:
                return  # the gateway was killed
            completed = time.monotonic()
            if response.status_code != 200:
                failed.append(response.text)
                return
            done.append((response.headers["x-link-request-id"], completed))


def test_kill_9_keeps_every_row_older_than_1_s_and_sigterm_loses_none(mock, database, tmp_path):
    url, engine = database
    with Session(engine) as session:
        key, plaintext = create_key(session, "killed", budget_usd=100.0)
    config = write_config(tmp_path / "link.yaml", [mock_deployment("priced", mock.api_base, input_cost_per_million=0.0,
                                                                   output_cost_per_million=OUTPUT_COST_PER_MILLION)])
    instance = f"wk-{uuid.uuid4().hex[:8]}"
    gateway = _start(config, url, tmp_path, instance)
    stop, done, failed = threading.Event(), [], []
    clients = [threading.Thread(target=_load, args=(gateway.url, plaintext, stop, done, failed))
               for _ in range(NUM_CLIENTS)]
    try:
        for client in clients:
            client.start()
        time.sleep(LOAD_S)
        killed_at = time.monotonic()
        _kill_all(gateway)  # under load: requests in flight, rows queued
    finally:
        stop.set()
        for client in clients:
            client.join()
        _kill_all(gateway)
    assert not failed, failed[0]
    old = [request_id for request_id, completed in done if completed < killed_at - DURABILITY_S]
    assert len(old) >= 20, f"too little load to test anything: {len(done)} requests answered"
    missing = set(old) - set(_rows(engine, old))
    assert not missing, f"{len(missing)} of {len(old)} rows older than {DURABILITY_S} s lost"

    # The same instance ids: each worker's start-up releases the holds its killed predecessor left, at once.
    gateway = _start(config, url, tmp_path, instance)
    try:
        _wait_workers(gateway, engine, instance)
        assert _ledger(engine, key.id)[1] == 0  # well before the killed workers' 30 s leases could expire
        spend = _ledger(engine, key.id)[0]
        assert spend >= len(done) * COST_NUSD  # every answered request was settled before its answer was sent
        # SIGTERM with requests in flight (each answered after 1 s): they finish, their rows are written, exit 0.
        answers: list[httpx.Response] = []
        headers = {"Authorization": f"Bearer {plaintext}"}
        slow = {**BODY, "metadata": {"mock_mode": "hang"}}
        senders = [threading.Thread(target=lambda: answers.append(
            httpx.post(gateway.url + "/v1/chat/completions", json=slow, headers=headers, timeout=30))) for _ in range(8)]
        for sender in senders:
            sender.start()
        deadline = time.monotonic() + 10
        while _ledger(engine, key.id)[1] < 8 * COST_NUSD and time.monotonic() < deadline:
            time.sleep(0.02)  # all 8 hold their cost: in flight in the workers
        gateway.process.send_signal(signal.SIGTERM)
        assert gateway.process.wait(30) == 0
        for sender in senders:
            sender.join()
    finally:
        _kill_all(gateway)
    assert [a.status_code for a in answers] == [200] * 8
    rows = _rows(engine, [a.headers["x-link-request-id"] for a in answers])
    assert len(rows) == 8 and {row.status for row in rows.values()} == {"ok"}
    assert _ledger(engine, key.id) == (spend + 8 * COST_NUSD, 0)


def test_each_worker_id_must_fit_the_owner_column():
    from pydantic import ValidationError

    from link.settings import get_settings
    from link.workers import worker_instance_id

    assert worker_instance_id("gw-a", 1) == "gw-a-w1" and worker_instance_id(None, 1) is None
    assert get_settings(instance_id="x" * 125, workers=10).workers == 10   # "-w9": 128 characters
    with pytest.raises(ValidationError, match="LINK_INSTANCE_ID is too long for 11 workers"):
        get_settings(instance_id="x" * 125, workers=11)                   # "-w10": 129
