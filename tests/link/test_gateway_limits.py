"""Budgets and rate limits under concurrency (>= 50 parallel requests), on SQLite and on PostgreSQL,
and with two `link serve` processes sharing PostgreSQL: spend never exceeds a key's budget by more than
one request's cost, requests over a limit get 429 with `Retry-After`, every request has its log row.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from sqlmodel import Session, select

from link.db.models import RequestLog
from link.keys import create_key, get_key
from tests.link.gateway_launch import (gateway_settings, mock_deployment, start_gateway_process,
                                       start_gateway_thread, write_config)
from tests.link.mock_launch import start_mock_thread

NUM_PARALLEL = 60
BODY = {"model": "priced", "messages": [{"role": "user", "content": "hello world"}], "max_tokens": 5}
# The mock answers "You said: hello world": 2 prompt and 4 completion tokens at $1000 / $2000 per 1e6.
COST_PER_REQUEST = (2 * 1000 + 4 * 2000) / 1e6


@pytest.fixture(scope="module")
def mock():
    with start_mock_thread(chunk_delay_s=0.01) as server:
        yield server


@pytest.fixture(scope="module")
def gateway(db_url, mock, tmp_path_factory):
    from link.config import parse_config

    config = parse_config({"models": [mock_deployment("priced", mock.api_base)]})
    with start_gateway_thread(gateway_settings(db_url, tmp_path_factory.mktemp("home")), config) as server:
        yield server


async def fire(urls: list[str], key: str, n: int, stream: bool = False) -> list[httpx.Response]:
    """`n` requests at once, spread over the gateways at `urls`."""
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=n)) as client:
        async def one(i: int) -> httpx.Response:
            response = await client.post(urls[i % len(urls)] + "/v1/chat/completions", json={**BODY, "stream": stream},
                                         headers={"Authorization": f"Bearer {key}"})
            await response.aread()
            return response
        return await asyncio.gather(*(one(i) for i in range(n)))


def rows_of(engine, key_id: int, expected: int, timeout_s: float = 15.0) -> list[RequestLog]:
    """The key's log rows, waiting until `expected` are written."""
    deadline = time.monotonic() + timeout_s
    while True:
        with Session(engine) as session:
            rows = session.exec(select(RequestLog).where(RequestLog.api_key_id == key_id)).all()
        if len(rows) >= expected or time.monotonic() > deadline:
            return rows
        time.sleep(0.1)


def check_budget(engine, session, key_id: int, budget: float, responses: list[httpx.Response]) -> None:
    ok = [r for r in responses if r.status_code == 200]
    refused = [r for r in responses if r.status_code != 200]
    assert ok and refused, "the budget should admit some requests and refuse others"
    assert all(r.status_code == 429 and r.json()["error"]["code"] == "insufficient_quota" for r in refused)
    # Refused while requests in flight held the rest: Retry-After; refused once the budget is spent: none.
    for r in refused:
        assert ("Retry-After" in r.headers) == ("retry shortly" in r.json()["error"]["message"])
    # A stream settles its cost just after its last byte: wait (bounded) until nothing is reserved.
    deadline = time.monotonic() + 10
    while True:
        with Session(engine) as fresh:
            key = get_key(fresh, key_id)
        if key.reserved_usd == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert key.spend_usd <= budget + COST_PER_REQUEST
    assert key.reserved_usd == 0
    assert key.spend_usd == pytest.approx(len(ok) * COST_PER_REQUEST)
    rows = rows_of(engine, key_id, len(responses))
    assert len(rows) == len(responses)
    assert sorted(r.status for r in rows) == sorted(["ok"] * len(ok) + ["budget_exceeded"] * len(refused))
    assert sum(r.cost_usd for r in rows) == pytest.approx(key.spend_usd)


@pytest.mark.parametrize("stream", [False, True])
def test_budget_holds_under_concurrency(gateway, engine, session, stream):
    budget = 0.5  # a reservation is ~$0.15 (the prompt estimate counts the chat preamble), a request costs $0.01
    key, plaintext = create_key(session, f"budget-{stream}", budget_usd=budget)
    responses = asyncio.run(fire([gateway.url], plaintext, NUM_PARALLEL, stream))
    check_budget(engine, session, key.id, budget, responses)


def test_rate_limit_under_concurrency(gateway, engine, session):
    key, plaintext = create_key(session, "rpm", rpm_limit=20)
    responses = asyncio.run(fire([gateway.url], plaintext, 50))
    ok = [r for r in responses if r.status_code == 200]
    limited = [r for r in responses if r.status_code == 429]
    assert len(ok) == 20 and len(limited) == 30
    for r in limited:
        assert int(r.headers["Retry-After"]) >= 1 and r.json()["error"]["code"] == "rate_limit_exceeded"
        assert r.headers["x-link-request-id"]
    rows = rows_of(engine, key.id, 50)
    assert sorted(r.status for r in rows).count("rate_limited") == 30


def test_two_gateway_processes_share_budgets_and_limits(db_url, engine, session, mock, tmp_path):
    if not db_url.startswith("postgresql"):
        pytest.skip("two gateway processes share PostgreSQL")
    config = write_config(tmp_path / "link.yaml", [mock_deployment("priced", mock.api_base)])
    with ThreadPoolExecutor(2) as pool:  # both start at once (seconds each, mostly imports)
        starts = [pool.submit(start_gateway_process, config, db_url, tmp_path / f"home{i}") for i in range(2)]
    gateways = [start.result() for start in starts if start.exception() is None]
    if len(gateways) < 2:
        for g in gateways:
            g.stop()
        raise next(start.exception() for start in starts if start.exception() is not None)
    try:
        budget = 0.5
        key, plaintext = create_key(session, "shared-budget", budget_usd=budget)
        responses = asyncio.run(fire([g.url for g in gateways], plaintext, NUM_PARALLEL))
        check_budget(engine, session, key.id, budget, responses)
        limited_key, limited_plaintext = create_key(session, "shared-rpm", rpm_limit=20)
        responses = asyncio.run(fire([g.url for g in gateways], limited_plaintext, 50))
        assert sum(r.status_code == 200 for r in responses) == 20
        assert all("Retry-After" in r.headers for r in responses if r.status_code == 429)
    finally:
        with ThreadPoolExecutor(2) as pool:  # each drains and exits on SIGTERM: side by side
            list(pool.map(lambda g: g.stop(), gateways))
