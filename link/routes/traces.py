"""`/api/traces`: recorded tool-call traces as OpenAI fine-tuning JSONL (master key required).

    GET /api/traces?api_key_id=3&api_key_id=4&policy=harness&since=2026-12-01T00:00:00Z&until=...&limit=1000
    -> 200 application/jsonl, one {"messages": [..., the assistant's answer], "tools": [...]} per line, oldest first

Traces are recorded for chat requests with `tools` from keys with `capture_traces` on or policies with
`options.capture_traces: true` (link/traces.py). The lines are OpenAI's chat fine-tuning format with tools
(`posttrain` reads them as its "openai" source). `since`/`until` are ISO 8601 times (UTC when no zone is
given), since <= created_at < until; repeated `api_key_id` / `policy` match any of them. The header
`x-link-trace-count` gives the number of lines.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import Response
from pydantic import BaseModel, Field

from link.deps import AdminDep, SessionDep
from link.request_log import MAX_ID
from link.traces import fine_tuning_example, query_traces

router = APIRouter(prefix="/api/traces", tags=["traces"])
JSONL = "application/jsonl"
KeyId = Annotated[int, Field(ge=0, le=MAX_ID)]  # beyond 64 bits no query can run (a 400, not the database's 500)


class FineTuningExample(BaseModel):
    """One JSONL line: the request's messages followed by the assistant's answer (with `tool_calls` when it
    called tools, arguments a JSON string), and the request's tools."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]


def _utc(value: datetime | None) -> datetime | None:
    return value.replace(tzinfo=timezone.utc) if value is not None and value.tzinfo is None else value


@router.get("", response_class=Response, responses={200: {
    "description": "JSON Lines, one OpenAI fine-tuning example per trace, oldest first (schema: one line)",
    "content": {JSONL: {"schema": FineTuningExample.model_json_schema()}}}})
def export_traces(session: SessionDep, _: AdminDep,
                  api_key_id: list[KeyId] | None = Query(None, description="traces of these keys (repeatable)"),
                  policy: list[str] | None = Query(None, description="traces of these policies (repeatable)"),
                  since: datetime | None = Query(None, description="created at or after (ISO 8601, UTC)"),
                  until: datetime | None = Query(None, description="created before (ISO 8601, UTC)"),
                  limit: int = Query(1000, ge=1, le=100_000, description="lines at most")) -> Response:
    rows = query_traces(session, api_key_ids=api_key_id, policies=policy, since=_utc(since), until=_utc(until),
                        limit=limit)
    body = "".join(json.dumps(fine_tuning_example(row), ensure_ascii=False) + "\n" for row in rows)
    return Response(body, media_type=JSONL, headers={"x-link-trace-count": str(len(rows))})
