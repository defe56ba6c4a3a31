"""Traffic over a time range, from the request log: totals, a time series, shares per model and policy, errors.

    stats = traffic_stats(session, since=now - timedelta(hours=1), until=now, policy="link/auto", num_buckets=30)
    stats["totals"]["cost_usd"], stats["series"][0]["requests"], stats["by_model"]["smollm2-135m-instruct"]

The rows of the range are read once (only the columns summed) and aggregated here, the same way on SQLite
and PostgreSQL. Tokens and requests are counts, cost in USD, latency in ms (over requests that recorded one).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from datetime import datetime, timedelta, timezone

from sqlmodel import Session, select

from link.db.models import RequestLog, utcnow

DEFAULT_RANGE = timedelta(hours=24)
MAX_BUCKETS = 500


def _percentile(sorted_values: list[float], q: float) -> float | None:
    """The nearest-rank percentile (q in [0, 100]) of an ascending list; None when empty."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


class RangeError(ValueError):
    """A time range that cannot be aggregated; `param` names the bound at fault ("since" or "until")."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


def _bounds(since: datetime | None, until: datetime | None) -> tuple[datetime, datetime]:
    """(since, until) in UTC, defaults filled in. Raises RangeError: a bound outside the years 1-9999 once in
    UTC (9999-12-31T23:00-05:00 is), or since not before until."""
    try:
        until = _utc(until) if until is not None else utcnow()
    except OverflowError:
        raise RangeError(f"until ({until.isoformat()}) is past 9999-12-31 in UTC", "until") from None
    try:
        since = _utc(since) if since is not None else until - DEFAULT_RANGE
    except OverflowError:
        which = since.isoformat() if since is not None else f"24 hours before until, {until.isoformat()}"
        raise RangeError(f"since ({which}) is outside the years 1-9999 in UTC", "since") from None
    if since >= until:
        raise RangeError(f"since ({since.isoformat()}) must be before until ({until.isoformat()})", "since")
    return since, until


class _Sums:
    """Running sums of one group of rows."""

    def __init__(self) -> None:
        self.requests = self.errors = self.prompt_tokens = self.completion_tokens = 0
        self.cost_usd = 0.0
        self.latencies_ms: list[float] = []

    def add(self, row) -> None:
        self.requests += 1
        self.errors += row.status != "ok"
        self.prompt_tokens += row.prompt_tokens
        self.completion_tokens += row.completion_tokens
        self.cost_usd += row.cost_usd
        if row.latency_ms is not None:
            self.latencies_ms.append(row.latency_ms)

    def to_dict(self) -> dict:
        latencies = sorted(self.latencies_ms)
        return {"requests": self.requests, "errors": self.errors, "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens, "total_tokens": self.prompt_tokens + self.completion_tokens,
                "cost_usd": self.cost_usd, "latency_p50_ms": _percentile(latencies, 50),
                "latency_p95_ms": _percentile(latencies, 95)}


def traffic_stats(session: Session, *, since: datetime | None = None, until: datetime | None = None,
                  model: str | None = None, policy: str | None = None, api_key_id: int | None = None,
                  num_buckets: int = 24) -> dict:
    """Aggregate the request log over [since, until).

    Args:
        since, until: the range (UTC; naive values are taken as UTC); default the last 24 hours up to now.
        model, policy, api_key_id: keep only rows with these values.
        num_buckets: points of the time series (equal widths over the range), 1..500.
    Returns:
        {"since", "until", "bucket_s", "totals": sums, "series": [{"start", **sums}], "by_model": {name: sums},
         "by_policy": {name: sums}, "errors_by_status": {status: count}} where sums are requests, errors,
        prompt_tokens, completion_tokens, total_tokens, cost_usd, latency_p50_ms, latency_p95_ms.
    Raises:
        ValueError: num_buckets outside 1..500. RangeError (a ValueError): a bound out of range, or since not
            before until.
    """
    since, until = _bounds(since, until)
    if not 1 <= num_buckets <= MAX_BUCKETS:
        raise ValueError(f"num_buckets must be in 1..{MAX_BUCKETS}, got {num_buckets}")
    columns = (RequestLog.created_at, RequestLog.model, RequestLog.policy, RequestLog.status, RequestLog.prompt_tokens,
               RequestLog.completion_tokens, RequestLog.cost_usd, RequestLog.latency_ms)
    query = select(*columns).where(RequestLog.created_at >= since, RequestLog.created_at < until)
    for column, value in ((RequestLog.model, model), (RequestLog.policy, policy), (RequestLog.api_key_id, api_key_id)):
        if value is not None:
            query = query.where(column == value)
    bucket_s = (until - since).total_seconds() / num_buckets
    totals, buckets = _Sums(), [_Sums() for _ in range(num_buckets)]
    by_model: dict[str, _Sums] = defaultdict(_Sums)
    by_policy: dict[str, _Sums] = defaultdict(_Sums)
    errors: Counter[str] = Counter()
    for row in session.exec(query):
        offset_s = (_utc(row.created_at) - since).total_seconds()
        for group in (totals, buckets[min(int(offset_s // bucket_s), num_buckets - 1)],
                      by_model[row.model or ""], by_policy[row.policy or ""]):
            group.add(row)
        if row.status != "ok":
            errors[row.status] += 1
    series = [{"start": (since + timedelta(seconds=i * bucket_s)).isoformat(), **b.to_dict()} for i, b in enumerate(buckets)]
    return {"since": since.isoformat(), "until": until.isoformat(), "bucket_s": bucket_s, "totals": totals.to_dict(),
            "series": series, "by_model": {k: v.to_dict() for k, v in sorted(by_model.items())},
            "by_policy": {k: v.to_dict() for k, v in sorted(by_policy.items())}, "errors_by_status": dict(errors)}
