"""Running a plan of several model calls (`Plan.executor`: cascade, Mixture-of-Agents) for one request.

    caller = GatewayCaller(pools, record, plan.policy)              # routers.calls.ModelCaller over the backends
    response = await execute_whole(plan.executor, caller, record, body)
    live = await start_executed_stream(plan.executor, caller, record, body)
    async for frame in executed_frames(live, record, include_usage): ...   # SSE bytes, keep-alives, `[DONE]` last

Every call goes through `proxy.complete` / `proxy.open_stream` for one model (its replicas retried before
the first byte) and is accounted in the request's record at its deployment's prices (`RequestRecord.add_call`):
the record's tokens and cost, and so the request-log row, the key's spend and `x-link-cost-usd`, are the sums
over all calls. The answer's `model` and `x-link-model` name the model that wrote the final answer.

The `usage` the client gets (whole, or the usage chunk of a stream) is the answer's own, as OpenAI clients and
cost libraries read it: the tokens of the call that wrote it (the MoA's aggregator, the cascade step that
answered), so `completion_tokens` stays within `max_tokens`. What the request is billed for rides along in the
extension field `usage.link_billed` (`billed_usage`):

    "usage": {"prompt_tokens": 61, "completion_tokens": 9, "total_tokens": 70,
              "link_billed": {"prompt_tokens": 75, "completion_tokens": 27, "total_tokens": 102,
                              "cost_usd": 0.000129, "calls": 3}}

A streamed executed plan runs in one background task that feeds a queue (so the executor's generators and
the backends' streams live in one task). While nothing arrives the client gets an SSE comment
`: keep-alive` every `KEEPALIVE_S` seconds; clients ignore comments, proxies see a live connection. An
executor with `keepalive` starts the response at once (MoA: keep-alives flow while the proposers work);
otherwise the first chunk is awaited first, so a failure before it is an ordinary HTTP error.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

import anyio

from link.accounting import RequestRecord, estimate_prompt_tokens
from link.backends import BackendError
from link.config import ModelDeployment
from link.deployments import DeploymentPool
from link.policies import Plan, PlanExecutor
from link.proxy import complete, ended_stream, has_output, open_stream
from protocol.sse import frame

logger = logging.getLogger(__name__)
KEEPALIVE = b": keep-alive\n\n"
KEEPALIVE_S = 2.0


def _endpoint(body: dict[str, Any]) -> str:
    return "chat" if "messages" in body else "completion"


class GatewayCaller:
    """`routers.calls.ModelCaller` over the gateway's deployment pools, accounting each call in `record`.

    Args:
        pools: the gateway's pools by public model name.
        record: the request's record (tokens, cost, the calls in `decision["calls"]`, failed attempts).
        policy: the policy's name (for error messages).
    Raises (complete, stream): BackendError, as `proxy.complete` / `proxy.open_stream`; a model the gateway
        does not serve is a BackendError 404 (code model_not_found).
    A call cancelled before its answer (a proposer past its deadline) is aborted and not charged.
    """

    def __init__(self, pools: dict[str, DeploymentPool], record: RequestRecord, policy: str):
        self.pools, self.record, self.policy = pools, record, policy
        self.deployments: dict[str, ModelDeployment] = {}  # the last deployment that answered, by model
        record.is_executed = True

    def _plan(self, model: str) -> Plan:
        if model not in self.pools:
            raise BackendError(f"policy {self.policy!r} calls {model!r}, which the gateway does not serve", status_code=404,
                               code="model_not_found")
        return Plan(self.policy, [model])

    @staticmethod
    def _charged_tokens(call: RequestRecord) -> tuple[int, int]:
        """(prompt, completion) tokens a call is charged: its usage, else (a backend that reported none, a stream that
        died before its usage chunk) the prompt estimated and a token per content chunk."""
        if call.has_usage:
            return call.prompt_tokens, call.completion_tokens
        return estimate_prompt_tokens(call.endpoint, call.body or {}), call.num_content_chunks

    def _account(self, model: str, call: RequestRecord) -> None:
        for attempt in call.decision.get("attempts", []):
            self.record.decision.setdefault("attempts", []).append(attempt)
        if call.deployment is None:
            return
        self.deployments[model] = call.deployment
        prompt_tokens, completion_tokens = self._charged_tokens(call)
        self.record.add_call(model, call.deployment, prompt_tokens, completion_tokens, estimated=not call.has_usage)

    async def complete(self, model: str, body: dict[str, Any]) -> dict[str, Any]:
        """One whole answer of `model` (`model` in it renamed to the public name), its `usage` the call's charge."""
        endpoint = _endpoint(body)
        call = RequestRecord(endpoint=endpoint, body=body)
        try:
            response = await complete(self.pools, self._plan(model), call, endpoint, body)
        finally:
            self._account(model, call)
        response["usage"] = {**(response.get("usage") or {}), **_counts(*self._charged_tokens(call))}
        return response

    async def stream(self, model: str, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """`model`'s chunks (usage always requested; the usage chunk is passed on, and one with the call's estimated
        charge is added when the backend sent none)."""
        endpoint = _endpoint(body)
        call = RequestRecord(endpoint=endpoint, body=body)
        try:
            live = await open_stream(self.pools, self._plan(model), call, endpoint, body)
        except BaseException:
            self._account(model, call)
            raise
        failure: BaseException | None = None
        chunk: dict | None = live.first
        try:
            while chunk is not None:
                call.add_usage(chunk.get("usage"))
                if has_output(chunk):
                    call.num_content_chunks += 1
                chunk["model"] = model
                yield chunk
                try:
                    chunk = await anext(live.chunks)
                except StopAsyncIteration:
                    chunk = None
            if not call.has_usage:
                yield {"id": live.first.get("id"), "object": live.first.get("object"), "created": live.first.get("created"),
                       "model": model, "choices": [], "usage": _counts(*self._charged_tokens(call))}
        except BaseException as exc:
            failure = exc
            raise
        finally:
            await live.close(failure)
            self._account(model, call)


def _as_backend_error(exc: BaseException, record: RequestRecord) -> BaseException:
    """An executor's failure as the BackendError the client is sent (anything else is a bug: a 500, logged)."""
    if isinstance(exc, BackendError):
        return exc
    logger.error("request %s: the plan's executor failed", record.request_id, exc_info=exc)
    return BackendError(f"internal error ({type(exc).__name__}); request id {record.request_id}", status_code=500)


def _counts(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens}


def billed_usage(record: RequestRecord) -> dict[str, Any]:
    """`usage.link_billed`: the tokens and cost (USD) of every call the request made, and the number of calls."""
    return {**_counts(record.prompt_tokens, record.completion_tokens), "cost_usd": record.calls_cost_usd,
            "calls": len(record.decision.get("calls", []))}


def answer_usage(own: dict[str, Any] | None, record: RequestRecord) -> dict[str, Any]:
    """The client's `usage`: `own`, the usage of the call that wrote the answer (its token details kept; zeros
    when the executor's answer carried none), plus `link_billed` (`billed_usage`). Call once every call is done."""
    own = own or {}
    counts = _counts(own.get("prompt_tokens") or 0, own.get("completion_tokens") or 0)
    return {**own, **counts, "link_billed": billed_usage(record)}


def _finish_model(record: RequestRecord, caller: GatewayCaller, model: str | None) -> None:
    if model:
        record.model = model
        record.deployment = caller.deployments.get(model, record.deployment)


async def execute_whole(executor: PlanExecutor, caller: GatewayCaller, record: RequestRecord, body: dict[str, Any]) -> dict:
    """The executor's whole answer, its `usage` the answer's own plus `link_billed` (`answer_usage`). Raises
    BackendError."""
    response = await executor.complete(caller, body, record.decision)
    _finish_model(record, caller, response.get("model"))
    response["usage"] = answer_usage(response.get("usage"), record)
    return response


@dataclass
class ExecutedStream:
    """An executed plan's chunks, produced by one background task into a queue of ("chunk" | "end" | "error", x)."""

    task: asyncio.Task | None = None
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    first: tuple[str, Any] | None = None  # an item taken before the response started (executors without keepalive)
    is_closed: bool = False
    _getter: asyncio.Task | None = None

    async def next(self, timeout_s: float) -> tuple[str, Any] | None:
        """The next item, or None when none arrived within `timeout_s` seconds (nothing is lost: the pending
        read carries over to the next call)."""
        if self.first is not None:
            item, self.first = self.first, None
            return item
        if self._getter is None:
            self._getter = asyncio.ensure_future(self.queue.get())
        done, _ = await asyncio.wait({self._getter}, timeout=timeout_s)
        if not done:
            return None
        item, self._getter = self._getter.result(), None
        return item

    async def close(self, failure: BaseException | None = None) -> None:
        """Stop the producer (cancelling calls in flight, which aborts them) and wait for it; idempotent."""
        if self.is_closed:
            return
        self.is_closed = True
        with anyio.CancelScope(shield=True):
            for task in (self._getter, self.task):
                if task is not None and not task.done():
                    task.cancel()
                    try:
                        await task
                    except BaseException:  # noqa: BLE001 - the task's cancellation or its error, both reported already
                        pass


async def start_executed_stream(executor: PlanExecutor, caller: GatewayCaller, record: RequestRecord,
                                body: dict[str, Any]) -> ExecutedStream:
    """Start the producer task; for an executor without `keepalive`, wait for its first item.

    Raises:
        BackendError: (no keepalive) the plan failed before its first chunk.
    """
    live = ExecutedStream()
    record.model = executor.final_model or record.model

    async def produce() -> None:
        try:
            async for chunk in executor.stream(caller, body, record.decision):
                await live.queue.put(("chunk", chunk))
            await live.queue.put(("end", None))
        except Exception as exc:  # noqa: BLE001 - handed to the consumer, which reports it
            await live.queue.put(("error", exc))

    live.task = asyncio.create_task(produce())
    if executor.keepalive:
        return live
    try:
        while (item := await live.next(KEEPALIVE_S)) is None:
            pass
        if item[0] == "error":
            raise _as_backend_error(item[1], record)
    except BaseException:
        await live.close()
        raise
    live.first = item
    if item[0] == "chunk":
        _finish_model(record, caller, item[1].get("model"))
    return live


def executed_frames(live: ExecutedStream, record: RequestRecord, caller: GatewayCaller, include_usage: bool, *,
                    keepalive_s: float | None = None) -> AsyncIterator[bytes]:
    """The client's SSE bytes: keep-alive comments while waiting (every `keepalive_s`, default `KEEPALIVE_S`
    seconds), the final answer's chunks (usage stripped), when asked a usage chunk as a whole answer's
    (`answer_usage`: the answer's own call, `link_billed` the sums over every call), then `[DONE]`. Sets
    record.status as `proxy.sse_frames` does (`proxy.ended_stream`)."""
    keepalive_s = KEEPALIVE_S if keepalive_s is None else keepalive_s
    return ended_stream(_executed_chunk_frames(live, record, caller, include_usage, keepalive_s), record, live.close,
                        "after the response started")


async def _executed_chunk_frames(live: ExecutedStream, record: RequestRecord, caller: GatewayCaller, include_usage: bool,
                                 keepalive_s: float) -> AsyncIterator[bytes]:
    last: dict | None = None
    own: dict | None = None  # the usage of the call that writes the answer (GatewayCaller always sends one)
    while True:
        item = await live.next(keepalive_s)
        if item is None:
            yield KEEPALIVE
            continue
        kind, value = item
        if kind == "end":
            break
        if kind == "error":
            raise _as_backend_error(value, record)
        chunk = value
        if chunk.get("usage") is not None:
            own = chunk["usage"]
        if not chunk.get("choices"):  # a usage chunk: sent at the end, with the billed sums
            continue
        chunk.pop("usage", None)
        _finish_model(record, caller, chunk.get("model"))
        if has_output(chunk):
            record.num_content_chunks += 1
            record.mark_first_token()
        last = chunk
        yield frame(chunk)
    if include_usage:
        yield frame({"id": (last or {}).get("id"), "object": (last or {}).get("object", "chat.completion.chunk"),
                     "created": (last or {}).get("created", int(time.time())), "model": record.model, "choices": [],
                     "usage": answer_usage(own, record)})
