"""The eval database: a response cache (an interrupted run resumes), run records and stored reports.

    store = EvalStore()                              # LINK_DATABASE_URL, else SQLite under LINK_HOME; migrated
    cached = CachedTarget(target, store, suite="gsm8k", item_id="gsm8k/test/17")
    completion = await cached.chat(messages, temperature=0, max_tokens=512)   # a second identical call: no model call
    store.save_run({"id": run_id, "suite": "gsm8k", "targets": [...], "status": "finished", ...})
    store.load_run_outcomes(run_id)                  # OutcomeTable read from the run's outcome file

Tables: link/db/evals.py (migration 0002). Works on SQLite and PostgreSQL alike.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import uuid
from dataclasses import asdict
from datetime import datetime, timezone
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, select

from evals.outcomes import OutcomeTable
from evals.targets import Completion, Target
from link.db import make_db_engine, upgrade
from link.db.evals import RUN_STATUSES, EvalCache, EvalReport, EvalRun

_RUN_FIELDS = ("suite", "split", "targets", "params", "status", "totals", "outcomes_path", "finished_at")


def cache_key(target: str, suite: str, item_id: str, kind: str, request: Any, params: dict[str, Any]) -> str:
    """sha256 hex of (target name, suite, item id, "chat"/"completion", the messages or prompt, the params).

    The JSON is canonical (sorted keys, no whitespace), so equal requests give equal keys in any process.
    """
    payload = {"target": target, "suite": suite, "item": item_id, "kind": kind, "request": request, "params": params}
    text = json.dumps(payload, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _run_dict(row: EvalRun) -> dict[str, Any]:
    data = row.model_dump()
    for name in ("created_at", "finished_at"):
        if data[name] is not None and data[name].tzinfo is None:
            data[name] = data[name].replace(tzinfo=timezone.utc)  # SQLite hands back naive UTC
    return data


class EvalStore:
    """The eval tables of the link database.

    Args:
        database_url: SQLite or PostgreSQL URL; default `Settings().database_url` (LINK_DATABASE_URL, else
            `sqlite:///$LINK_HOME/link.db`). The schema is upgraded to head on open.
    Raises:
        ValueError: an unsupported URL. sqlalchemy.exc.OperationalError: the database is unreachable.
    """

    def __init__(self, database_url: str | None = None):
        if database_url is None:
            from link.settings import get_settings

            database_url = get_settings().database_url
        self.database_url = database_url
        upgrade(database_url)
        self.engine = make_db_engine(database_url)

    def close(self) -> None:
        self.engine.dispose()

    # --- response cache -----------------------------------------------------------------------------

    def get_cached(self, key: str) -> dict[str, Any] | None:
        """The stored response for `key`, or None."""
        with Session(self.engine) as session:
            row = session.get(EvalCache, key)
            return None if row is None else dict(row.response)

    def put_cached(self, key: str, *, target: str, suite: str, item_id: str, response: dict[str, Any]) -> None:
        """Store a response; a key already stored (a concurrent writer) keeps its first response."""
        with Session(self.engine) as session:
            if session.get(EvalCache, key) is not None:
                return
            session.add(EvalCache(key=key, target=target, suite=suite, item_id=item_id, response=response))
            try:
                session.commit()
            except IntegrityError:
                session.rollback()

    # --- runs ---------------------------------------------------------------------------------------

    def save_run(self, record: dict[str, Any]) -> None:
        """Insert or update a run by `record["id"]`; other keys: suite, split, targets (list), params (dict),
        status (one of RUN_STATUSES), totals (dict), outcomes_path (str), finished_at (datetime).

        Raises:
            ValueError: an unknown status, or a new run without `suite`.
        """
        status = record.get("status")
        if status is not None and status not in RUN_STATUSES:
            raise ValueError(f"run status must be one of {RUN_STATUSES}, got {status!r}")
        values = {k: record[k] for k in _RUN_FIELDS if k in record}
        if "outcomes_path" in values and values["outcomes_path"] is not None:
            values["outcomes_path"] = str(values["outcomes_path"])
        with Session(self.engine) as session:
            row = session.get(EvalRun, record["id"])
            if row is None:
                if "suite" not in values:
                    raise ValueError("a new run record needs a suite")
                row = EvalRun(id=record["id"], **values)
            else:
                for name, value in values.items():
                    setattr(row, name, value)
            session.add(row)
            session.commit()

    def get_run(self, run_id: str) -> dict[str, Any] | None:
        """The run record as a dict (times UTC-aware), or None."""
        with Session(self.engine) as session:
            row = session.get(EvalRun, run_id)
            return None if row is None else _run_dict(row)

    def list_runs(self) -> list[dict[str, Any]]:
        """Every run record, newest first."""
        with Session(self.engine) as session:
            rows = session.exec(select(EvalRun).order_by(EvalRun.created_at.desc(), EvalRun.id)).all()
            return [_run_dict(r) for r in rows]

    def load_run_outcomes(self, run_id: str) -> OutcomeTable:
        """The outcome table of a run, read from its outcome file.

        Raises:
            KeyError: no such run. FileNotFoundError: the run wrote no outcome file (or it was moved).
        """
        run = self.get_run(run_id)
        if run is None:
            raise KeyError(f"no eval run {run_id!r}; `link eval run` prints the id of each run")
        if not run["outcomes_path"]:
            raise FileNotFoundError(f"eval run {run_id!r} has no outcome file (status {run['status']})")
        return OutcomeTable.read(run["outcomes_path"])

    # --- reports ------------------------------------------------------------------------------------

    def save_report(self, *, title: str, run_ids: list[str], markdown: str, data: dict[str, Any],
                    png: bytes | None = None) -> str:
        """Store a report; returns its new id (hex)."""
        report_id = uuid.uuid4().hex[:16]
        with Session(self.engine) as session:
            session.add(EvalReport(id=report_id, title=title, run_ids=list(run_ids), markdown=markdown, data=data, png=png))
            session.commit()
        return report_id

    def get_report(self, report_id: str) -> dict[str, Any] | None:
        """A stored report as a dict (png as bytes), or None."""
        with Session(self.engine) as session:
            row = session.get(EvalReport, report_id)
            return None if row is None else row.model_dump()


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class CachedTarget:
    """A target whose responses are stored in `store`, keyed by `cache_key`; a hit calls no model.

    Args:
        target: the wrapped target (its `name`, `prices` and `call_bound` are passed through).
        store: where responses live; None disables the cache (every call goes through).
        suite, item_id: part of the key (and stored for inspection).
    Attributes:
        hits, misses: calls answered from the store / by the target.
    """

    def __init__(self, target: Target, store: EvalStore | None, suite: str, item_id: str):
        self.target, self.store, self.suite, self.item_id = target, store, suite, item_id
        self.name = target.name
        self.prices = getattr(target, "prices", None)
        self.call_bound = getattr(target, "call_bound", None)
        self.hits = self.misses = 0

    async def chat(self, messages: list[dict[str, Any]], **params: Any) -> Completion:
        return await self._cached("chat", messages, params)

    async def complete(self, prompt: str, **params: Any) -> Completion:
        return await self._cached("completion", prompt, params)

    async def _cached(self, kind: str, request: Any, params: dict[str, Any]) -> Completion:
        key = cache_key(self.name, self.suite, self.item_id, kind, request, params)
        if self.store is not None:
            stored = await asyncio.to_thread(self.store.get_cached, key)
            if stored is not None:
                self.hits += 1
                return Completion(**stored)
        call = self.target.chat if kind == "chat" else self.target.complete
        completion = await call(request, **params)
        self.misses += 1
        if self.store is not None:
            # Shielded: a run cancelled now (Ctrl-C) still stores the answer it paid for; asyncio.run waits for
            # the executor's threads before it returns. (An unshielded to_thread could be dropped while queued.)
            put = functools.partial(self.store.put_cached, key, target=self.name, suite=self.suite,
                                    item_id=self.item_id, response=asdict(completion))
            await asyncio.shield(asyncio.get_running_loop().run_in_executor(None, put))
        return completion
