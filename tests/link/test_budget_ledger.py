"""link.budgets.BudgetLedger at the edges of its range, on SQLite and PostgreSQL: costs beyond what a BIGINT of
nano-dollars holds are capped (they fit no budget), an unbudgeted key's holds stop before the range ends, spend
saturates, and NaN is refused.

    LINK_HOME=.link .venv/bin/python -m pytest -q tests/link/test_budget_ledger.py
"""

from __future__ import annotations

import math

import pytest
from sqlalchemy import select

from link.budgets import BudgetExceeded, BudgetLedger
from link.db.models import ApiKey
from link.keys import create_key

BIGINT_MAX = 2**63 - 1
MAX_BUDGET_NUSD = 10**9 * 10**9  # the API's largest budget, $1e9, in nano-dollars
MAX_HOLD_NUSD = MAX_BUDGET_NUSD + 1  # the most one request holds: a cost at or beyond $1e9 fits no budget


def _row(engine, key_id: int) -> tuple[int, int]:
    """(spend_nusd, reserved_nusd) as stored."""
    with engine.connect() as connection:
        row = connection.execute(select(ApiKey.spend_nusd, ApiKey.reserved_nusd).where(ApiKey.id == key_id)).one()
    return row.spend_nusd, row.reserved_nusd


@pytest.mark.parametrize("cost_usd", [2e12, 1e30, math.inf], ids=["1e15-tokens", "1e30", "inf"])
def test_a_cost_beyond_the_range_fits_no_budget(session, engine, cost_usd):
    """10**15 tokens at $2000 per million is $2e12, 2e21 nano-dollars: past BIGINT. It used to overflow (SQLite
    OverflowError, PostgreSQL DataError); now it is refused like any cost over the budget."""
    key, _ = create_key(session, "huge-cost", budget_usd=1e9)  # the largest budget the API accepts
    with pytest.raises(BudgetExceeded) as refused:
        BudgetLedger(engine).reserve(key.id, cost_usd)
    assert refused.value.max_cost_usd == cost_usd and not refused.value.is_ledger_full
    assert _row(engine, key.id) == (0, 0)


def test_an_unbudgeted_keys_holds_stop_before_the_range_ends(session, engine):
    key, _ = create_key(session, "no-budget-huge")
    ledger = BudgetLedger(engine)
    assert 9 * MAX_HOLD_NUSD <= BIGINT_MAX < 10 * MAX_HOLD_NUSD
    held = [ledger.reserve(key.id, 1e30) for _ in range(9)]   # each capped at MAX_HOLD_NUSD
    assert all(r.amount_nusd == MAX_HOLD_NUSD for r in held)
    assert _row(engine, key.id) == (0, 9 * MAX_HOLD_NUSD)
    with pytest.raises(BudgetExceeded) as refused:            # a tenth would pass 2**63 - 1
        ledger.reserve(key.id, 1e30)
    assert refused.value.is_ledger_full and "has no budget" in str(refused.value)
    for reservation in held:
        ledger.release(reservation)
    assert _row(engine, key.id) == (0, 0)


def test_spend_saturates_at_the_range(session, engine):
    key, _ = create_key(session, "no-budget-spend")
    ledger = BudgetLedger(engine)
    for _ in range(10):   # 10 * (1e18 + 1) > 2**63 - 1
        ledger.settle(ledger.reserve(key.id, 1.0), math.inf)
    assert _row(engine, key.id) == (BIGINT_MAX, 0)


def test_nan_is_refused(session, engine):
    key, _ = create_key(session, "nan")
    ledger = BudgetLedger(engine)
    with pytest.raises(ValueError, match="max_cost_usd"):
        ledger.reserve(key.id, math.nan)
    reservation = ledger.reserve(key.id, 0.5)
    with pytest.raises(ValueError, match="actual_cost_usd"):
        ledger.settle(reservation, math.nan)
