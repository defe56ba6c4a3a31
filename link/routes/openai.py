"""OpenAI-compatible routes: POST /v1/chat/completions, POST /v1/completions, GET /v1/models[/{id}].

A request's life (`handle`):
    1. authenticate the bearer key (401)                       link/auth.py
    2. rate limit the key, requests per minute (429 + Retry-After)   link/limits.py
    3. validate the body against OpenAI's schema (400 naming the field)   link/schemas.py
    4. resolve the model name or policy (404) and plan the candidates      link/policies/
    5. reserve the request's maximum cost in the key's budget (429 insufficient_quota)  link/accounting.py
    6. call the backends: fallback across replicas and models before the first byte   link/proxy.py
    7. settle the real cost, count tokens, write the request-log row, observe metrics (always, in `finally`)
Every answer carries `x-link-request-id`, `x-link-policy` and `x-link-model`.
"""

from __future__ import annotations

import asyncio
import logging
import math

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from link.accounting import Accounting, RequestRecord, max_request_cost
from link.backends import BackendError
from link.deps import StateDep
from link.policies import PolicyRequest
from link.proxy import LiveStream, complete, open_stream, sse_frames
from link.schemas import OpenAIError, model_card, model_not_found, parse_request
from link.state import GatewayState
from serving.api.disconnect import ClientDisconnected, unless_disconnected

logger = logging.getLogger(__name__)
router = APIRouter()


class GatewayStream(StreamingResponse):
    """A streamed answer that finishes its accounting however the stream ends (also when never started)."""

    def __init__(self, live: LiveStream, record: RequestRecord, accounting: Accounting, include_usage: bool):
        super().__init__(sse_frames(live, record, include_usage), media_type="text/event-stream", headers=_headers(record))
        self.live, self.record, self.accounting = live, record, accounting

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
                await self.accounting.finish(self.record)


def _headers(record: RequestRecord) -> dict[str, str]:
    return {"x-link-request-id": record.request_id, "x-link-policy": record.policy or "", "x-link-model": record.model or ""}


async def _rate_limit(state: GatewayState, record: RequestRecord) -> None:
    identity = record.identity
    if identity.key_id is None or (identity.rpm_limit is None and identity.tpm_limit is None):
        return
    retry_after = await asyncio.to_thread(state.limiter.check, identity)
    if retry_after is not None:
        raise OpenAIError(429, f"Rate limit reached for API key {identity.name!r} (requests or tokens per minute); "
                          f"retry after {retry_after:.1f} s.", type_="requests", code="rate_limit_exceeded",
                          headers={"Retry-After": str(max(1, math.ceil(retry_after)))}, log_status="rate_limited")


async def handle(request: Request, state: GatewayState, endpoint: str) -> Response:
    """One OpenAI request, steps 1-7 of the module docstring; never raises."""
    record = RequestRecord(endpoint=endpoint)
    is_streaming = False
    try:
        raw = await request.body()
        record.identity = await state.auth.identify(request.headers.get("authorization"))
        await _rate_limit(state, record)
        body, parsed = parse_request(raw, endpoint)
        record.body, record.stream, record.policy = body, parsed.stream, parsed.model
        policy = await state.policies.resolve(parsed.model)
        if policy is None:
            raise model_not_found(parsed.model, [*state.model_names, *state.policies.configured,
                                                 *(p.name for p in state.policies.stored_policies())])
        plan = await policy.plan(PolicyRequest(endpoint, body, state.model_names))
        record.policy, record.decision = plan.policy, {**plan.decision, "candidates": list(plan.models)}
        deployments = [d for m in plan.models for d in state.config.deployments(m)]
        await state.accounting.reserve(record, max_request_cost(endpoint, body, deployments))
        if parsed.stream:
            live = await open_stream(state.pools, plan, record, endpoint, body)
            include_usage = bool(parsed.stream_options and parsed.stream_options.include_usage)
            is_streaming = True
            return GatewayStream(live, record, state.accounting, include_usage)
        response = await unless_disconnected(request, complete(state.pools, plan, record, endpoint, body))
        record.status, record.http_status = "ok", 200
        return JSONResponse(response, headers=_headers(record))
    except OpenAIError as exc:
        record.fail(exc)
        return JSONResponse(exc.body(), status_code=exc.status_code, headers={**_headers(record), **exc.headers})
    except BackendError as exc:
        record.fail(exc)
        return JSONResponse(exc.to_openai(), status_code=exc.status_code, headers=_headers(record))
    except (ClientDisconnected, asyncio.CancelledError) as exc:
        record.status, record.http_status, record.error = "client_disconnected", 499, "the client disconnected"
        if isinstance(exc, asyncio.CancelledError):
            raise
        return Response(status_code=499)  # nginx's "client closed request"; nobody reads it
    except Exception as exc:
        logger.exception("request %s failed", record.request_id)
        record.fail(exc)
        return JSONResponse({"error": {"message": f"internal error ({type(exc).__name__}); request id {record.request_id}",
                                       "type": "server_error", "param": None, "code": None}},
                            status_code=500, headers=_headers(record))
    finally:
        if not is_streaming:
            await state.accounting.finish(record)


@router.post("/v1/chat/completions")
async def chat_completions(request: Request, state: StateDep) -> Response:
    """OpenAI Chat Completions (whole or streamed)."""
    return await handle(request, state, "chat")


@router.post("/v1/completions")
async def completions(request: Request, state: StateDep) -> Response:
    """OpenAI (legacy) Completions, for base models (whole or streamed)."""
    return await handle(request, state, "completion")


def _cards(state: GatewayState) -> list[dict]:
    cards = [model_card(name, state.created, owned_by="togetherlink",
                        link={"type": "model", "kind": state.config.deployments(name)[0].kind,
                              "replicas": len(state.config.deployments(name))})
             for name in state.model_names]
    policies = [*state.policies.configured.values(), *state.policies.stored_policies()]
    cards += [model_card(p.name, state.created, owned_by="togetherlink-policy", link={"type": "policy", **p.describe()})
              for p in policies]
    return cards


@router.get("/v1/models")
async def list_models(request: Request, state: StateDep) -> JSONResponse:
    """The models and the policies (any of which can be sent as `model`)."""
    await state.auth.identify(request.headers.get("authorization"))
    await state.policies.resolve("")  # refreshes the database policies when stale
    return JSONResponse({"object": "list", "data": _cards(state)})


@router.get("/v1/models/{model_id:path}")
async def retrieve_model(model_id: str, request: Request, state: StateDep) -> JSONResponse:
    """One model or policy; 404 with an OpenAI error object when unknown."""
    await state.auth.identify(request.headers.get("authorization"))
    if await state.policies.resolve(model_id) is None:
        raise model_not_found(model_id, list(state.model_names))
    return JSONResponse(next(c for c in _cards(state) if c["id"] == model_id))
