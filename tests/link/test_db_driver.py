"""link.db.driver on SQLite and PostgreSQL: a statement run on the driver's cursor stores exactly what SQLAlchemy's own
execution stores (types converted the same way: datetimes, JSON, booleans), a transaction commits or rolls back as
a whole, and driver errors come out as SQLAlchemy's classes (an unreachable database as OperationalError).

    LINK_HOME=.link .venv/bin/python -m pytest -q tests/link/test_db_driver.py
"""

from __future__ import annotations

import uuid
from datetime import datetime, timezone

import pytest
from sqlalchemy import bindparam, insert, select, update
from sqlalchemy.exc import IntegrityError, OperationalError

from link.db import make_db_engine
from link.db.driver import DriverStatement, driver_transaction
from link.db.engine import is_unreachable
from link.db.models import RequestLog
from link.request_log import COLUMNS
from tests.link.mock_launch import free_port

LOG = RequestLog.__table__


def _row(tag: str, **fields) -> dict:
    values = dict.fromkeys(COLUMNS)
    values.update(id=f"{tag}-{uuid.uuid4().hex[:8]}", created_at=datetime(2031, 2, 3, 4, 5, 6, 789012, tzinfo=timezone.utc),
                  policy=tag, status="ok", prompt_tokens=7, completion_tokens=3, cost_usd=1.25e-6, latency_ms=2.5,
                  stream=True, decision={"scores": {"a": 0.5}, "names": ["x", "路由"]}, metadata={"team": "t"},
                  user='quote " and \\ backslash')
    values.update(fields)
    return values


def _stored(engine, row_id: str) -> dict:
    with engine.connect() as connection:
        return dict(connection.execute(select(LOG).where(LOG.c.id == row_id)).one()._mapping)


def test_a_row_stored_through_the_driver_reads_back_as_sqlalchemy_stores_it(engine):
    by_driver, by_core = _row("driver-parity"), _row("driver-parity")
    with driver_transaction(engine) as cursor:
        DriverStatement(engine, insert(LOG)).execute_many(cursor, [by_driver])
    with engine.begin() as connection:
        connection.execute(insert(LOG), [by_core])
    driver, core = _stored(engine, by_driver["id"]), _stored(engine, by_core["id"])
    assert {k: v for k, v in driver.items() if k != "id"} == {k: v for k, v in core.items() if k != "id"}
    assert driver["decision"] == {"scores": {"a": 0.5}, "names": ["x", "路由"]} and driver["stream"] is True
    stored_at = driver["created_at"]
    assert (stored_at if stored_at.tzinfo else stored_at.replace(tzinfo=timezone.utc)) == by_driver["created_at"]
    assert driver["user"] == 'quote " and \\ backslash' and driver["cost_usd"] == 1.25e-6


def test_a_named_parameter_used_twice_and_the_rowcount(engine):
    first = _row("driver-update", prompt_tokens=1)
    with engine.begin() as connection:
        connection.execute(insert(LOG), [first])
    tokens = bindparam("tokens", type_=LOG.c.prompt_tokens.type)
    add = DriverStatement(engine, update(LOG).where(LOG.c.id == bindparam("row_id"), LOG.c.prompt_tokens < tokens)
                          .values(prompt_tokens=LOG.c.prompt_tokens + tokens))
    with driver_transaction(engine) as cursor:
        assert add.execute(cursor, row_id=first["id"], tokens=5) == 1     # 1 < 5: 1 + 5
        assert add.execute(cursor, row_id=first["id"], tokens=5) == 0     # 6 < 5 is false: unchanged
        assert add.execute(cursor, row_id="no-such-row", tokens=5) == 0
    assert _stored(engine, first["id"])["prompt_tokens"] == 6


def test_a_failed_transaction_is_rolled_back_whole_and_raised_as_sqlalchemys_error(engine):
    kept, again = _row("driver-rollback"), _row("driver-rollback")
    statement = DriverStatement(engine, insert(LOG))
    with pytest.raises(IntegrityError):   # the second row repeats the first's primary key
        with driver_transaction(engine) as cursor:
            statement.execute(cursor, **kept)
            statement.execute(cursor, **dict(again, id=kept["id"]))
    with engine.connect() as connection:
        assert connection.execute(select(LOG.c.id).where(LOG.c.policy == "driver-rollback")).all() == []
    with pytest.raises(RuntimeError, match="not a database error"):
        with driver_transaction(engine) as cursor:
            statement.execute(cursor, **kept)
            raise RuntimeError("not a database error")
    with engine.connect() as connection:
        assert connection.execute(select(LOG.c.id).where(LOG.c.policy == "driver-rollback")).all() == []
    with driver_transaction(engine) as cursor:  # the pool's connections are still good
        statement.execute(cursor, **kept)
    assert _stored(engine, kept["id"])["policy"] == "driver-rollback"


def test_an_unreachable_database_is_sqlalchemys_operational_error():
    engine = make_db_engine(f"postgresql://postgres@127.0.0.1:{free_port()}/nothing")  # connections refused
    try:
        with pytest.raises(OperationalError) as refused:
            with driver_transaction(engine):
                pass
        assert is_unreachable(refused.value) and "refused" in str(refused.value.orig).lower()
    finally:
        engine.dispose()


def test_a_statement_that_needs_expansion_is_refused(engine):
    with pytest.raises(ValueError, match="per-call expansion"):
        DriverStatement(engine, select(LOG.c.id).where(LOG.c.id.in_(bindparam("ids", expanding=True))))
