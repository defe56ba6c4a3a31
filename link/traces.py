"""Tool-call traces: chat requests with `tools` and their answers, recorded for keys or policies that opted in,
as training data for `posttrain`.

    recorder = TraceRecorder(engine)                        # in the lifespan (link/state.py); a writer thread
    capture = recorder.start(record, policy, body)          # None unless the request is to be recorded
    finish_whole(capture, response)                         # a whole answer: its row is queued
    frames = watch(capture, frames)                         # a streamed answer: assembled from the client's SSE
                                                            # frames; its row is queued at `data: [DONE]`
    rows = query_traces(session, api_key_ids=[3], since=...)
    fine_tuning_example(row)      # {"messages": [..., the assistant's answer], "tools": [...]} (OpenAI's format)

A request is recorded when it is a chat request with a non-empty `tools` list (and `tool_choice` is not
"none": then no tool was offered to the model), its key has `capture_traces` on (`link keys create
--capture-traces`, `PATCH /api/keys/{id}`) or its policy has `options.capture_traces: true`, and its answer
finished without error. The row (table `tool_trace`, `link.db.models.ToolTrace`) holds the request's
messages and tools as sent and the answer's first choice as one assistant message: `content` when it has
text (also "" when it has neither text nor calls), `tool_calls` ([{"id", "type": "function", "function":
{"name", "arguments"}}], arguments a JSON string) when it called tools. A stream's message is assembled from
its deltas exactly as the client received them, so a whole and a streamed answer give the same row.

Recording never touches the request: rows are queued and inserted by one background thread; a row that
cannot be stored (database down for longer than the retries, a bad value) is logged and dropped, and the
user's answer is unaffected. The request log (link/request_log.py) is written as always.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, AsyncIterator, Sequence

from sqlalchemy import Engine, insert
from sqlalchemy.exc import InterfaceError, OperationalError, SQLAlchemyError
from sqlmodel import Session, select

from link.accounting import RequestRecord
from link.db.models import ToolTrace, utcnow

logger = logging.getLogger(__name__)
_STOP = object()
WRITE_ATTEMPTS = 4  # a row is retried this often (backoff 0.1, 0.2, 0.4 s) while the database is unreachable


def assistant_message(content: str | None, tool_calls: Sequence[dict]) -> dict[str, Any]:
    """The assistant turn of a trace: {"role": "assistant"} plus `content` when it has text or there are no
    calls, plus `tool_calls` (id, type "function", function name and arguments string) when there are."""
    message: dict[str, Any] = {"role": "assistant"}
    if content or not tool_calls:
        message["content"] = content or ""
    if tool_calls:
        message["tool_calls"] = [{"id": c.get("id"), "type": c.get("type") or "function",
                                  "function": {"name": (c.get("function") or {}).get("name") or "",
                                               "arguments": (c.get("function") or {}).get("arguments") or ""}}
                                 for c in tool_calls]
    return message


@dataclass
class StreamAssembler:
    """The first choice of a chat completion stream, put together from its chunks (OpenAI delta semantics:
    content pieces concatenate; a tool call's pieces share its `index`, name and arguments concatenate)."""

    content: list[str] = field(default_factory=list)
    calls: dict[int, dict] = field(default_factory=dict)
    finish_reason: str | None = None

    def add(self, chunk: dict) -> None:
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str):
                self.content.append(delta["content"])
            for piece in delta.get("tool_calls") or ():
                call = self.calls.setdefault(int(piece.get("index", len(self.calls))),
                                             {"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
                call["id"] = piece.get("id") or call["id"]
                call["type"] = piece.get("type") or call["type"]
                function = piece.get("function") or {}
                call["function"]["name"] += function.get("name") or ""
                call["function"]["arguments"] += function.get("arguments") or ""
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    def message(self) -> dict[str, Any]:
        return assistant_message("".join(self.content) or None, [self.calls[i] for i in sorted(self.calls)])


@dataclass
class TraceCapture:
    """One request being recorded: `finish_whole` or `watch` queues its row once the answer is complete."""

    recorder: TraceRecorder
    record: RequestRecord
    messages: list
    tools: list
    assembler: StreamAssembler = field(default_factory=StreamAssembler)
    is_done: bool = False

    def finish(self, message: dict, finish_reason: str | None) -> None:
        if self.is_done or self.record.status != "ok":
            return
        self.is_done = True
        identity = self.record.identity
        self.recorder.write({"id": self.record.request_id, "created_at": utcnow(),
                             "api_key_id": identity.key_id if identity else None,
                             "policy": (self.record.policy or "")[:128] or None, "model": self.record.model,
                             "stream": self.record.stream, "messages": self.messages, "tools": self.tools,
                             "response": message, "finish_reason": finish_reason})

    def feed(self, data: bytes) -> None:
        """Read one SSE frame of the client's stream; `data: [DONE]` after a successful stream queues the row."""
        for event in data.split(b"\n\n"):
            if not event.startswith(b"data: "):
                continue  # a keep-alive comment
            payload = event[len(b"data: "):].strip()
            if payload == b"[DONE]":
                self.finish(self.assembler.message(), self.assembler.finish_reason)
            else:
                self.assembler.add(json.loads(payload))


def finish_whole(capture: TraceCapture | None, response: dict) -> None:
    """Queue the trace of a whole answer (an OpenAI chat.completion dict); never raises."""
    if capture is None:
        return
    try:
        choice = (response.get("choices") or [{}])[0]
        message = choice.get("message") or {}
        capture.finish(assistant_message(message.get("content"), message.get("tool_calls") or ()), choice.get("finish_reason"))
    except Exception:
        logger.exception("request %s: its tool-call trace could not be recorded", capture.record.request_id)


def watch(capture: TraceCapture | None, frames: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """`frames` (the client's SSE bytes) passed on unchanged and, with a capture, read on the way to assemble
    its trace (a failure to record is logged, never raised)."""
    return frames if capture is None else _watched(capture, frames)


async def _watched(capture: TraceCapture, frames: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    try:
        async for data in frames:
            if not capture.is_done:
                try:
                    capture.feed(data)
                except Exception:
                    logger.exception("request %s: its tool-call trace could not be recorded", capture.record.request_id)
                    capture.is_done = True
            yield data
    finally:
        await frames.aclose()


class TraceRecorder:
    """Decides which requests are recorded and writes their rows from one background thread.

    Args:
        engine: the gateway's database (migrated to revision 0003 or later).
    """

    def __init__(self, engine: Engine):
        self.engine = engine
        self.num_written = 0
        self.num_failed = 0
        self._queue: queue.Queue = queue.Queue()
        self._is_closed = False
        self._thread = threading.Thread(target=self._run, name="tool-trace-writer", daemon=True)
        self._thread.start()

    def start(self, record: RequestRecord, policy: Any, body: dict) -> TraceCapture | None:
        """A capture for `record` when it is to be recorded (see the module docstring), else None.
        `policy` is the resolved `link.policies.Policy`; `body` the validated request."""
        tools = body.get("tools")
        if record.endpoint != "chat" or not tools or body.get("tool_choice") == "none" or self._is_closed:
            return None
        key_opted_in = record.identity is not None and record.identity.capture_traces
        if not (key_opted_in or getattr(policy, "capture_traces", False)):
            return None
        return TraceCapture(self, record, list(body.get("messages") or []), list(tools))

    def write(self, values: dict) -> None:
        """Queue one row (the columns of `ToolTrace`); returns at once."""
        if not self._is_closed:
            self._queue.put(values)

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every row queued so far is written or dropped; False on timeout."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while self._queue.unfinished_tasks:
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    def close(self, timeout_s: float | None = None) -> None:
        """Write the queued rows, then stop the thread (waiting at most `timeout_s` seconds)."""
        if self._is_closed:
            return
        self._is_closed = True
        self._queue.put(_STOP)
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            values = self._queue.get()
            try:
                if values is _STOP:
                    return
                self._insert(values)
            finally:
                self._queue.task_done()

    def _insert(self, values: dict) -> None:
        delay = 0.1
        for attempt in range(1, WRITE_ATTEMPTS + 1):
            try:
                with self.engine.begin() as connection:
                    connection.execute(insert(ToolTrace.__table__), [values])
                self.num_written += 1
                return
            except (OperationalError, InterfaceError) as exc:  # unreachable or locked: retry with backoff
                error: Exception = exc
                if attempt < WRITE_ATTEMPTS:
                    time.sleep(delay)
                    delay *= 2
            except SQLAlchemyError as exc:  # the row itself is refused (a constraint, a value that cannot be bound)
                error = exc
                break
        self.num_failed += 1
        logger.error("tool trace of request %s was not stored: %s", values.get("id"), str(error).splitlines()[0])


# --- the read path (GET /api/traces, posttrain/traces_log.py) ------------------------------------


def query_traces(session: Session, *, api_key_ids: Sequence[int] | None = None, policies: Sequence[str] | None = None,
                 since: datetime | None = None, until: datetime | None = None, limit: int | None = None) -> list[ToolTrace]:
    """Trace rows, oldest first, with since <= created_at < until (UTC), of any of `api_key_ids` and any of
    `policies` (None: no filter); at most `limit` rows (None: all)."""
    query = select(ToolTrace)
    if api_key_ids is not None:
        query = query.where(ToolTrace.api_key_id.in_(list(api_key_ids)))
    if policies is not None:
        query = query.where(ToolTrace.policy.in_(list(policies)))
    if since is not None:
        query = query.where(ToolTrace.created_at >= since)
    if until is not None:
        query = query.where(ToolTrace.created_at < until)
    query = query.order_by(ToolTrace.created_at, ToolTrace.id)
    if limit is not None:
        query = query.limit(limit)
    return list(session.exec(query))


def fine_tuning_example(row: ToolTrace) -> dict[str, Any]:
    """One line of OpenAI's chat fine-tuning JSONL: {"messages": [...the request's, the answer], "tools": [...]}
    (https://platform.openai.com/docs/guides/supervised-fine-tuning, "function calling" examples).

    The request's own assistant turns get "weight": 0 (context, not learned): an agent loop resends its earlier
    answers with every step, and each of those was recorded as the answer of its own request already."""
    history = [{**m, "weight": 0} if isinstance(m, dict) and m.get("role") == "assistant" else m for m in row.messages]
    return {"messages": [*history, row.response], "tools": row.tools}
