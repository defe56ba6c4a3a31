"""Running a plan against the backends: candidates in order, replicas within each, until one answers.

    response = await complete(pools, plan, record, "chat", body)          # a whole answer
    live = await open_stream(pools, plan, record, "chat", body)           # the first chunk is in hand
    async for frame in sse_frames(live, record, include_usage=False): ...  # SSE bytes, `data: [DONE]` last

Retries happen only before the first byte reaches the client: a retryable failure (connection refused,
timeout, 5xx, a dropped connection) moves on to the model's next replica, then to the plan's next
model; a provider's 4xx goes straight back to the client. A stream is opened by waiting for its first
chunk, so the client's 200 and headers go out only once a backend is actually answering. A stream that
fails after that ends with one OpenAI error event `data: {"error": {...}}` and `data: [DONE]`, unless the
policy sets `continue_on_failure` (`open_stream(..., continue_on_failure=True)`): then the next candidate (the
model's next replica, then the plan's next model) continues the same answer from what was already streamed
(link/stream_resume.py), the client sees one stream, and every call is charged (`RequestRecord.add_call`).

The backend is always asked for stream usage (`stream_options.include_usage`) so every stream is
accounted; the usage chunk is passed on only when the client asked for it. Every backend answer's `usage` is
checked as it is read (link/backends/usage.py): a count that cannot be one is replaced by the gateway's estimate. `model` in every answer is
the public name of the model that served it. Plans of several calls (`Plan.executor`: cascade, MoA) are
run by link/executor.py, whose model caller makes each call through `complete` / `open_stream` here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable

import anyio

from link import tracing
from link.accounting import RequestRecord, estimate_completion_tokens, estimate_prompt_tokens
from link.backends import Backend, BackendError, BackendUnavailable
from link.backends.usage import Estimate, checked_response, checked_stream
from link.config import ModelDeployment
from link.deployments import DeploymentPool
from link.policies import Plan
from link.stream_resume import Transcript, continuation_body, length_end, resumed_usage
from protocol.sse import DONE, frame

_NOT_SENT = ("stream", "stream_options")


def usage_estimate(endpoint: str, body: dict[str, Any]) -> Estimate:
    """The gateway's estimate of one call's usage, for counts a provider got wrong (link/backends/usage.py): the
    prompt estimated from `body`, the completion from the answer's characters."""
    return lambda num_chars: (estimate_prompt_tokens(endpoint, body), estimate_completion_tokens(num_chars))


async def _first_answer(pools: dict[str, DeploymentPool], plan: Plan, record: RequestRecord,
                        call: Callable[[Backend, ModelDeployment], Awaitable[Any]], *,
                        num_tried_first: int = 0, routing_body: dict | None = None) -> tuple[Any, Any]:
    """Try `call` on the plan's models (each model's replicas first) until one succeeds; the first model gets
    `num_tried_first` fewer tries (replicas already tried). `routing_body` (the request) lets a cache-aware pool
    pick the replica holding its prompt's prefix (link/replica_routing.py).

    Returns (call's result, the open `acquire()` lease, which the caller must exit). Sets record.model
    and record.deployment, and appends each failed attempt to record.decision["attempts"].
    Raises:
        BackendError: a non-retryable failure (a provider 4xx), or the last failure when all failed.
    """
    attempts = record.decision.setdefault("attempts", [])
    last: BackendError | None = None
    for i, model in enumerate(plan.models):
        pool = pools[model]
        for _ in range(len(pool.replicas) - (num_tried_first if i == 0 else 0)):
            lease = pool.acquire(routing_body)
            try:
                replica = await lease.__aenter__()
            except BackendError as exc:  # every replica of this model is ejected: next model
                attempts.append({"model": model, "deployment": None, "error": exc.message, "code": exc.code})
                last = exc
                break
            deployment = replica.backend.deployment
            try:
                result = await call(replica.backend, deployment)
            except BaseException as exc:
                await lease.__aexit__(type(exc), exc, exc.__traceback__)  # reports a replica failure
                if not isinstance(exc, BackendError):
                    raise
                attempts.append({"model": model, "deployment": deployment.deployment_id, "error": exc.message, "code": exc.code})
                if not exc.retryable:
                    raise
                last = exc
                continue
            record.model, record.deployment = model, deployment
            if not attempts:
                record.decision.pop("attempts")
            return result, lease
    raise last or BackendUnavailable(f"policy {plan.policy!r}: no deployment to try")


async def complete(pools: dict[str, DeploymentPool], plan: Plan, record: RequestRecord, endpoint: str,
                   body: dict[str, Any]) -> dict:
    """The whole answer of the first candidate that gives one (see `_first_answer`). Raises BackendError."""
    sent = {k: v for k, v in body.items() if k not in _NOT_SENT}

    async def call(backend: Backend, deployment: ModelDeployment) -> dict:
        with tracing.model_call(endpoint, sent, deployment) as span:  # one span per attempt (link/tracing.py)
            response = await backend.complete(endpoint, {**sent, "model": deployment.provider_model})
            response = checked_response(response, deployment, usage_estimate(endpoint, sent))
            tracing.record_answer(span, response, deployment)
            return response

    response, lease = await _first_answer(pools, plan, record, call, routing_body=sent)
    await lease.__aexit__(None, None, None)
    record.add_usage(response.get("usage"))
    response["model"] = record.model
    return response


@dataclass(frozen=True)
class Resumable:
    """What a stream under `continue_on_failure` needs to ask the next candidate to continue it."""

    pools: dict[str, DeploymentPool]
    plan: Plan
    endpoint: str
    body: dict[str, Any]


@dataclass
class LiveStream:
    """A backend stream whose first chunk has arrived; `lease` holds its replica until the stream ends."""

    chunks: AsyncIterator[dict]
    first: dict
    lease: Any
    is_closed: bool = False
    resume: Resumable | None = None  # continue_on_failure: how to ask the next candidate

    async def swap(self, failure: BaseException, chunks: AsyncIterator[dict], first: dict, lease: Any) -> None:
        """Replace a stream that failed (closed, its replica's failure reported) with a continuing one."""
        await self.close(failure)
        self.chunks, self.first, self.lease, self.is_closed = chunks, first, lease, False

    async def close(self, failure: BaseException | None = None) -> None:
        """Close the backend stream (aborting it if unfinished) and release the replica; idempotent.
        A replica failure in `failure` is reported to its pool."""
        if self.is_closed:
            return
        self.is_closed = True
        with anyio.CancelScope(shield=True):
            await self.chunks.aclose()
            if failure is None:
                await self.lease.__aexit__(None, None, None)
            else:
                await self.lease.__aexit__(type(failure), failure, failure.__traceback__)


async def open_stream(pools: dict[str, DeploymentPool], plan: Plan, record: RequestRecord, endpoint: str,
                      body: dict[str, Any], *, continue_on_failure: bool = False) -> LiveStream:
    """Start streaming from the first candidate that yields a first chunk. Raises BackendError.
    `continue_on_failure`: a failure after the first chunk is continued by the next candidate (`sse_frames`)."""
    (chunks, first), lease = await _first_answer(pools, plan, record, _stream_call(endpoint, body), routing_body=body)
    return LiveStream(chunks, first, lease, resume=Resumable(pools, plan, endpoint, body) if continue_on_failure else None)


def _stream_call(endpoint: str, body: dict[str, Any] | Callable[[ModelDeployment], dict[str, Any]]
                 ) -> Callable[[Backend, ModelDeployment], Awaitable[tuple]]:
    """A `_first_answer` call that opens `body` (or the body `body(deployment)` for the replica tried) as a stream
    (usage always asked) and waits for its first chunk."""

    async def call(backend: Backend, deployment: ModelDeployment):
        request = body(deployment) if callable(body) else body
        sent = {**request, "stream": True, "stream_options": {**(request.get("stream_options") or {}), "include_usage": True}}
        chunks = tracing.traced_stream(checked_stream(backend.stream(endpoint, {**sent, "model": deployment.provider_model}),
                                                      deployment, usage_estimate(endpoint, sent)), endpoint, sent, deployment)
        try:
            first = await anext(chunks)
        except StopAsyncIteration:
            raise BackendUnavailable(f"{deployment.name}: the stream ended before its first chunk") from None
        except BaseException:
            await chunks.aclose()
            raise
        return chunks, first

    return call


def has_output(chunk: dict) -> bool:
    """True when a chunk carries answer content (text, a content delta, tool calls or a refusal)."""
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta") or {}
        if choice.get("text") or delta.get("content") or delta.get("tool_calls") or delta.get("refusal"):
            return True
    return False


async def ended_stream(frames: AsyncIterator[bytes], record: RequestRecord, close: Callable[[BaseException | None], Awaitable[None]],
                       where: str) -> AsyncIterator[bytes]:
    """`frames` then `data: [DONE]`, with the stream's ending recorded: the one place that decides how an SSE
    answer ends, for single-model streams (`sse_frames`) and multi-call plans (`executor.executed_frames`).

    Sets record.status: "ok" when `frames` ran out; "error"/"timeout" when it raised a BackendError (the
    client gets one OpenAI error event, then `[DONE]`; record.error says "`where`: ..."); "client_disconnected"
    when the client left (cancelled or closed). `close(failure)` runs last in every case (None after success).
    """
    failure: BaseException | None = None
    try:
        async for data in frames:
            yield data
        record.status, record.http_status = "ok", 200
        yield DONE
    except BackendError as exc:
        failure = exc
        record.fail(exc)
        record.error = f"{where}: {exc.message}"
        yield frame(exc.to_openai())
        yield DONE
    except BaseException as exc:  # cancelled or closed: the client went away
        failure = exc
        if record.status != "ok":
            record.status, record.http_status, record.error = "client_disconnected", 499, "the client disconnected mid-stream"
        raise
    finally:
        await frames.aclose()
        await close(failure)


def sse_frames(live: LiveStream, record: RequestRecord, include_usage: bool) -> AsyncIterator[bytes]:
    """The client's SSE bytes: the backend's chunks (model renamed, usage per the client's wish), then `[DONE]`.

    Sets record.status: "ok", "error"/"timeout" (the backend failed midway: one error event is sent)
    or "client_disconnected" (the client left: the backend stream is closed, which aborts it); see `ended_stream`.
    A stream opened with `continue_on_failure` is continued by the next candidate instead (`_resumed_frames`).
    """
    frames = _chunk_frames(live, record, include_usage) if live.resume is None else _resumed_frames(live, record, include_usage)
    return ended_stream(frames, record, live.close, "after the first byte")


async def _chunk_frames(live: LiveStream, record: RequestRecord, include_usage: bool) -> AsyncIterator[bytes]:
    pending_usage: dict | None = None  # usage that came on a chunk with choices, re-sent as its own chunk
    chunk: dict | None = live.first
    while chunk is not None:
        usage = chunk.get("usage")
        record.add_usage(usage)
        chunk["model"] = record.model
        if chunk.get("choices"):
            if has_output(chunk):
                record.num_content_chunks += 1
                record.mark_first_token()
            if usage is not None:
                chunk["usage"] = None
                pending_usage = usage
            if not include_usage:
                chunk.pop("usage", None)
            yield frame(chunk)
        elif usage is not None and include_usage:  # the usage chunk: empty choices
            pending_usage = None
            yield frame(chunk)
        try:
            chunk = await anext(live.chunks)
        except StopAsyncIteration:
            chunk = None
    if include_usage and pending_usage is not None:
        yield frame({"id": live.first.get("id"), "object": live.first.get("object"), "created": live.first.get("created"),
                     "model": record.model, "choices": [], "usage": pending_usage})


async def _tapped(chunks: AsyncIterator[dict], transcript: Transcript) -> AsyncIterator[dict]:
    try:
        async for chunk in chunks:
            transcript.take(chunk)
            yield chunk
    finally:
        await chunks.aclose()


def _charge(record: RequestRecord, sent: dict[str, Any], usage: dict | None, num_chunks: int) -> None:
    """Account one call of a continued answer at the prices of the deployment that served it (`record.deployment`):
    its usage, else the prompt estimated and a token per content chunk."""
    if usage:
        record.add_call(record.model, record.deployment, int(usage.get("prompt_tokens") or 0),
                        int(usage.get("completion_tokens") or 0))
    else:
        record.add_call(record.model, record.deployment, estimate_prompt_tokens(record.endpoint, sent), num_chunks,
                        estimated=True)


async def _resumed_frames(live: LiveStream, record: RequestRecord, include_usage: bool) -> AsyncIterator[bytes]:
    """`_chunk_frames` while the first call lasts; after a failure, the next candidates' continuations (each call
    accounted with `_charge`), then the usage of every call when asked (`resumed_usage`). Raises the failure that
    could not be continued (a BackendError)."""
    resume = live.resume
    transcript = Transcript(resume.endpoint, resume.body)
    live.first["model"] = record.model  # the public name, as `_chunk_frames` sends it
    transcript.take(live.first)
    live.chunks = _tapped(live.chunks, transcript)
    first_call = _chunk_frames(live, record, include_usage)
    try:
        async for data in first_call:
            yield data
        return
    except BackendError as exc:
        failure = exc
    finally:
        await first_call.aclose()
    if not transcript.is_resumable:
        raise failure
    record.prompt_tokens = record.completion_tokens = 0  # from here on the sums of `add_call`
    record.has_usage = False
    _charge(record, resume.body, None, transcript.num_tokens)
    while True:  # `failure` ended the last call; continue on the next candidate
        record.decision.setdefault("attempts", []).append(
            {"model": record.model, "deployment": record.deployment.deployment_id, "error": failure.message,
             "code": failure.code, "after_first_byte": True})
        left = transcript.tokens_left()
        if left is not None and left < 1:  # the dead calls wrote all the answer may hold
            await live.close(failure)
            yield frame(length_end(transcript))
            break
        models = resume.plan.models[resume.plan.models.index(record.model):]
        await live.close(failure)  # the dead replica's failure is reported (and ejects it) before the next pick

        def continuing(deployment: ModelDeployment) -> dict[str, Any]:
            return continuation_body(resume.endpoint, resume.body, transcript, deployment.kind)

        try:
            (chunks, first), lease = await _first_answer(resume.pools, Plan(resume.plan.policy, models), record,
                                                         _stream_call(resume.endpoint, continuing), num_tried_first=1)
        except BackendError:
            raise failure from None
        await live.swap(failure, chunks, first, lease)
        sent = continuing(record.deployment)
        record.decision.setdefault("continued", []).append({"model": record.model, "after_chars": len(transcript.text)})
        usage, num_chunks, chunk = None, 0, first
        try:
            while chunk is not None:
                usage = chunk.get("usage") or usage
                if chunk.get("choices") and (out := transcript.continued(chunk)) is not None:
                    if include_usage:
                        out["usage"] = None
                    else:
                        out.pop("usage", None)
                    if has_output(out):
                        num_chunks += 1
                        record.num_content_chunks += 1
                    yield frame(out)
                chunk = await anext(live.chunks, None)
        except BackendError as exc:
            _charge(record, sent, usage, num_chunks)
            if not transcript.is_resumable:
                raise
            failure = exc
            continue
        except BaseException:
            _charge(record, sent, usage, num_chunks)
            raise
        _charge(record, sent, usage, num_chunks)
        break
    if include_usage:
        yield frame({**transcript.identity, "object": live.first.get("object"), "choices": [], "usage": resumed_usage(record)})
