"""`/api/requests`: the request log, newest first (master key required).

    GET /api/requests?limit=100&offset=0&model=&policy=&status=&api_key_id=&since=&until=
        limit 1..1000, offset 0..2**31-1 (else 400 naming the parameter)
    GET /api/requests/{request_id}          one row (the `x-link-request-id` of a response)
Rows are written asynchronously: a request's row appears within about 50 ms of its end.
"""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter, Query

from link.db.models import RequestLogPublic
from link.deps import AdminDep, SessionDep
from link.request_log import MAX_ID, MAX_OFFSET, get_request, query_requests
from link.schemas import OpenAIError

router = APIRouter(prefix="/api/requests", tags=["requests"])


@router.get("", response_model=list[RequestLogPublic], response_model_by_alias=True)
def list_requests(session: SessionDep, _: AdminDep, limit: int = Query(100, ge=1, le=1000),
                  offset: int = Query(0, ge=0, le=MAX_OFFSET), model: str | None = None, policy: str | None = None,
                  status: str | None = None, api_key_id: int | None = Query(None, ge=0, le=MAX_ID),
                  since: datetime | None = None, until: datetime | None = None):
    return query_requests(session, limit=limit, offset=offset, api_key_id=api_key_id, model=model, policy=policy,
                          status=status, since=since, until=until)


@router.get("/{request_id}", response_model=RequestLogPublic, response_model_by_alias=True)
def one_request(request_id: str, session: SessionDep, _: AdminDep):
    row = get_request(session, request_id)
    if row is None:
        raise OpenAIError(404, f"no request {request_id!r} in the log (rows appear shortly after the request ends)",
                          param="request_id", code="request_not_found")
    return row
