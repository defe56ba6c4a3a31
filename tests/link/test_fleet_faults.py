"""Faults of a fleet (issue 39, item 5), with real processes against a PostgreSQL cluster and a Redis of the test's
own on free ports (tests/link/private_services.py; the machine's shared 5432 and 6379 are never touched):

1. an engine replica SIGKILLed mid-load: requests without streamed bytes are retried on the other replica, streams
   already sending end with one error event, every request has its log row;
2. a gateway replica SIGKILLed: the other keeps serving, and the budget holds of the dead one are released once its
   lease expires;
3. PostgreSQL restarted under load: keys without a budget keep being answered and their rows (and spend) are written
   once it is back; a key with a budget is refused with a 503 naming the cause (fail closed);
4. Redis stopped: the rate limits hold exactly on the database's counters, across two gateways.

Every test counts requests sent, answered, retried, refused and failed, and the request-log rows written, read
from the database. Skipped only where the PostgreSQL server binaries or redis-server are missing.

    LINK_HOME=.link .venv/bin/python -m pytest -q tests/link/test_fleet_faults.py
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from link.config import parse_config
from tests.link.gateway_launch import (MASTER_KEY, gateway_settings, mock_deployment, start_gateway_process,
                                       start_gateway_thread, write_config)
from tests.link.mock_launch import start_mock_process, start_mock_thread
from tests.link.private_services import PrivatePostgres, PrivateRedis, missing_binaries
from tests.link.sse import sse_payloads

pytestmark = pytest.mark.skipif(bool(missing_binaries()), reason=f"needs {' and '.join(missing_binaries())}")


@pytest.fixture(scope="module")
def postgres():
    with PrivatePostgres.start() as server:
        yield server


@pytest.fixture(scope="module")
def redis_server():
    with PrivateRedis.start() as server:
        yield server


def new_database(postgres: PrivatePostgres) -> str:
    return postgres.create_database(f"fleet_{uuid.uuid4().hex[:10]}")


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def chat(content: str, *, stream: bool = False, **fields) -> dict:
    return {"model": "rep", "messages": [{"role": "user", "content": content}], "stream": stream, **fields}


def new_key(url: str, name: str, **fields) -> tuple[int, str]:
    """A stored API key in the database at `url` (migrated by a gateway): (its id, its plaintext)."""
    from sqlmodel import Session

    from link.db import make_db_engine
    from link.keys import create_key

    engine = make_db_engine(url)
    try:
        with Session(engine) as session:
            key, plaintext = create_key(session, name, **fields)
            return key.id, plaintext
    finally:
        engine.dispose()


def query(url: str, sql: str, **params) -> list[dict]:
    """Rows of a read-only SQL query on the database at `url`, as dicts."""
    from sqlalchemy import text

    from link.db import make_db_engine

    engine = make_db_engine(url)
    try:
        with engine.connect() as connection:
            return [dict(row._mapping) for row in connection.execute(text(sql), params)]
    finally:
        engine.dispose()


def log_rows(url: str) -> dict[str, dict]:
    """Every request-log row, by request id."""
    return {row["id"]: row for row in query(url, "SELECT id, api_key_id, status, http_status, deployment, decision, "
                                                  "cost_usd, error FROM request_log")}


def wait_for(predicate, timeout_s: float = 15.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"{what} not reached within {timeout_s} s"
        time.sleep(0.05)


# 1. An engine replica killed mid-load ---------------------------------------------------------------------------

NUM_PAIRS = 3          # of streams and of whole requests: one of each pair lands on each replica (fewest outstanding)
HANG_S = 2.5           # a whole request's wait on a replica before its answer (the mock's "hang" mode, then "ok")
STREAM_WORDS = 40      # words of each streamed answer, one chunk each, CHUNK_DELAY_S apart
CHUNK_DELAY_S = 0.1


async def _replica_kill_load(gateway_url: str, replicas, victim) -> tuple[list, list, int]:
    """Open NUM_PAIRS streams and NUM_PAIRS whole requests one at a time (each after the previous reached a replica, so
    fewest-outstanding routing alternates), wait until every stream has sent content, SIGKILL `victim`; returns
    (streams' (status, body), whole answers, requests the victim had received)."""
    served = lambda: sum(r.stats()["chat"] for r in replicas)  # noqa: E731
    first_content: list[asyncio.Event] = []
    async with httpx.AsyncClient(timeout=30, headers=bearer(MASTER_KEY)) as client:
        async def one_stream(i: int, started: asyncio.Event) -> tuple[int, str, str]:
            body = chat(" ".join(f"s{i}w{k}" for k in range(STREAM_WORDS - 2)), stream=True)
            async with client.stream("POST", gateway_url + "/v1/chat/completions", json=body) as response:
                parts = []
                async for part in response.aiter_text():
                    parts.append(part)
                    if "".join(parts).count("data: ") >= 3:  # the role chunk and a first word
                        started.set()
                return response.status_code, response.headers["x-link-request-id"], "".join(parts)

        async def one_whole(i: int) -> httpx.Response:
            return await client.post(gateway_url + "/v1/chat/completions",
                                     json=chat(f"whole {i}", metadata={"mock_mode": "hang"}))

        tasks = []
        for i in range(2 * NUM_PAIRS):
            started = asyncio.Event()
            first_content.append(started)
            tasks.append(asyncio.create_task(one_stream(i, started)))
            await asyncio.to_thread(wait_for, lambda n=len(tasks): served() == n, 10.0, "stream at a replica")
        whole_tasks = []
        for i in range(2 * NUM_PAIRS):
            whole_tasks.append(asyncio.create_task(one_whole(i)))
            n = len(tasks) + len(whole_tasks)
            await asyncio.to_thread(wait_for, lambda n=n: served() == n, 10.0, "whole request at a replica")
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in first_content)), 10)
        num_at_victim = victim.stats()["chat"]
        victim.kill()
        return await asyncio.gather(*tasks), await asyncio.gather(*whole_tasks), num_at_victim


def test_an_engine_replica_killed_mid_load(postgres, tmp_path):
    url = new_database(postgres)
    replicas = [start_mock_process("ok", chunk_delay_s=CHUNK_DELAY_S, hang_s=HANG_S) for _ in range(2)]
    victim, survivor = replicas
    try:
        timeouts = {"timeout_s": 10.0, "first_token_timeout_s": 5.0}
        config = parse_config({"models": [mock_deployment("rep", r.api_base, **timeouts) for r in replicas]})
        with start_gateway_thread(gateway_settings(url, tmp_path), config) as gateway:
            streams, wholes, num_at_victim = asyncio.run(_replica_kill_load(gateway.url, replicas, victim))
            num_survivor_served = survivor.stats()["chat"]
            gateway.flush_log()
    finally:
        for server in replicas:
            server.kill()

    sent = 4 * NUM_PAIRS
    assert num_at_victim == sent // 2  # the routing alternated: half of each kind was on the victim when it died
    # Whole requests: the ones on the victim had no byte yet, so each was retried once on the survivor.
    assert [r.status_code for r in wholes] == [200] * (2 * NUM_PAIRS)
    assert [r.json()["choices"][0]["message"]["content"] for r in wholes] == [f"You said: whole {i}"
                                                                              for i in range(2 * NUM_PAIRS)]
    # Streams: every one was open with content when the victim died; its own end with exactly one error event.
    failed, completed = [], []
    for i, (status, request_id, text) in enumerate(streams):
        assert status == 200
        payloads = sse_payloads(text)
        errors = [json.loads(p) for p in payloads if '"error"' in p]
        if errors:
            assert len(errors) == 1 and payloads[-1] == json.dumps(errors[0], separators=(",", ":"))
            assert errors[0]["error"]["code"] == "backend_unavailable"
            failed.append(request_id)
        else:
            words = "".join(json.loads(p)["choices"][0]["delta"].get("content") or "" for p in payloads)
            assert words == "You said: " + " ".join(f"s{i}w{k}" for k in range(STREAM_WORDS - 2))
            completed.append(request_id)
    assert len(failed) == NUM_PAIRS and len(completed) == NUM_PAIRS
    # The survivor served its own half and the victim's whole requests again.
    assert num_survivor_served == sent // 2 + NUM_PAIRS

    rows = log_rows(url)
    assert len(rows) == sent  # no log row lost
    by_status = sorted(row["status"] for row in rows.values())
    assert by_status == ["error"] * NUM_PAIRS + ["ok"] * (sent - NUM_PAIRS)
    assert {rows[i]["status"] for i in failed} == {"error"} and all(rows[i]["deployment"] == "rep#0" for i in failed)
    retried = [row for row in rows.values() if (row["decision"] or {}).get("attempts")]
    assert len(retried) == NUM_PAIRS
    for row in retried:
        assert row["status"] == "ok" and row["deployment"] == "rep#1"
        assert [a["deployment"] for a in row["decision"]["attempts"]] == ["rep#0"]


# 2. A gateway replica killed ------------------------------------------------------------------------------------

def test_a_gateway_replica_killed_the_other_keeps_serving(postgres, redis_server, tmp_path):
    url = new_database(postgres)
    with start_mock_process("ok", chunk_delay_s=0.1) as backend:
        config = write_config(tmp_path / "link.yaml", [mock_deployment("rep", backend.api_base, timeout_s=30.0)])
        env = {"LINK_REDIS_URL": redis_server.url, "LINK_BUDGET_LEASE_S": "1.5"}
        with ThreadPoolExecutor(2) as pool:  # both start at once (a few seconds each)
            gateways = list(pool.map(lambda i: start_gateway_process(config, url, tmp_path / f"home{i}",
                                                                     LINK_INSTANCE_ID=f"gw-{i}", **env), range(2)))
        victim, survivor = gateways
        try:
            key_id, key = new_key(url, "fleet-budgeted", budget_usd=100.0)
            # Both serve, and their rows reach the shared database.
            before = [httpx.post(g.base_url + "/chat/completions", json=chat(f"before {i}"), headers=bearer(key),
                                 timeout=30) for i in range(6) for g in gateways]
            assert [r.status_code for r in before] == [200] * 12
            wait_for(lambda: len(log_rows(url)) == 12, what="12 log rows")
            spend_before = query(url, "SELECT spend_nusd, reserved_nusd FROM api_key WHERE id = :id", id=key_id)[0]
            assert spend_before["reserved_nusd"] == 0

            async def kill_under_load() -> tuple[list, list]:
                async with httpx.AsyncClient(timeout=30, headers=bearer(key)) as client:
                    async def on(gateway, i: int):
                        try:
                            return await client.post(gateway.base_url + "/chat/completions",
                                                     json=chat(f"during {i} " + "x " * 10, stream=True))
                        except httpx.HTTPError as exc:
                            return exc
                    doomed = [asyncio.create_task(on(victim, i)) for i in range(3)]
                    kept = [asyncio.create_task(on(survivor, i)) for i in range(6)]
                    # Wait until the victim holds its three reservations (the requests are at the backend).
                    await asyncio.to_thread(wait_for, lambda: query(
                        url, "SELECT count(*) AS n FROM budget_reservation WHERE owner = 'gw-0'")[0]["n"] == 3,
                        10.0, "the victim's holds")
                    victim.process.send_signal(signal.SIGKILL)
                    victim.process.wait()
                    return await asyncio.gather(*doomed), await asyncio.gather(*kept)

            doomed, kept = asyncio.run(kill_under_load())
            assert all(isinstance(r, httpx.HTTPError) for r in doomed), doomed  # their connections dropped
            assert [r.status_code for r in kept] == [200] * 6 and all(r.text.endswith("data: [DONE]\n\n") for r in kept)
            after = [httpx.post(survivor.base_url + "/chat/completions", json=chat(f"after {i}"), headers=bearer(key),
                                timeout=30) for i in range(6)]
            assert [r.status_code for r in after] == [200] * 6
            # The survivor's heartbeat releases the dead replica's holds once its lease (1.5 s) has expired.
            wait_for(lambda: query(url, "SELECT reserved_nusd FROM api_key WHERE id = :id", id=key_id)[0][
                "reserved_nusd"] == 0, 15.0, "the dead replica's holds released")
            assert query(url, "SELECT count(*) AS n FROM budget_reservation")[0]["n"] == 0
            ids = {r.headers["x-link-request-id"] for r in [*before, *kept, *after]}
            wait_for(lambda: ids <= set(log_rows(url)), what="the survivor's log rows")
        finally:
            for gateway in gateways:
                gateway.stop()
    rows = log_rows(url)
    # The killed replica's three requests in flight died with it (no row: documented); every other one is there.
    assert len(rows) == 12 + 6 + 6 and set(rows) == ids
    assert all(row["status"] == "ok" for row in rows.values())
    # The spend is exactly the sum of the answered requests' costs: the dead holds were released, not spent.
    from link.budgets import ledger_nano

    spend = query(url, "SELECT spend_nusd FROM api_key WHERE id = :id", id=key_id)[0]["spend_nusd"]
    assert spend == sum(ledger_nano(row["cost_usd"], "cost") for row in rows.values())


# 3. PostgreSQL restarted under load -----------------------------------------------------------------------------

def test_postgres_restarted_under_load(tmp_path):
    with PrivatePostgres.start() as postgres, start_mock_thread("ok", chunk_delay_s=0.05) as backend:
        url = new_database(postgres)
        config = parse_config({"models": [mock_deployment("rep", backend.api_base)]})
        settings = gateway_settings(url, tmp_path, budget_lease_s=1.5)
        with start_gateway_thread(settings, config) as gateway:
            free_id, free = new_key(url, "fleet-free")
            paid_id, paid = new_key(url, "fleet-paid", budget_usd=100.0)
            limited_id, limited = new_key(url, "fleet-limited", rpm_limit=100)  # counted in the database (no Redis)
            _, unseen = new_key(url, "fleet-unseen")  # never verified before the outage

            def post(key: str, content: str, **fields) -> httpx.Response:
                return httpx.post(gateway.base_url + "/chat/completions", json=chat(content, **fields),
                                  headers=bearer(key), timeout=30)

            before = [post(key, f"before {i}") for i in range(4) for key in (free, paid)] + [post(limited, "before")]
            assert [r.status_code for r in before] == [200] * 9
            gateway.flush_log()

            async def outage() -> tuple[httpx.Response, list, list, httpx.Response]:
                async with httpx.AsyncClient(timeout=30) as client:
                    async def send(key: str, content: str, **fields) -> httpx.Response:
                        return await client.post(gateway.base_url + "/chat/completions", json=chat(content, **fields),
                                                 headers=bearer(key))
                    # A stream of the budgeted key holds its reservation across the outage (40 chunks, 2 s).
                    long_stream = asyncio.create_task(send(paid, " ".join(["w"] * 38), stream=True))
                    await asyncio.to_thread(wait_for, lambda: gateway.state.accounting.ledger is not None and query(
                        url, "SELECT count(*) AS n FROM budget_reservation")[0]["n"] == 1, 10.0, "the stream's hold")
                    await asyncio.to_thread(postgres.stop)
                    frees = await asyncio.gather(*(send(free, f"during {i}") for i in range(8)))
                    paids = await asyncio.gather(*(send(paid, f"refused {i}") for i in range(4)))
                    unseen_answer = await send(unseen, "who am I")
                    limited_answer = await send(limited, "count me")
                    return await long_stream, frees, paids, unseen_answer, limited_answer

            stream, frees, paids, unseen_answer, limited_answer = asyncio.run(outage())
            writer, ledger = gateway.state.log_writer, gateway.state.accounting.ledger
            # Every row is kept in memory (1 stream + 8 + 4 + 1 + 1 = 15; a stream's row is queued just after its last
            # byte), and the ledger keeps 9 closings: the stream's settle and the spend of the 8 answers of the key
            # without a budget. Nothing can be written before PostgreSQL is back, so these counts are exact.
            wait_for(lambda: (writer.num_pending, ledger.num_unapplied) == (15, 9), 5.0, "15 rows and 9 settlements kept")
            assert (writer.num_written, writer.num_failed, writer.num_dropped) == (9, 0, 0)
            postgres.start_again()
            assert writer.flush(30.0), "the request log was not written once PostgreSQL was back"
            wait_for(lambda: ledger.num_unapplied == 0, 15.0, "the kept settlements applied")
        rows = log_rows(url)
        totals = {key_id: query(url, "SELECT spend_nusd, reserved_nusd FROM api_key WHERE id = :id", id=key_id)[0]
                  for key_id in (free_id, paid_id)}

    # During the outage: the keys without a budget were answered, the budgeted one refused with the cause.
    assert stream.status_code == 200 and stream.text.endswith("data: [DONE]\n\n") and '"error"' not in stream.text
    assert [r.status_code for r in frees] == [200] * 8
    assert all(r.json()["choices"][0]["message"]["content"] == f"You said: during {i}" for i, r in enumerate(frees))
    assert [r.status_code for r in paids] == [503] * 4
    for response in paids:
        error = response.json()["error"]
        assert error["code"] == "budget_ledger_unavailable" and error["type"] == "server_error"
        assert "budget ledger's database is unreachable" in error["message"] and "fleet-paid" in error["message"]
        assert response.headers["retry-after"] == "1"
    assert unseen_answer.status_code == 503 and unseen_answer.json()["error"]["code"] == "database_unavailable"
    # A key with a rate limit: its counters live in the database (no Redis here), so it is refused too.
    assert limited_answer.status_code == 503 and limited_answer.json()["error"]["code"] == "database_unavailable"
    assert "rate limits of API key 'fleet-limited' cannot be checked" in limited_answer.json()["error"]["message"]
    # The 15 rows kept in memory were written once PostgreSQL answered, beside the 9 written before.
    assert len(rows) == 9 + 1 + 8 + 4 + 1 + 1
    by_key = {k: sorted((r["status"], r["http_status"]) for r in rows.values() if r["api_key_id"] == k)
              for k in (free_id, paid_id, limited_id, None)}
    assert by_key[free_id] == [("ok", 200)] * 12
    assert by_key[paid_id] == [("error", 503)] * 4 + [("ok", 200)] * 5
    assert by_key[limited_id] == [("error", 503), ("ok", 200)]
    assert by_key[None] == [("error", 503)]
    # The spend of both keys is exactly what their answered requests cost, the outage's included; nothing held.
    from link.budgets import ledger_nano

    for key_id in (free_id, paid_id):
        costs = [ledger_nano(r["cost_usd"], "cost") for r in rows.values() if r["api_key_id"] == key_id]
        assert totals[key_id] == {"spend_nusd": sum(costs), "reserved_nusd": 0}
        assert all((cost > 0) == (row["status"] == "ok") for cost, row in zip(costs, (
            r for r in rows.values() if r["api_key_id"] == key_id)))  # refusals cost nothing


# 4. Redis down --------------------------------------------------------------------------------------------------

def test_rate_limits_hold_on_the_database_with_redis_stopped(postgres, tmp_path):
    url = new_database(postgres)
    with PrivateRedis.start() as redis_server, start_mock_thread("ok") as backend:
        config = parse_config({"models": [mock_deployment("rep", backend.api_base)]})
        settings = [gateway_settings(url, tmp_path / f"home{i}", redis_url=redis_server.url, redis_timeout_s=0.25,
                                     redis_breaker_failures=3, redis_breaker_cooldown_s=30.0) for i in range(2)]
        with start_gateway_thread(settings[0], config) as first, start_gateway_thread(settings[1], config) as second:
            pair = (first, second)
            shared_id, shared = new_key(url, "fleet-rpm-redis", rpm_limit=3)
            answers = [httpx.post(pair[i % 2].base_url + "/chat/completions", json=chat(f"r {i}"), headers=bearer(shared),
                                  timeout=30).status_code for i in range(6)]
            assert answers == [200, 200, 200, 429, 429, 429]  # counted in Redis, shared by both gateways
            assert query(url, "SELECT count(*) AS n FROM rate_limit_counter")[0]["n"] == 0

            redis_server.stop()
            key_id, key = new_key(url, "fleet-rpm-db", rpm_limit=4)
            statuses = [httpx.post(pair[i % 2].base_url + "/chat/completions", json=chat(f"d {i}"), headers=bearer(key),
                                   timeout=30) for i in range(10)]
            assert [r.status_code for r in statuses] == [200] * 4 + [429] * 6
            assert all(r.headers["retry-after"] for r in statuses[4:])
            assert all(g.state.limiter.counters.breaker.state == "open" for g in pair)  # Redis is known to be down
            counted = query(url, "SELECT requests FROM rate_limit_counter WHERE key = :key", key=f"link:rl:{key_id}")
            assert [row["requests"] for row in counted] == [4]  # the refusals undone, one window
            for gateway in pair:
                gateway.flush_log()
    rows = log_rows(url)
    assert sorted(r["status"] for r in rows.values() if r["api_key_id"] == key_id) == ["ok"] * 4 + ["rate_limited"] * 6
    assert sorted(r["status"] for r in rows.values() if r["api_key_id"] == shared_id) == ["ok"] * 3 + ["rate_limited"] * 3
