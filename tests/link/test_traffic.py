"""`link.traffic.traffic_stats` (behind /api/traffic) on SQLite and PostgreSQL: totals, buckets, shares,
errors and percentiles computed by hand from the rows written here; bounds outside the years 1-9999 in UTC
named as the parameter at fault (a datetime OverflowError once)."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import pytest

from link.db.models import RequestLog
from link.traffic import RangeError, traffic_stats

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)


@pytest.fixture
def policy(session) -> str:
    """A unique policy name with six rows over one hour (the database is shared by the session's tests)."""
    name = f"traffic-{uuid.uuid4().hex[:8]}"
    rows = [  # minute, model, status, prompt, completion, cost, latency ms
        (0, "a", "ok", 10, 5, 0.001, 100.0),
        (5, "a", "ok", 20, 10, 0.002, 300.0),
        (20, "b", "error", 7, 0, 0.0, 50.0),
        (31, "b", "ok", 30, 15, 0.004, 200.0),
        (59, "a", "timeout", 5, 0, 0.0, None),
        (60, "a", "ok", 1000, 1000, 1.0, 1.0),  # at `until`: outside [since, until)
    ]
    for minute, model, status, prompt, completion, cost, latency in rows:
        session.add(RequestLog(id=uuid.uuid4().hex, created_at=T0 + timedelta(minutes=minute), policy=name, model=model,
                               status=status, prompt_tokens=prompt, completion_tokens=completion, cost_usd=cost,
                               latency_ms=latency))
    session.commit()
    return name


def test_totals_buckets_and_shares(session, policy):
    stats = traffic_stats(session, since=T0, until=T0 + timedelta(hours=1), policy=policy, num_buckets=4)
    totals = stats["totals"]
    assert (totals["requests"], totals["errors"], totals["prompt_tokens"], totals["completion_tokens"]) == (5, 2, 72, 30)
    assert totals["total_tokens"] == 102 and totals["cost_usd"] == pytest.approx(0.007)
    # nearest rank over the four latencies [50, 100, 200, 300]: p50 = 2nd, p95 = 4th
    assert (totals["latency_p50_ms"], totals["latency_p95_ms"]) == (100.0, 300.0)
    assert stats["bucket_s"] == 900
    assert [b["requests"] for b in stats["series"]] == [2, 1, 1, 1]
    assert [b["start"] for b in stats["series"]] == [(T0 + timedelta(minutes=15 * i)).isoformat() for i in range(4)]
    assert stats["series"][1]["errors"] == 1 and stats["series"][3]["latency_p50_ms"] is None
    assert {k: v["requests"] for k, v in stats["by_model"].items()} == {"a": 3, "b": 2}
    assert stats["by_model"]["a"]["prompt_tokens"] == 35 and stats["by_policy"][policy]["requests"] == 5
    assert stats["errors_by_status"] == {"error": 1, "timeout": 1}


def test_filters_and_naive_times(session, policy):
    naive = T0.replace(tzinfo=None)  # taken as UTC
    stats = traffic_stats(session, since=naive + timedelta(minutes=10), until=naive + timedelta(minutes=40),
                          policy=policy, model="b", num_buckets=1)
    assert stats["totals"]["requests"] == 2 and stats["totals"]["cost_usd"] == pytest.approx(0.004)
    assert traffic_stats(session, since=T0, until=T0 + timedelta(hours=1), policy=policy, model="c")["totals"]["requests"] == 0


@pytest.mark.parametrize("kwargs", [{"num_buckets": 0}, {"num_buckets": 501}, {"since": T0, "until": T0}])
def test_invalid_arguments(session, kwargs):
    with pytest.raises(ValueError):
        traffic_stats(session, **{"since": T0 - timedelta(hours=1), "until": T0, **kwargs})


@pytest.mark.parametrize("bounds,param", [
    ({"until": datetime(1, 1, 1, 0, 0, 1, tzinfo=timezone.utc)}, "since"),  # the default 24 hours before: year 0
    ({"until": datetime(9999, 12, 31, 23, 0, tzinfo=timezone(timedelta(hours=-5)))}, "until"),  # in UTC: year 10000
    ({"since": datetime(1, 1, 1, 1, 0, tzinfo=timezone(timedelta(hours=5)))}, "since"),          # in UTC: year 0
    ({"since": T0, "until": T0}, "since"),
])
def test_bounds_out_of_range_name_the_parameter(session, bounds, param):
    with pytest.raises(RangeError) as info:
        traffic_stats(session, **bounds)
    assert info.value.param == param and param in str(info.value)
