"""Traffic: requests, tokens, cost and latency over time, shares per model and per policy, errors, and the
request log with one request's details (from /api/traffic and /api/requests).

    GET /console/traffic?range=1h&policy=&model=&key=&offset=0    charts, totals, shares, the log (50 rows a page);
        since=&until= (UTC, "YYYY-MM-DDTHH:MM") give a custom range instead of the last `range`; the Policy
        filter lists every policy and model name (a model is its own implicit fixed policy)
    GET /console/requests/{request_id}                             one request: decision, MoA proposers, usage,
                                                                   cost, timings
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, Response

from link.request_log import MAX_OFFSET
from web.pages.base import ApiDep, api_error, path_segment, render

router = APIRouter()
RANGES = {"15m": timedelta(minutes=15), "1h": timedelta(hours=1), "6h": timedelta(hours=6),
          "24h": timedelta(hours=24), "7d": timedelta(days=7)}
NUM_BUCKETS = 30
PAGE_ROWS = 50
POLICY_OWNER = "togetherlink-policy"  # a policy's /v1/models card (its link.type is the policy's own type)


def _utc(text: str) -> datetime | None:
    """A datetime-local field ("2026-11-30T22:05", UTC) -> an aware datetime; None when empty or malformed."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        return None
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value


@router.get("/traffic", response_class=HTMLResponse)
async def page(request: Request, api: ApiDep, range: str = "1h", policy: str = "", model: str = "", key: str = "",
               since: str = "", until: str = "", offset: int = Query(0, le=MAX_OFFSET)) -> Response:
    custom_since, custom_until = _utc(since), _utc(until)
    end = custom_until or datetime.now(timezone.utc)
    start = custom_since or end - RANGES.get(range, RANGES["1h"])
    if start >= end:
        return render(request, "error.html", status_code=400, section="traffic", title="Empty range",
                      message="The range's start must be before its end.")
    filters = {"policy": policy or None, "model": model or None, "api_key_id": int(key) if key.isdigit() else None,
               "since": start.isoformat(), "until": end.isoformat()}
    stats = await api.get_json("/api/traffic", buckets=NUM_BUCKETS, **filters)
    rows = await api.get_json("/api/requests", limit=PAGE_ROWS, offset=max(offset, 0), **filters)
    cards = (await api.get_json("/v1/models"))["data"]
    keys = await api.get_json("/api/keys")
    return render(request, "traffic.html", section="traffic", stats=stats, rows=rows, ranges=list(RANGES),
                  filters={"range": range if range in RANGES else "1h", "policy": policy, "model": model, "key": key,
                           "since": since if custom_since else "", "until": until if custom_until else ""},
                  offset=max(offset, 0), page_rows=PAGE_ROWS, keys=keys,
                  models=[c["id"] for c in cards if c["owned_by"] != POLICY_OWNER],
                  policies=[c["id"] for c in cards if c["owned_by"] == POLICY_OWNER])


@router.get("/requests/{request_id}", response_class=HTMLResponse)
async def one_request(request: Request, api: ApiDep, request_id: str) -> Response:
    response = await api.call("GET", f"/api/requests/{path_segment(request_id)}")
    if response.status_code != 200:
        return render(request, "error.html", status_code=response.status_code, section="traffic",
                      title="No such request", message=api_error(response)["message"])
    row = response.json()
    decision = row.get("decision") or {}
    return render(request, "request.html", section="traffic", row=row, decision=decision,
                  proposals=(decision.get("moa") or {}).get("proposals") or [])
