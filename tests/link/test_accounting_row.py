"""link.accounting.Accounting end to end without HTTP, on SQLite and PostgreSQL: a request reserved and finished through
the real ledger and request-log writer leaves exactly its cost as spend, nothing held, and one log row whose every
column is what the record says and what RequestLogCreate (the model the API validates rows with) accepts.

    LINK_HOME=.link .venv/bin/python -m pytest -q tests/link/test_accounting_row.py
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import select

from link.accounting import Accounting, RequestRecord
from link.budgets import BudgetLedger
from link.config import ModelDeployment
from link.db.models import ApiKey, RequestLog, RequestLogCreate
from link.keys import KeyIdentity, create_key
from link.metrics import GatewayMetrics
from link.request_log import RequestLogWriter

PRICE_IN, PRICE_OUT = 3.0, 15.0   # USD per million tokens
PROMPT, COMPLETION = 1200, 345    # tokens the backend reported
COST_USD = (PROMPT * PRICE_IN + COMPLETION * PRICE_OUT) / 1e6   # 0.0036 + 0.005175 = 0.008775


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_finished_request_spends_its_cost_and_logs_one_exact_row(engine, session, stream):
    key, _ = create_key(session, f"accounting-row-{stream}", budget_usd=1.0)
    identity = KeyIdentity(key_id=key.id, name=key.name, budget_usd=1.0)
    deployment = ModelDeployment(name="priced", kind="openai", model="priced", api_base="http://127.0.0.1:9/v1",
                                 input_cost_per_million=PRICE_IN, output_cost_per_million=PRICE_OUT,
                                 deployment_id="priced#0")
    writer, ledger = RequestLogWriter(engine, flush_interval_s=0.01), BudgetLedger(engine)
    accounting = Accounting(GatewayMetrics(lambda name: True), writer, ledger, None, instance="gw-test-w0")
    body = {"model": "priced", "messages": [{"role": "user", "content": "hi"}], "user": "alice",
            "metadata": {"team": "search"}}
    record = RequestRecord(endpoint="chat", identity=identity, body=body, stream=stream, policy="priced",
                           decision={"candidates": ["priced"]})
    before = datetime.now(timezone.utc)

    async def serve() -> float:
        await accounting.reserve(record, 0.05)
        held = record.reservation.amount_usd
        record.model, record.deployment = "priced", deployment
        record.add_usage({"prompt_tokens": PROMPT, "completion_tokens": COMPLETION})
        record.mark_first_token()
        record.status, record.http_status = "ok", 200
        await accounting.finish(record)
        return held

    try:
        assert asyncio.run(serve()) == pytest.approx(0.05)
        assert writer.flush(timeout_s=30)
    finally:
        writer.close()
        accounting.calls.close()
    with engine.connect() as connection:
        spend, reserved = connection.execute(select(ApiKey.spend_nusd, ApiKey.reserved_nusd)
                                             .where(ApiKey.id == key.id)).one()
        row = dict(connection.execute(select(RequestLog.__table__).where(RequestLog.id == record.request_id)).one()
                   ._mapping)
    assert (spend, reserved) == (8_775_000, 0)   # $0.008775 in nano-dollars, the $0.05 hold given back
    created_at = row.pop("created_at")
    assert before - timedelta(seconds=1) <= (created_at if created_at.tzinfo else created_at.replace(
        tzinfo=timezone.utc)) <= datetime.now(timezone.utc)
    latency_ms, ttft_ms = row.pop("latency_ms"), row.pop("ttft_ms")
    assert 0 <= ttft_ms <= latency_ms < 60_000
    assert row == {"id": record.request_id, "api_key_id": key.id, "caller": "key", "policy": "priced", "model": "priced",
                   "deployment": "priced#0", "decision": {"candidates": ["priced"]}, "prompt_tokens": PROMPT,
                   "completion_tokens": COMPLETION, "cost_usd": pytest.approx(COST_USD, rel=1e-12), "status": "ok",
                   "http_status": 200, "error": None, "stream": stream, "user": "alice", "instance": "gw-test-w0",
                   "metadata": {"team": "search"}}
    RequestLogCreate.model_validate({**row, "created_at": created_at, "latency_ms": latency_ms, "ttft_ms": ttft_ms})
