"""OpenAI-compatible routes: POST /v1/chat/completions and POST /v1/completions (`GET /v1/models`: model_cards.py).

A request's life (`handle`):
    1. authenticate the bearer key (401)                       link/auth.py
    2. rate limit the key, requests per minute (429 + Retry-After)   link/limits.py
    3. validate the body against OpenAI's schema (400 naming the field)   link/schemas.py
    4. resolve the model name or policy (404) and plan the candidates      link/policies/
       (a max_tokens / max_completion_tokens beyond every candidate's context length: 400 naming the field)
    5. reserve the request's maximum cost in the key's budget (429 insufficient_quota)  link/accounting.py
       (a policy with the `cache` option: a cached answer serves the request here, at cost 0: link/response_cache.py)
    6. call the backends: fallback across replicas and models before the first byte   link/proxy.py
       (a plan with an executor, cascade or MoA, makes several calls: link/executor.py)
    7. settle the real cost, count tokens, write the request-log row, observe metrics (always, in `finally`)
       (a chat request with `tools` of an opted-in key or policy is also recorded as a tool-call trace: link/traces.py)
A body over the size or depth limit is not read here: the request boundary (protocol/boundary.py) hands its
refusal (413, or 400 `json_too_deep`) to `handle`, which answers it after step 2 like any invalid body, with
its x-link-* headers and its request-log row (nothing was served or billed).
Another wire format runs the same steps through a `Dialect` that translates its request into an OpenAI chat
request and the answer, stream and errors back (Anthropic's Messages API: link/routes/anthropic.py).
Every answer, errors included, carries `x-link-request-id`, `x-link-policy` (the policy that planned it,
else the requested name) and `x-link-model` (the model that answered, else the last one tried, else the
requested name). Their values are UTF-8 percent-encoded outside printable ASCII, and "%" itself, so
`urllib.parse.unquote` reads them back. Also:
- a whole (non-streamed) answer carries `x-link-cost-usd`, its cost in USD (a cascade's or MoA's: the total over
  every call, as its `usage.link_billed`, link/executor.py);
- an answer a router or hybrid policy planned carries `x-link-chosen`, its choice (a model, or "moa" for the
  Mixture-of-Agents plan, whose aggregator is then the `x-link-model`);
- an answer routed under a cost ceiling (`metadata.link_max_cost_usd`) that every candidate was expected to
  exceed carries `x-link-over-max-cost: true` (the cheapest candidate answered).
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import AsyncIterator
from urllib.parse import quote

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from link.accounting import Accounting, RequestRecord, max_request_cost
from link.backends import BackendError
from link.config import ModelDeployment
from link.db.engine import is_unreachable, unreachable_cause
from link.db.models import MAX_INT32
from link.deps import StateDep
from link.executor import ExecutedStream, GatewayCaller, execute_whole, executed_frames, start_executed_stream
from link.policies import PolicyRequest
from link.proxy import LiveStream, complete, open_stream, sse_frames
from link.cache_replay import Hit
from link.response_cache import NO_CACHE, NoCache, Ticket
from protocol.openapi_body import json_body
from link.routes.model_cards import context_length
from link.schemas import (ChatCompletionRequest, CompletionRequest, OpenAIError, model_not_found,
                          parse_json_object, validate_request)
from link.state import GatewayState
from link.traces import finish_whole, watch
from protocol.fast_json import JSONBytesResponse
from protocol.sse import DONE, READY_AHEAD
from protocol.boundary import REFUSAL
from protocol.disconnect import ClientDisconnected, unless_disconnected

logger = logging.getLogger(__name__)
router = APIRouter()
# the routes whose every request gets a request-log row, refusals by the request boundary included
LOGGED_PATHS = ("/v1/chat/completions", "/v1/completions")
# The most completion tokens a request may ask for when a candidate's context length is unknown: PostgreSQL's
# INTEGER, the range of every token count the gateway stores; a larger count only inflates the reserved cost.
MAX_COMPLETION_TOKENS = MAX_INT32
MAX_HELD_FRAMES = 64  # a stream's frames written in one send at most


class GatewayStream(StreamingResponse):
    """A streamed answer that finishes its accounting however the stream ends (also when never started).
    `live` is a proxy.LiveStream or an executor.ExecutedStream; `frames` its SSE bytes."""

    def __init__(self, live: LiveStream | ExecutedStream | Hit, record: RequestRecord, accounting: Accounting,
                 frames: AsyncIterator[bytes], ticket: Ticket | NoCache = NO_CACHE):
        super().__init__(frames, media_type="text/event-stream", headers=_headers(record, record.model or ""))
        self.live, self.record, self.accounting, self.ticket = live, record, accounting, ticket

    async def stream_response(self, send) -> None:
        """Starlette's relay loop, except that frames whose successors are already in memory (`READY_AHEAD`) and
        the final `[DONE]` are held and go out with the next frames in one send: the same bytes in fewer writes."""
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        held: list[bytes] = []
        async for data in self.body_iterator:
            held.append(data)
            if (READY_AHEAD.get() or data == DONE) and len(held) < MAX_HELD_FRAMES:
                continue
            await send({"type": "http.response.body", "body": b"".join(held), "more_body": True})
            held = []
        await send({"type": "http.response.body", "body": b"".join(held), "more_body": False})

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()  # runs the generator's cleanup if it was started
                if not self.live.is_closed:  # never started: the client left before the first byte
                    await self.live.close(asyncio.CancelledError())
                    self.record.status, self.record.http_status = "client_disconnected", 499
                    self.record.error = "the client disconnected before the stream started"
                self.ticket.release()
                await self.accounting.finish(self.record)


# printable ASCII but "%": what a header value keeps as it is (HTTP allows no line breaks, and Latin-1 at most)
_HEADER_SAFE = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "%")


def header_value(text: str) -> str:
    """`text` as an HTTP header value: UTF-8 percent-encoded outside printable ASCII and "%" itself (as RFC 3986
    encodes a URL; `urllib.parse.unquote` reverses it), so that a model or policy name such as "路由" or one
    holding a line break cannot break the answer. Spaces at either end are encoded too ("%20"): a field value has
    no leading or trailing whitespace (RFC 9110, section 5.5), and the server drops the connection on one."""
    value = quote(text, safe=_HEADER_SAFE)
    inner = value.strip(" ")
    if inner == value:
        return value
    start = value.index(inner) if inner else len(value)
    return "%20" * start + inner + "%20" * (len(value) - start - len(inner))


def _headers(record: RequestRecord, requested: str) -> dict[str, str]:
    """The x-link-* headers; `requested` is the `model` the client sent ("" when unreadable). Names are
    percent-encoded outside printable ASCII and "%" (`header_value`)."""
    attempts = record.decision.get("attempts") or [{}]
    model = record.model or attempts[-1].get("model") or requested
    headers = {"x-link-request-id": header_value(record.request_id),
               "x-link-policy": header_value(record.policy or requested), "x-link-model": header_value(model)}
    if isinstance(record.decision.get("chosen"), str):       # a router's or hybrid's choice ("moa": the MoA plan)
        headers["x-link-chosen"] = header_value(record.decision["chosen"])
    if record.decision.get("over_max_cost"):
        headers["x-link-over-max-cost"] = "true"
    if "cache" in record.decision:
        headers["x-link-cache"] = record.decision["cache"].get("outcome", "bypass")
    return headers


async def _rate_limit(state: GatewayState, record: RequestRecord) -> None:
    """Raises OpenAIError 429 (type "requests" or "tokens", code rate_limit_exceeded, Retry-After) over a limit; 503
    (code database_unavailable) when the counters cannot be read."""
    identity = record.identity
    if identity.key_id is None or (identity.rpm_limit is None and identity.tpm_limit is None):
        return
    try:
        refusal = await asyncio.to_thread(state.limiter.admit, identity)
    except Exception as exc:  # the counters' database (Redis's fallback) unreachable: fail closed
        if not is_unreachable(exc):
            raise
        raise OpenAIError(503, f"The rate limits of API key {identity.name!r} cannot be checked: the gateway's database "
                          f"is unreachable ({unreachable_cause(exc)}); retry shortly.", type_="server_error",
                          code="database_unavailable", headers={"Retry-After": "1"}) from None
    if refusal is not None:
        limit = identity.rpm_limit if refusal.limit == "requests" else identity.tpm_limit
        raise OpenAIError(429, f"Rate limit reached for API key {identity.name!r} on {refusal.limit} per minute: "
                          f"limit {limit}; retry after {refusal.retry_after_s:.1f} s.", type_=refusal.limit,
                          code="rate_limit_exceeded", headers={"Retry-After": str(max(1, math.ceil(refusal.retry_after_s)))},
                          log_status="rate_limited")


def _check_completion_tokens(state: GatewayState, body: dict, models: list[str]) -> None:
    """Refuse a `max_completion_tokens` / `max_tokens` (validated already: an integer >= 1) that no candidate can
    produce, before any money is held for it.

    The bound is the largest context length among the candidate `models` (an answer never outgrows its model's
    context), or MAX_COMPLETION_TOKENS when a candidate's context length is unknown.

    Raises:
        OpenAIError: 400 `invalid_value` naming the field, in OpenAI's words ("max_tokens is too large: N. This
            model supports at most M completion tokens, whereas you provided N.").
    """
    for field in ("max_completion_tokens", "max_tokens"):
        requested = body.get(field)
        if not isinstance(requested, int):
            continue
        contexts = [context_length(state, m) for m in models]
        bound = MAX_COMPLETION_TOKENS if None in contexts else min(max(contexts), MAX_COMPLETION_TOKENS)
        if requested > bound:
            raise OpenAIError(400, f"{field} is too large: {requested}. This model supports at most {bound} completion "
                              f"tokens, whereas you provided {requested}.", param=field, code="invalid_value",
                              log_status="invalid_request")


class Dialect:
    """The wire format a client speaks over `handle`'s OpenAI pipeline; this base is OpenAI's own (every method
    passes its input through). Another API (Anthropic's Messages, link/routes/anthropic.py) subclasses it to
    translate its request into an OpenAI one and the answer, stream and errors back.

    Attributes:
        path: the route, recorded as `decision["endpoint"]` in the request-log row (None: not recorded).
    """

    path: str | None = None

    def authorization(self, request: Request) -> str | None:
        """The `Authorization` header value that `Authenticator.identify` reads."""
        return request.headers.get("authorization")

    async def load(self, body: dict, record: RequestRecord) -> None:
        """Read what `to_openai` needs from storage, once the key is known (`record.identity`): the Responses API's
        earlier turns (`previous_response_id`, link/routes/responses.py). Raises OpenAIError (a 4xx)."""

    def to_openai(self, request: Request, body: dict) -> dict:
        """The OpenAI request body of the client's `body` (a JSON object). Raises OpenAIError (a 4xx)."""
        return body

    def for_candidates(self, body: dict, deployments: list[ModelDeployment]) -> dict:
        """The body fitted to the deployments that may answer it. Raises OpenAIError (a 4xx)."""
        return body

    def answer(self, response: dict, record: RequestRecord) -> dict:
        """The whole answer as the client reads it. Raises BackendError when it cannot be written."""
        return response

    def frames(self, frames: AsyncIterator[bytes], record: RequestRecord) -> AsyncIterator[bytes]:
        """The stream's OpenAI SSE bytes as the client reads them."""
        return frames

    def error(self, status_code: int, body: dict) -> dict:
        """An OpenAI error object (`{"error": {...}}`) as the client reads it."""
        return body


OPENAI = Dialect()


def _requested_model(raw: bytes) -> tuple[dict | None, OpenAIError | None, str]:
    """(the body, or None and the error that refuses it, the `model` it names or "") — read before the key is
    checked only so that every answer can name the requested model; errors are raised in their turn."""
    try:
        body = parse_json_object(raw)
    except OpenAIError as exc:
        return None, exc, ""
    model = body.get("model")
    return body, None, model if isinstance(model, str) else ""


async def handle(request: Request, state: GatewayState, endpoint: str, dialect: Dialect = OPENAI) -> Response:
    """One OpenAI request, steps 1-7 of the module docstring, in the wire format of `dialect`; never raises."""
    request.scope["link.record"] = record = RequestRecord(endpoint=endpoint, decision={"endpoint": dialect.path} if dialect.path else {})
    is_streaming = False
    requested = ""
    ticket = NO_CACHE  # the request's passage through its policy's response cache (link/response_cache.py)
    try:
        refused = getattr(request.state, REFUSAL, None)  # a body over the size or depth limits (RequestBoundary)
        if refused is not None:
            body, bad_json = None, OpenAIError(refused.status_code, refused.message, param=refused.param,
                                               code=refused.code, log_status="invalid_request")
        else:
            body, bad_json, requested = _requested_model(await request.body())
        record.identity = await state.auth.identify(dialect.authorization(request))
        await _rate_limit(state, record)
        if bad_json is not None:
            raise bad_json
        await dialect.load(body, record)
        body = dialect.to_openai(request, body)
        parsed = validate_request(body, endpoint)
        record.body, record.stream, record.policy = body, parsed.stream, parsed.model
        policy = await state.policies.resolve(parsed.model)
        if policy is None:
            raise model_not_found(parsed.model, [*state.model_names, *state.policies.configured,
                                                 *(p.name for p in state.policies.stored_policies())])
        plan = await policy.plan(PolicyRequest(endpoint, body, state.model_names))
        record.policy, record.decision = plan.policy, {**record.decision, **plan.decision, "candidates": list(plan.models)}
        body = record.body = dialect.for_candidates(body, [d for m in plan.models for d in state.config.deployments(m)])
        _check_completion_tokens(state, body, plan.models)
        executor = plan.executor
        if executor is None:
            deployments = [d for m in plan.models for d in state.config.deployments(m)]
            max_cost = max_request_cost(endpoint, body, deployments)
        else:
            max_cost = executor.max_cost_usd(endpoint, body, state.config.deployments)
        await state.accounting.reserve(record, max_cost)
        include_usage = bool(parsed.stream and parsed.stream_options and parsed.stream_options.include_usage)
        ticket = state.response_cache.ticket(policy.cache, plan.policy, endpoint, body, record)
        if (hit := await ticket.lookup()) is not None:  # at cost 0, whole or replayed (which finishes its accounting)
            hit.charge(record)
            if is_streaming := bool(parsed.stream):
                return GatewayStream(hit, record, state.accounting, dialect.frames(hit.stream(record, include_usage), record))
            return JSONBytesResponse(dialect.answer(hit.whole(record.request_id), record), headers={**_headers(record, requested), "x-link-cost-usd": "0.000000000"})
        capture = state.traces.start(record, policy, body) if state.traces is not None else None
        if parsed.stream and executor is None:
            live = await open_stream(state.pools, plan, record, endpoint, body, continue_on_failure=policy.continue_on_failure)
            is_streaming = True
            frames = dialect.frames(watch(capture, ticket.tap(sse_frames(live, record, include_usage), record)), record)
            return GatewayStream(live, record, state.accounting, frames, ticket)
        if parsed.stream:
            caller = GatewayCaller(state.pools, record, plan.policy)
            executed = await start_executed_stream(executor, caller, record, body)
            is_streaming = True
            frames = dialect.frames(watch(capture, ticket.tap(executed_frames(executed, record, caller, include_usage), record)), record)
            return GatewayStream(executed, record, state.accounting, frames, ticket)
        if executor is None:
            response = await unless_disconnected(request, complete(state.pools, plan, record, endpoint, body))
        else:
            caller = GatewayCaller(state.pools, record, plan.policy)
            response = await unless_disconnected(request, execute_whole(executor, caller, record, body))
        record.status, record.http_status = "ok", 200
        record.estimate_missing_usage()
        finish_whole(capture, response)
        await ticket.keep_whole(response, record)
        # The cost of a whole answer is known now (a stream's only after its last chunk): clients such as
        # `link eval` read it without a request-log lookup.
        return JSONBytesResponse(dialect.answer(response, record), headers={**_headers(record, requested), "x-link-cost-usd": f"{record.cost_usd:.9f}"})
    except OpenAIError as exc:
        record.fail(exc)
        return JSONBytesResponse(dialect.error(exc.status_code, exc.body()), status_code=exc.status_code,
                            headers={**_headers(record, requested), **exc.headers})
    except BackendError as exc:
        record.fail(exc)
        return JSONBytesResponse(dialect.error(exc.status_code, exc.to_openai()), status_code=exc.status_code,
                            headers=_headers(record, requested))
    except (ClientDisconnected, asyncio.CancelledError) as exc:
        record.status, record.http_status, record.error = "client_disconnected", 499, "the client disconnected"
        if isinstance(exc, asyncio.CancelledError):
            raise
        return Response(status_code=499)  # nginx's "client closed request"; nobody reads it
    except Exception as exc:
        logger.exception("request %s failed", record.request_id)
        record.fail(exc)
        return JSONBytesResponse(dialect.error(500, {"error": {"message": f"internal error ({type(exc).__name__}); request id "
                                                                    f"{record.request_id}", "type": "server_error",
                                                         "param": None, "code": None}}),
                            status_code=500, headers=_headers(record, requested))
    finally:
        if not is_streaming:
            ticket.release()
            await state.accounting.finish(record)



# The chat messages as OpenAI documents them (the request model types them loosely: link/schemas.py checks
# each message's fields by hand, to name the client's field path in an error).
_TEXT = {"type": "string"}
_MESSAGES = {"type": "array", "minItems": 1, "items": {"oneOf": [
    {"type": "object", "required": ["role", "content"], "additionalProperties": False,
     "properties": {"role": {"enum": ["system", "developer", "user"]}, "content": _TEXT, "name": _TEXT}},
    {"type": "object", "required": ["role", "content"], "additionalProperties": False,
     "properties": {"role": {"const": "assistant"}, "content": {"type": ["string", "null"]}, "name": _TEXT}},
    {"type": "object", "required": ["role", "content", "tool_call_id"], "additionalProperties": False,
     "properties": {"role": {"const": "tool"}, "content": _TEXT, "tool_call_id": _TEXT}}]}}


@router.post("/v1/chat/completions",
             openapi_extra=json_body(ChatCompletionRequest, properties={"messages": _MESSAGES}))
async def chat_completions(request: Request, state: StateDep) -> Response:
    """OpenAI Chat Completions (whole or streamed)."""
    return await handle(request, state, "chat")


@router.post("/v1/completions", openapi_extra=json_body(CompletionRequest))
async def completions(request: Request, state: StateDep) -> Response:
    """OpenAI (legacy) Completions, for base models (whole or streamed)."""
    return await handle(request, state, "completion")
