"""link.budget_leases through BudgetLedger, on SQLite and PostgreSQL: the holds of an owner that died are
released (at once by a restart under the same id, by anyone once its lease expired), those of a live owner
never, and a hold released behind a stalled owner's back is not given back twice. The session's database is
shared with other tests, whose abandoned holds a release may also take: assertions look at this test's keys.

    LINK_HOME=.link .venv/bin/python -m pytest -q tests/link/test_budget_leases.py
"""

from __future__ import annotations

import time
import uuid

import pytest
from sqlalchemy import func, select

from link.budgets import BudgetLedger
from link.db.ledger import BudgetReservation
from link.keys import create_key, get_key

NANO = 10**9  # nano-dollars per USD


def _owner(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"  # the database is shared by the session's tests


def _held(session, key_id: int) -> float:
    session.expire_all()
    return get_key(session, key_id).reserved_usd


def _rows(engine, owner: str) -> int:
    with engine.connect() as connection:
        return connection.execute(select(func.count()).where(BudgetReservation.owner == owner)).scalar_one()


def test_a_restart_under_the_same_id_releases_the_predecessors_holds(session, engine):
    key, _ = create_key(session, "restart", budget_usd=1.0)
    owner = _owner("replica-a")
    killed = BudgetLedger(engine, owner=owner)
    killed.open()
    killed.reserve(key.id, 0.4), killed.reserve(key.id, 0.2)   # then kill -9: never settled
    assert _held(session, key.id) == pytest.approx(0.6) and _rows(engine, owner) == 2
    restarted = BudgetLedger(engine, owner=owner)               # its lease is still live: only rule 3 applies
    released, amount = restarted.open()
    assert released >= 2 and amount >= round(0.6 * NANO)
    assert _held(session, key.id) == 0 and _rows(engine, owner) == 0
    restarted.settle(restarted.reserve(key.id, 1.0), 0.5)     # the whole budget fits again
    assert get_key(session, key.id).spend_usd == pytest.approx(0.5)


def test_a_live_replicas_holds_survive_another_replicas_start_up(session, engine):
    key, _ = create_key(session, "live-replica", budget_usd=1.0)
    live = BudgetLedger(engine, owner=_owner("replica-b"))
    live.open()
    held = live.reserve(key.id, 0.3)
    starting = BudgetLedger(engine, owner=_owner("replica-c"))
    starting.open(), starting.heartbeat()
    assert _held(session, key.id) == pytest.approx(0.3) and _rows(engine, live.owner) == 1
    live.settle(held, 0.1)
    state = get_key(session, key.id)
    assert state.reserved_usd == 0 and state.spend_usd == pytest.approx(0.1)


def test_an_expired_lease_is_released_by_any_replica_and_never_twice(session, engine):
    key, _ = create_key(session, "expired", budget_usd=1.0)
    stalled = BudgetLedger(engine, owner=_owner("stalled"), lease_s=0.3)
    other = BudgetLedger(engine, owner=_owner("other"))
    held = stalled.reserve(key.id, 0.5)         # takes its lease on first use
    other.heartbeat()
    assert _held(session, key.id) == pytest.approx(0.5)     # still live
    time.sleep(0.6)
    released, amount = other.heartbeat()
    assert released >= 1 and amount >= round(0.5 * NANO)
    assert _held(session, key.id) == 0 and _rows(engine, stalled.owner) == 0
    stalled.settle(held, 0.2)                   # the stalled owner finishes: spend counts, nothing released twice
    state = get_key(session, key.id)
    assert state.reserved_usd == 0 and state.spend_usd == pytest.approx(0.2)


def test_a_heartbeat_keeps_a_short_lease_alive(session, engine):
    key, _ = create_key(session, "heartbeat", budget_usd=1.0)
    alive = BudgetLedger(engine, owner=_owner("alive"), lease_s=0.4)
    other = BudgetLedger(engine, owner=_owner("other"))
    alive.open()
    alive.reserve(key.id, 0.25)
    for _ in range(8):                           # 0.8 s: twice the lease
        time.sleep(0.1)
        alive.heartbeat()
        other.heartbeat()
    assert _held(session, key.id) == pytest.approx(0.25) and _rows(engine, alive.owner) == 1


def test_a_clean_close_releases_what_is_left(session, engine):
    key, _ = create_key(session, "close", budget_usd=1.0)
    owner = _owner("closing")
    ledger = BudgetLedger(engine, owner=owner)
    ledger.open()
    ledger.reserve(key.id, 0.7)
    ledger.close()
    assert _held(session, key.id) == 0 and _rows(engine, owner) == 0
