"""Tables of `link eval` (SQLModel): run records, the response cache and stored reports.

    eval_run     one `link eval run`: suite, split, targets, parameters, status, totals, where its outcome file is
    eval_cache   one target response per request (key = sha256 of target, suite, item and the full request), so an
                 interrupted run resumes without calling the model again
    eval_report  a rendered report (Markdown, JSON data, PNG plot) for the console

Written by `evals.cache.EvalStore`; created by migration 0002. Times are UTC.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, LargeBinary, Text
from sqlmodel import Field, SQLModel

from link.db.models import time_column

RUN_STATUSES = ("running", "finished", "stopped", "interrupted", "failed")


class EvalRun(SQLModel, table=True):
    """A run of one suite against one or more targets. `totals` maps target -> summary numbers."""

    __tablename__ = "eval_run"

    id: str = Field(primary_key=True, max_length=64)
    suite: str = Field(max_length=64, index=True)
    split: str = Field(default="", max_length=64)
    targets: list[str] = Field(default_factory=list, sa_type=JSON)
    params: dict[str, Any] = Field(default_factory=dict, sa_type=JSON)
    status: str = Field(default="running", max_length=32, description=" / ".join(RUN_STATUSES))
    created_at: datetime = time_column(index=True)
    finished_at: datetime | None = time_column(nullable=True)
    totals: dict[str, Any] | None = Field(default=None, sa_type=JSON)
    outcomes_path: str | None = Field(default=None, sa_type=Text)


class EvalCache(SQLModel, table=True):
    """One cached target response (`evals.targets.Completion` as a dict)."""

    __tablename__ = "eval_cache"

    key: str = Field(primary_key=True, max_length=64, description="sha256 hex of the request")
    target: str = Field(max_length=256, index=True)
    suite: str = Field(max_length=64)
    item_id: str = Field(max_length=512)
    response: dict[str, Any] = Field(default_factory=dict, sa_type=JSON)
    created_at: datetime = time_column()


class EvalReport(SQLModel, table=True):
    """A report over one or more runs: its Markdown, its JSON data and its PNG plot (bytes)."""

    __tablename__ = "eval_report"

    id: str = Field(primary_key=True, max_length=64)
    title: str = Field(default="", max_length=512)
    run_ids: list[str] = Field(default_factory=list, sa_type=JSON)
    markdown: str = Field(default="", sa_type=Text)
    data: dict[str, Any] = Field(default_factory=dict, sa_type=JSON)
    png: bytes | None = Field(default=None, sa_type=LargeBinary, nullable=True)
    created_at: datetime = time_column(index=True)
