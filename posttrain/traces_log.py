"""Traces from the gateway: the tool-call conversations it recorded for keys or policies that opted in.

The gateway records a chat request with `tools` and its answer in the table `tool_trace` when the request's API
key has `capture_traces` on (`link keys create --capture-traces`, `PATCH /api/keys/{id}` with
{"capture_traces": true}) or its policy has `options.capture_traces: true` (link/traces.py). This module reads
that table directly (SQLite or PostgreSQL, the gateway's `LINK_DATABASE_URL`):

    traces = read_request_log("sqlite:////home/me/.link/link.db", policies=["harness"], since=datetime(2026, 12, 1))
    traces[0].messages[-1]   # the assistant's answer: {"role": "assistant", "tool_calls": [...]} or {"content": ...}

The same rows are served over HTTP as OpenAI fine-tuning JSONL by `GET /api/traces` (read those files with
`posttrain.traces.read_openai_jsonl`).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Sequence

from sqlalchemy import inspect
from sqlalchemy.engine import make_url
from sqlmodel import Session

from link.db import make_db_engine
from link.db.models import ToolTrace
from link.traces import fine_tuning_example, query_traces
from posttrain.errors import PosttrainDataError
from posttrain.traces import Trace

OPT_IN = ("traces are recorded only for chat requests with `tools` whose API key has capture_traces on "
          "(`link keys create --capture-traces`, or PATCH /api/keys/{id} {\"capture_traces\": true}) or whose policy "
          "has options.capture_traces: true")


def _utc(value: datetime | None) -> datetime | None:
    return value.replace(tzinfo=timezone.utc) if value is not None and value.tzinfo is None else value


def _filters(api_key_ids, policies, since, until) -> str:
    named = [f"{name}={value!r}" if not isinstance(value, datetime) else f"{name}={value.isoformat()}"
             for name, value in (("api_key_ids", api_key_ids), ("policies", policies), ("since", since), ("until", until))
             if value is not None]
    return ", ".join(named) or "no filters"


def to_trace(row: ToolTrace) -> Trace:
    """A `tool_trace` row as a `Trace`: the request's messages followed by the answer, the request's tools, and
    meta {"source": "log", "category": the policy (the split's stratum), "api_key_id", "policy", "model",
    "created_at" (ISO 8601, UTC), "finish_reason", "stream"}."""
    example = fine_tuning_example(row)
    created = _utc(row.created_at)
    return Trace(row.id, example["messages"], example["tools"],
                 {"source": "log", "category": row.policy, "api_key_id": row.api_key_id, "policy": row.policy,
                  "model": row.model, "created_at": created.isoformat(), "finish_reason": row.finish_reason,
                  "stream": row.stream})


def read_request_log(db_url: str, *, api_key_ids: Sequence[int] | None = None, policies: Sequence[str] | None = None,
                     since: datetime | None = None, until: datetime | None = None) -> list[Trace]:
    """The gateway's recorded tool-call traces, oldest first.

    Args:
        db_url: the gateway's database (`sqlite:///path`, `postgresql://user@host:port/db`).
        api_key_ids: only traces of these API key ids (None: every key, the master key's too).
        policies: only traces of these policies (the `model` the client sent; None: every policy).
        since, until: only traces with since <= created_at < until (naive datetimes are UTC).
    Returns:
        One `Trace` per recorded request (id = the request id; see `to_trace`). Traces are not checked here:
        `posttrain.traces.check_trace` and the dataset do that (a model's malformed call is still a record).
    Raises:
        PosttrainDataError: the database has no `tool_trace` table (not migrated: start the gateway once, or
            `link.db.upgrade(url)`), or no trace matches the filters (the message names them and how to opt in).
        ValueError: an unsupported database URL. sqlalchemy.exc.OperationalError: the database is unreachable.
    """
    shown = make_url(db_url).render_as_string(hide_password=True)
    engine = make_db_engine(db_url, pool_size=1)
    try:
        if not inspect(engine).has_table(ToolTrace.__tablename__):
            raise PosttrainDataError(f"the database {shown} has no {ToolTrace.__tablename__} table: it is not a gateway "
                                     "database migrated to revision 0003 or later; start the gateway on it once "
                                     "(`link serve`) or run `link.db.upgrade(url)`")
        with Session(engine) as session:
            rows = query_traces(session, api_key_ids=api_key_ids, policies=policies, since=_utc(since), until=_utc(until))
            traces = [to_trace(row) for row in rows]
    finally:
        engine.dispose()
    if not traces:
        raise PosttrainDataError(f"the request log in {shown} holds no tool-call traces for "
                                 f"{_filters(api_key_ids, policies, since, until)}; {OPT_IN}")
    return traces
