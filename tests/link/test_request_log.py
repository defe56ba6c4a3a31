"""link.request_log: rows written off the caller's thread, drained on close, kept while the database is
down, and queried newest first; on SQLite and PostgreSQL.

    LINK_HOME=.link .venv/bin/python -m pytest -q tests/link/test_request_log.py
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import event
from sqlmodel import Session

from link.db import make_db_engine, upgrade
from link.db.models import RequestLogCreate
from link.keys import create_key
from link.request_log import RequestLogWriter, get_request, query_requests


def _entry(tag: str, **fields) -> RequestLogCreate:
    defaults = dict(id=f"{tag}-{uuid.uuid4().hex[:8]}", policy=tag, model="smollm2-135m-instruct", status="ok",
                    http_status=200, prompt_tokens=12, completion_tokens=5, cost_usd=0.0001, ttft_ms=20.5,
                    latency_ms=80.0)
    return RequestLogCreate(**(defaults | fields))


def test_every_status_is_written_and_queried(engine, session):
    key, _ = create_key(session, "logged")
    writer = RequestLogWriter(engine)
    base = datetime(2030, 1, 1, tzinfo=timezone.utc)
    entries = [
        _entry("q1", created_at=base, api_key_id=key.id, decision={"scores": {"a": 0.7}}, stream=True,
               user="u1", metadata={"team": "search"}),
        _entry("q1", created_at=base + timedelta(seconds=1), status="error", http_status=502, error="backend refused"),
        _entry("q1", created_at=base + timedelta(seconds=2), status="client_disconnected", http_status=None,
               stream=True, completion_tokens=2),
    ]
    for entry in entries:
        writer.write(entry)
    writer.close()
    assert writer.num_written == 3 and writer.num_failed == 0
    rows = query_requests(session, policy="q1")
    assert [row.id for row in rows] == [e.id for e in reversed(entries)]  # newest first
    assert [row.status for row in rows] == ["client_disconnected", "error", "ok"]
    first = rows[-1]
    assert first.api_key_id == key.id and first.decision == {"scores": {"a": 0.7}} and first.stream
    assert first.request_metadata == {"team": "search"} and first.model_dump(by_alias=True)["metadata"] == {"team": "search"}
    assert first.created_at == base and first.ttft_ms == 20.5 and first.user == "u1"
    assert [r.id for r in query_requests(session, policy="q1", status="error")] == [entries[1].id]
    assert [r.id for r in query_requests(session, api_key_id=key.id)] == [entries[0].id]
    assert [r.id for r in query_requests(session, policy="q1", since=base + timedelta(seconds=1),
                                         until=base + timedelta(seconds=2))] == [entries[1].id]
    assert [r.id for r in query_requests(session, policy="q1", limit=1, offset=1)] == [entries[1].id]
    assert get_request(session, entries[1].id).error == "backend refused"
    assert get_request(session, "no-such-request") is None
    with pytest.raises(ValueError):
        query_requests(session, limit=0)


def test_invalid_status_is_refused():
    with pytest.raises(ValueError):
        RequestLogCreate(status="fine")


def test_close_drains_the_queue(engine, session):
    writer = RequestLogWriter(engine, batch_size=64, flush_interval_s=0.5)
    entries = [_entry("drain") for _ in range(500)]
    for entry in entries:
        writer.write(entry)
    writer.close()  # at once: the 500 queued rows are still written
    assert writer.num_written == 500 and writer.num_pending == 0
    assert len(query_requests(session, policy="drain", limit=1000)) == 500
    with pytest.raises(RuntimeError):
        writer.write(_entry("drain"))


def test_rows_are_written_off_the_event_loop(engine, session):
    threads: set[str] = set()

    def record_thread(*_):
        threads.add(threading.current_thread().name)

    # every statement runs on a connection checked out of the engine's pool, also the writer's driver-level inserts
    event.listen(engine, "checkout", record_thread)
    writer = RequestLogWriter(engine)
    try:
        async def handle_requests():
            started = time.perf_counter()
            for _ in range(50):
                writer.write(_entry("loop"))
                await asyncio.sleep(0)
            return time.perf_counter() - started

        elapsed = asyncio.run(handle_requests())
        assert writer.flush(timeout_s=30)
    finally:
        writer.close()
        event.remove(engine, "checkout", record_thread)
    assert threads == {"request-log-writer"}
    assert elapsed < 1.0
    assert len(query_requests(session, policy="loop")) == 50


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_rows_wait_while_the_database_is_unavailable(backend, new_database_url):
    """Rows written while the database cannot take them (no schema yet on SQLite; no database at all on
    PostgreSQL) are kept and retried until it can."""
    url = new_database_url(backend)
    if backend == "postgresql":
        url_missing = url + "_later"
        engine = make_db_engine(url_missing)
    else:
        engine = make_db_engine(url)
    writer = RequestLogWriter(engine, max_retry_delay_s=0.2)
    entries = [_entry("outage") for _ in range(5)]
    for entry in entries:
        writer.write(entry)
    assert not writer.flush(timeout_s=0.5)
    if backend == "postgresql":
        import psycopg

        from tests.link.conftest import POSTGRES_URL

        name = url_missing.rsplit("/", 1)[1]
        with psycopg.connect(f"{POSTGRES_URL}/postgres", autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        url = url_missing
    try:
        upgrade(url)
        writer.close(timeout_s=30)
        assert writer.num_written == 5
        with Session(engine) as session:
            assert {r.id for r in query_requests(session, policy="outage")} == {e.id for e in entries}
    finally:
        engine.dispose()
        if backend == "postgresql":
            with psycopg.connect(f"{POSTGRES_URL}/postgres", autocommit=True) as connection:
                connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_a_row_the_database_refuses_is_repaired_not_lost(engine, session):
    """A row naming a key that does not exist (a foreign-key violation) in a batch with good rows: the good
    rows are written, the bad one is written without the key reference."""
    writer = RequestLogWriter(engine, flush_interval_s=0.2)
    good = [_entry("repair") for _ in range(3)]
    bad = _entry("repair", api_key_id=10**9, error="boom")
    odd_json = _entry("repair", decision={"at": datetime(2030, 1, 1)})  # not JSON-serializable: stored as text
    for entry in (good[0], bad, good[1], odd_json, good[2]):
        writer.write(entry)
    writer.close()
    assert writer.num_written == 5 and writer.num_failed == 0
    stored = get_request(session, bad.id)
    assert stored.api_key_id is None and "api_key_id 1000000000 dropped" in stored.error
    assert get_request(session, odd_json.id).decision["at"].startswith("2030-01-01")
    assert len(query_requests(session, policy="repair")) == 5


def test_a_poisoned_row_is_dropped_and_the_writer_goes_on(engine, session):
    """A row no column can hold (10**30 tokens: SQLite's driver raises OverflowError, PostgreSQL refuses it as out
    of INTEGER's range) is logged and dropped; the thread lives on and writes every good row after it."""
    writer = RequestLogWriter(engine, flush_interval_s=0.01)
    poisoned = _entry("poison", prompt_tokens=10**30)
    writer.write(poisoned)
    assert writer.flush(timeout_s=30)
    good = [_entry("poison") for _ in range(5)]
    for entry in good:
        writer.write(entry)
    assert writer.flush(timeout_s=30)
    writer.close()
    assert writer.num_failed == 1 and writer.num_written == 5
    assert {r.id for r in query_requests(session, policy="poison")} == {e.id for e in good}
    assert get_request(session, poisoned.id) is None


def test_the_request_log_keeps_a_bounded_number_of_rows_while_the_database_is_away():
    from link.db import make_db_engine
    from link.db.models import RequestLogCreate
    from link.request_log import RequestLogWriter
    from tests.link.mock_launch import free_port

    engine = make_db_engine(f"postgresql://postgres@127.0.0.1:{free_port()}/nothing")  # connections refused
    writer = RequestLogWriter(engine, max_pending=3, max_retry_delay_s=0.05)
    try:
        for i in range(5):
            writer.write(RequestLogCreate(id=f"bounded-{i}", status="ok"))
        assert (writer.num_pending, writer.num_dropped, writer.num_written) == (3, 2, 0)
    finally:
        writer.close(timeout_s=0)
    # a close that gave up waiting stops retrying: the three rows still pending are dropped, the thread ends
    deadline = time.monotonic() + 5
    while writer.is_running and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not writer.is_running and (writer.num_dropped, writer.num_written) == (5, 0)
    engine.dispose()
