"""The request log: one row per gateway request, written off the event loop; queries for /api/requests.

    writer = RequestLogWriter(engine)          # starts its flusher thread
    writer.write(RequestLogCreate(id=request_id, status="ok", ...))   # never blocks on the database
    writer.write_values({...every column...})  # the gateway's own rows, without a model per row (link/accounting.py)
    writer.close()                             # at shutdown: writes every queued row, then stops

`write` only appends to an in-memory queue (a deque: no lock, and the thread is woken by a batch's first row and by
a full batch, not by every row); one background thread inserts the queued rows in batches (one transaction and one
executemany per batch, of an INSERT compiled once: link/db/driver.py). When the database is unavailable the thread
keeps the rows and retries with backoff, so a row is lost only if the process is killed (SIGKILL, power loss) with
rows still queued (at most `flush_interval_s` worth under normal load), if a row can never be stored, or if
`max_pending` rows are already waiting (a long outage: the memory they take is bounded; each row refused is counted
in `num_dropped` and the first of each outage is logged). A batch the database or its driver refuses (a foreign
key, a value out of a column's range: SQLite's driver raises OverflowError for an integer past 64 bits) is written
row by row, so one bad row never costs the others; a row that still fails is logged with its values, counted in
`num_failed` and dropped. Nothing a row holds stops the thread.

The durability bound. The thread starts a batch with the first row queued, gathers more for at most
`flush_interval_s` (FLUSH_INTERVAL_S, 0.05 s) or until it holds `batch_size` rows, and commits it; so a row is
committed at most flush_interval_s plus two batch writes (the one under way when it was queued, and its own: a few
milliseconds each on SQLite in WAL mode or PostgreSQL on loopback) after it was queued. The gateway queues a whole
answer's row before the answer is sent and a stream's once its last byte is handed to the server, so a request
whose answer completed more than 1 s before a `kill -9` has its row, as long as the database keeps up with the
rows and stays reachable (tests/link/test_gateway_workers.py checks it under load); `close` (a clean shutdown, the
SIGTERM drain) writes every queued row before the process exits.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, insert
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, StatementError
from sqlmodel import Session, select

from link.db.driver import DriverStatement, driver_transaction
from link.db.models import RequestLog, RequestLogCreate, RequestLogPublic

logger = logging.getLogger(__name__)
# Seconds the writer gathers a batch after its first row: short enough that an answered request's row is committed
# well inside the 1 s durability bound (the module docstring), long enough to batch a busy gateway's rows.
FLUSH_INTERVAL_S = 0.05
# The request_log columns, as `write_values` takes them (`metadata` is the column's name for RequestLogCreate's
# `request_metadata`).
COLUMNS = tuple(column.key for column in RequestLog.__table__.columns)


class RequestLogWriter:
    """Writes request-log rows in batches from a background thread.

    Args:
        engine: the gateway's database engine.
        batch_size: rows per INSERT transaction at most.
        flush_interval_s: how long the thread waits to gather a batch after the first queued row (seconds).
        max_retry_delay_s: longest backoff between retries while the database is unavailable (seconds).
        max_pending: rows kept in memory at most while they wait for the database; `write` drops a row past it.
    """

    def __init__(self, engine: Engine, *, batch_size: int = 256, flush_interval_s: float = FLUSH_INTERVAL_S,
                 max_retry_delay_s: float = 5.0, max_pending: int = 100_000):
        self.engine = engine
        self.batch_size = batch_size
        self.flush_interval_s = flush_interval_s
        self.max_retry_delay_s = max_retry_delay_s
        self.num_written = 0
        self.num_failed = 0
        self.max_pending = max_pending
        self.num_dropped = 0  # rows refused by `write` (`max_pending` waiting), or left unwritten by a timed-out close
        self._is_dropping = False
        self._insert_rows = DriverStatement(engine, insert(RequestLog.__table__))
        # Rows wait in a deque (append and popleft are atomic): `write` takes no lock and wakes the thread only for a
        # batch's first row (`_has_rows`) and when a batch is full or the writer closes (`_is_urgent`), not per row.
        self._rows: deque[dict] = deque()
        self._num_in_flight = 0  # rows taken off the deque by the thread and not yet written or failed
        self._has_rows = threading.Event()
        self._is_urgent = threading.Event()
        self._is_closed = False
        self._is_abandoned = False  # closed and no longer waited for: rows that cannot be written are dropped
        self._thread = threading.Thread(target=self._run, name="request-log-writer", daemon=True)
        self._thread.start()

    @property
    def num_pending(self) -> int:
        """Rows queued and not yet written (approximate while rows are being queued)."""
        return self._num_in_flight + len(self._rows)

    def write(self, entry: RequestLogCreate) -> None:
        """Queue one row (validated by its model); returns at once (safe to call from the event loop and from any
        thread).

        Raises:
            RuntimeError: the writer is closed.
        """
        values = entry.model_dump()
        values["metadata"] = values.pop("request_metadata")  # the column's name
        self.write_values(values)

    def write_values(self, values: dict[str, Any]) -> None:
        """Queue one row given as its columns' values (every name of COLUMNS; `created_at` a UTC datetime), as
        RequestLogCreate would validate them: the gateway's own rows, without a model's cost per row.

        Raises:
            RuntimeError: the writer is closed.
        """
        if self._is_closed:
            raise RuntimeError("RequestLogWriter is closed")
        if self.num_pending >= self.max_pending:
            if not self._is_dropping:
                logger.error("request log: %d rows wait for the database already; dropping row %s and the next ones "
                             "until they are written", self.max_pending, values.get("id"))
            self._is_dropping = True
            self.num_dropped += 1
            return
        self._is_dropping = False
        self._rows.append(values)
        if not self._has_rows.is_set():
            self._has_rows.set()
        if len(self._rows) >= self.batch_size and not self._is_urgent.is_set():
            self._is_urgent.set()

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every row queued so far is written (or failed for good); False on timeout."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while self.num_pending:
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    @property
    def is_running(self) -> bool:
        """Whether the writer thread still runs (it ends after `close`; after a timed-out close, once it has
        dropped what the database refuses)."""
        return self._thread.is_alive()

    def close(self, timeout_s: float | None = None) -> None:
        """Stop accepting rows, write every queued row, stop the thread. With `timeout_s`, give up waiting
        after that long: rows the database still refuses then are dropped (counted in `num_dropped`) rather than
        retried for the rest of the process's life; rows it accepts are still written."""
        if self._is_closed:
            return
        self._is_closed = True
        self._is_urgent.set()
        self._has_rows.set()
        self._thread.join(timeout_s)
        self._is_abandoned = self._thread.is_alive()

    def _run(self) -> None:
        while True:
            self._has_rows.wait()
            # A batch starts with its first row: gather for flush_interval_s, unless it fills up or the writer closes.
            if len(self._rows) < self.batch_size and not self._is_closed:
                self._is_urgent.wait(self.flush_interval_s)
            if not self._is_closed:
                self._is_urgent.clear()
            self._has_rows.clear()  # before taking rows: a row queued from now on sets it again
            while self._rows:
                # counted in flight before they leave the deque, so `num_pending` never misses them
                self._num_in_flight = min(len(self._rows), self.batch_size)
                batch = [self._rows.popleft() for _ in range(self._num_in_flight)]
                self._write_guarded(batch)
                self._num_in_flight = 0
                if not self._is_closed:
                    break  # the rest (a backlog) starts the next batch at once: `_has_rows` is set again
                # closing: write everything left, row batch by row batch, then stop
            if self._rows:
                self._has_rows.set()
            elif self._is_closed:
                return

    def _write_guarded(self, batch: list[dict]) -> None:
        """`_write_with_retries`, and whatever else goes wrong is logged: the thread must outlive any row."""
        try:
            self._write_with_retries(batch)
        except Exception:
            self.num_failed += len(batch)
            logger.exception("request log: %d rows could not be stored; rows: %r", len(batch), batch)

    def _write_with_retries(self, batch: list[dict]) -> None:
        delay = 0.05
        while True:
            try:
                self._insert(batch)
                self.num_written += len(batch)
                return
            except (IntegrityError, DataError):  # the rows themselves: write them one by one
                self._write_one_by_one(batch)
                return
            except DBAPIError as exc:  # unreachable, locked, schema not migrated yet: keep the rows, retry
                if self._is_abandoned:
                    self.num_dropped += len(batch)
                    logger.error("request log: closed while the database is unavailable; %d rows dropped", len(batch))
                    return
                logger.warning("request log: database unavailable (%s); retrying %d rows in %.2fs",
                               str(exc.orig).splitlines()[0], len(batch), delay)
                time.sleep(delay)
                delay = min(2 * delay, self.max_retry_delay_s)
            except (StatementError, ArithmeticError, TypeError, ValueError, KeyError):
                # a value that cannot be bound: a row problem (SQLite's driver raises OverflowError itself)
                self._write_one_by_one(batch)
                return

    def _write_one_by_one(self, batch: list[dict]) -> None:
        if len(batch) == 1:
            self._insert_repaired(batch[0])
            return
        for values in batch:
            self._write_with_retries([values])

    def _insert(self, batch: list[dict]) -> None:
        with driver_transaction(self.engine) as cursor:
            self._insert_rows.execute_many(cursor, [_json_safe(values) for values in batch])

    def _insert_repaired(self, values: dict) -> None:
        """Last resort for a row the database refuses: drop the key reference (a deleted key), then try once more."""
        repaired = dict(values, api_key_id=None)
        if values.get("api_key_id") is not None:
            repaired["error"] = f"{values['error'] or ''} [api_key_id {values['api_key_id']} dropped]".strip()
        try:
            self._insert([repaired])
            self.num_written += 1
        except (StatementError, ArithmeticError, TypeError, ValueError, KeyError) as exc:
            self.num_failed += 1
            logger.error("request log: row %s could not be stored: %s; row: %r", values.get("id"), exc, values)


def _json_safe(values: dict) -> dict:
    """Make the JSON columns serializable (datetimes, sets, ... become strings) so no driver chokes on them."""
    for name in ("decision", "metadata"):
        if values[name] is None:
            continue
        try:
            json.dumps(values[name])
        except (TypeError, ValueError):
            values = dict(values, **{name: json.loads(json.dumps(values[name], default=str))})
    return values


MAX_OFFSET = 2**31 - 1   # rows to skip at most: far beyond any log, inside every database's OFFSET
MAX_ID = 2**63 - 1       # the largest integer id a query may compare (SQLite and BIGINT columns are 64-bit)


def query_requests(session: Session, *, limit: int = 100, offset: int = 0, api_key_id: int | None = None,
                   model: str | None = None, policy: str | None = None, status: str | None = None,
                   since: datetime | None = None, until: datetime | None = None) -> list[RequestLogPublic]:
    """Request-log rows, newest first, filtered by any of key, model, policy, status and a time range.

    Args:
        limit: rows at most (1..1000); offset: rows to skip (paging; 0..MAX_OFFSET).
        since, until: UTC datetimes; rows with since <= created_at < until.

    Raises:
        ValueError: a limit outside 1..1000 or an offset outside 0..MAX_OFFSET.
    """
    if not 1 <= limit <= 1000 or not 0 <= offset <= MAX_OFFSET:
        raise ValueError(f"limit must be in 1..1000 and offset in 0..{MAX_OFFSET}, got limit={limit}, offset={offset}")
    query = select(RequestLog)
    for column, value in ((RequestLog.api_key_id, api_key_id), (RequestLog.model, model),
                          (RequestLog.policy, policy), (RequestLog.status, status)):
        if value is not None:
            query = query.where(column == value)
    if since is not None:
        query = query.where(RequestLog.created_at >= since)
    if until is not None:
        query = query.where(RequestLog.created_at < until)
    query = query.order_by(RequestLog.created_at.desc(), RequestLog.id.desc()).offset(offset).limit(limit)
    return [RequestLogPublic.from_row(row) for row in session.exec(query)]


def get_request(session: Session, request_id: str) -> RequestLogPublic | None:
    """One request-log row by its request id, or None."""
    row = session.get(RequestLog, request_id)
    return None if row is None else RequestLogPublic.from_row(row)
