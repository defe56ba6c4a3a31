"""`/api/traffic`: requests, tokens, cost, latency and errors over a time range (master key required).

    GET /api/traffic?since=&until=&model=&policy=&api_key_id=&buckets=24
        200 `link.traffic.traffic_stats` (totals, a time series, shares per model and per policy, errors)
        400 buckets outside 1..500, since not before until, or a bound outside the years 1-9999 in UTC (naming it)
"""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter, Query

from link.deps import AdminDep, SessionDep
from link.request_log import MAX_ID
from link.schemas import OpenAIError
from link.traffic import MAX_BUCKETS, RangeError, traffic_stats

router = APIRouter(prefix="/api/traffic", tags=["requests"])


@router.get("")
def traffic(session: SessionDep, _: AdminDep, since: datetime | None = None, until: datetime | None = None,
            model: str | None = None, policy: str | None = None, api_key_id: int | None = Query(None, ge=0, le=MAX_ID),
            buckets: int = Query(24, ge=1, le=MAX_BUCKETS)) -> dict:
    try:
        return traffic_stats(session, since=since, until=until, model=model, policy=policy, api_key_id=api_key_id,
                             num_buckets=buckets)
    except RangeError as exc:
        raise OpenAIError(400, str(exc), param=exc.param) from None
