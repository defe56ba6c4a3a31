"""The OpenAI-compatible server of one engine: `link engine serve --model NAME --port P`.

Routes: POST /v1/chat/completions and /v1/completions (whole or streamed as server-sent events,
`stream_options.include_usage` adding a final usage chunk), GET /v1/models, /v1/models/{id}, /health,
/metrics (Prometheus) and /v1/engine/state (KV block size, prefix-cache and queue state, which a gateway polls
to route by cached prefix: `serving.engine.cache_state`). Every error, unknown routes and wrong methods
included, is an OpenAI error object with a 4xx status; a bad request never disturbs the others. Bodies pass the request boundary
first (`protocol/boundary.py`: 413 over `BodyLimits.max_body_bytes`, 400 nested deeper than `max_json_depth`) and
are read as strict JSON, as the gateway reads them (`protocol/strict_json.py`: no NaN, NUL or lone surrogate, each
refusal naming its field); path and query parameters follow the same text rule (`protocol/url_params.py`). A
client that disconnects, streamed or not, aborts its engine requests, which free their KV blocks before
the next engine step. Several such servers, each with its own engine, are how the platform scales past
one process.

    GET /health   200 {"status": "ok"}
                  503 {"status": "error" | "degraded", "model": name, "detail": ...} once the engine loop
                  failed, or stalled (no step finished for `EngineConfig.stall_timeout_s` while requests
                  wait; `serving.engine.async_engine.AsyncLLMEngine.problem`).
                  503 {"status": "draining", "in_flight": n} after SIGTERM, while the requests in flight finish
                  and new ones are refused with a 503 (`link engine serve`; protocol/drain.py).
    GET /health/live  liveness: 200 {"status": "ok"}, draining included; 503 {"status": "error", ...} once the engine
                  loop died (a stall may pass; a dead loop never serves again, so the process is worth restarting).

A request the engine stops (`SamplingTimeoutError`: a token over `EngineConfig.sample_timeout_s`) is a 400
naming the field behind it, or, once a stream has started, one error event and `data: [DONE]`.

Kernels tune themselves in the engine's idle gaps unless `EngineConfig.auto_tune` is off
(`serving.tuning.auto_kernels`); `/metrics` says what was tuned (`link_kernel_autotune`) and installed
(`link_kernel_winner_speedup`).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from contextlib import asynccontextmanager
from typing import Annotated, AsyncIterator

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from protocol.boundary import BodyLimits, RequestBoundary
from protocol.disconnect import ClientDisconnected, unless_disconnected
from protocol.docs import mount_offline_docs
from protocol.drain import Drain, DrainGuard
from protocol.errors import ValidationProblem, describe_errors, error_body
from protocol.openai import ChatCompletionRequest, CompletionRequest
from protocol.openapi_body import json_body
from protocol.strict_json import parse_json_object
from protocol.url_params import check_url_params
from serving.engine.async_engine import AsyncLLMEngine
from serving.engine.cache_state import engine_state
from serving.engine.llm_engine import EngineConfig, LLMEngine
from serving.errors import ContextLengthError, SamplingTimeoutError, ServingError
from serving.frontend.responses import RequestPlan, plan_chat, plan_completion, stream_events, whole_response
from serving.frontend.state import EngineState
from serving.model_loader import LoadedModel, load_model
from serving.registry import ModelRegistry, default_registry
from serving.tuning.auto_kernels import start_auto_tune


async def _state(request: Request) -> EngineState:
    return request.app.state.engine_state


State = Annotated[EngineState, Depends(_state)]


def _strict_body(schema: type[BaseModel]):
    """A dependency reading the request body as strict JSON (`parse_json_object`) validated against `schema`;
    raises ValidationProblem (400 naming the field)."""

    async def read(request: Request) -> BaseModel:
        body = parse_json_object(await request.body())
        try:
            return schema.model_validate(body)
        except ValidationError as exc:
            message, param = describe_errors(exc.errors())
            raise ValidationProblem(message, param=param) from None

    return read


def _documented(schema: type[BaseModel]) -> dict:
    """The OpenAPI request body of a route that reads its body through `_strict_body` (its `$defs` in place)."""
    return json_body(schema)


ChatBody = Annotated[ChatCompletionRequest, Depends(_strict_body(ChatCompletionRequest))]
CompletionBody = Annotated[CompletionRequest, Depends(_strict_body(CompletionRequest))]


def create_engine_app(model: str, *, dtype: str = "float32", weights: str = "auto", engine_config: EngineConfig = EngineConfig(),
                      registry: ModelRegistry | None = None, loaded: LoadedModel | None = None,
                      body_limits: BodyLimits = BodyLimits(), step_in_thread: bool = False) -> FastAPI:
    """The FastAPI app serving `model`; the model loads in the lifespan (or pass `loaded`).

    Args:
        dtype, weights: how the model loads (`serving.model_loader.load_model`) when `loaded` is not given.
        body_limits: bound every request body (413 larger, 400 deeper).
        step_in_thread: run engine steps in a worker thread (`AsyncLLMEngine`): /health then answers during a
            step that never returns; on the event loop (the default) the inter-token latency is lower on CPU.
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        lm = loaded or load_model((registry or default_registry()).get(model), dtype, weights=weights)
        engine = AsyncLLMEngine(LLMEngine(lm, engine_config), step_in_thread=step_in_thread)
        engine.start()
        app.state.engine_state = state = EngineState(model, lm, engine)
        state.auto_tuner = start_auto_tune(engine)  # None with EngineConfig.auto_tune off (--no-auto-tune)
        yield
        if state.auto_tuner is not None:
            await asyncio.to_thread(state.auto_tuner.stop)
        await engine.shutdown()

    app = FastAPI(title=f"TogetherLink engine: {model}", lifespan=lifespan, dependencies=[Depends(check_url_params)],
                  docs_url=None, redoc_url=None)
    mount_offline_docs(app)  # /docs and /redoc from package files: no CDN
    app.add_middleware(RequestBoundary, limits=body_limits)
    app.state.drain = Drain()  # outermost: SIGTERM drains under `link engine serve` (protocol/drain.py)
    app.add_middleware(DrainGuard, drain=app.state.drain)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        message, param = describe_errors(exc.errors(), skip=1)  # skip FastAPI's "body"
        return JSONResponse(error_body(message, param=param), status_code=400)

    @app.exception_handler(ValidationProblem)
    async def _problem(request: Request, exc: ValidationProblem):
        return JSONResponse(error_body(exc.message, exc.type, exc.param, exc.code), status_code=exc.status_code)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        # FastAPI's own 4xx (unknown route, wrong method, a body it cannot read) as OpenAI error objects;
        # OpenAI answers an unknown route with 404 "Invalid URL (POST /v1/foo)", type invalid_request_error.
        if exc.status_code == 404:
            message = f"Invalid URL ({request.method} {request.url.path})"
        elif exc.status_code == 405:
            message = f"Method {request.method} is not allowed on {request.url.path}."
        elif exc.status_code == 400 and "parsing the body" in str(exc.detail):
            message = "We could not parse the JSON body of your request: it must be a UTF-8 encoded JSON object."
        else:
            message = str(exc.detail)
        return JSONResponse(error_body(message), status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(ServingError)
    async def _serving(request: Request, exc: ServingError):
        return JSONResponse(_serving_error(exc), status_code=400)

    @app.get("/health")
    async def health(state: State):
        problem = state.engine.problem
        if problem is not None:
            status = "error" if state.engine.errored is not None else "degraded"
            return JSONResponse({"status": status, "model": state.name, "detail": problem}, status_code=503)
        return {"status": "ok"}

    @app.get("/health/live")
    async def live(state: State):
        if state.engine.errored is not None:
            return JSONResponse({"status": "error", "model": state.name, "detail": state.engine.problem}, status_code=503)
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models(state: State):
        return {"object": "list", "data": [_model_card(state)]}

    @app.get("/v1/models/{model_id:path}")
    async def retrieve_model(model_id: str, state: State):
        _check_model(model_id, state)
        return _model_card(state)

    @app.get("/metrics")
    async def metrics(state: State):
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        state.metrics.refresh(state.engine)
        return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/engine/state")
    async def routing_state(state: State):
        return engine_state(state.engine).to_dict()

    @app.post("/v1/chat/completions", openapi_extra=_documented(ChatCompletionRequest))
    async def chat_completions(body: ChatBody, state: State, request: Request):
        _check_model(body.model, state)
        return await _serve(plan_chat(body, state.loaded, state.engine.engine.max_model_len), state, request)

    @app.post("/v1/completions", openapi_extra=_documented(CompletionRequest))
    async def completions(body: CompletionBody, state: State, request: Request):
        _check_model(body.model, state)
        return await _serve(plan_completion(body, state.loaded, state.engine.engine.max_model_len), state, request)

    return app


def _model_card(state: EngineState) -> dict:
    return {"id": state.name, "object": "model", "created": state.created, "owned_by": "togetherlink",
            "max_model_len": state.engine.engine.max_model_len, "resident_bytes": state.loaded.resident_bytes}


def _check_model(name: str, state: EngineState) -> None:
    if name != state.name:
        raise ValidationProblem(f"The model `{name}` does not exist; this server serves `{state.name}`.",
                                param="model", status_code=404, code="model_not_found")


async def _serve(plan: RequestPlan, state: EngineState, request: Request):
    engine = state.engine
    vocab = state.loaded.config.vocab_size
    out_of_vocab = [tid for tid, _ in plan.params.logit_bias if tid >= vocab]
    if out_of_vocab:
        raise ValidationProblem(f"logit_bias token ids must be in [0, {vocab}); got {out_of_vocab[:5]}", param="logit_bias")
    for prompt_ids in plan.prompts:
        engine.engine.check_request(prompt_ids, plan.params)  # 400 before anything streams
    base_id = uuid.uuid4().hex
    streams = [engine.generate(f"{base_id}-{i}", ids, plan.params, priority=0) for i, ids in enumerate(plan.prompts)]
    if plan.stream:  # Starlette stops iterating when the client leaves, which aborts the requests
        return StreamingResponse(_sse(stream_events(plan, streams, state)), media_type="text/event-stream")
    try:  # cancelling the work closes each stream, and `AsyncLLMEngine.generate` aborts its request
        return JSONResponse(await unless_disconnected(request, whole_response(plan, streams, state)))
    except ClientDisconnected:
        return Response(status_code=499)  # nginx's "client closed request"; nobody reads it


def _serving_error(exc: ServingError) -> dict:
    """The OpenAI error object of a request the engine refuses or stops."""
    code = ("context_length_exceeded" if isinstance(exc, ContextLengthError) else
            "sampling_timeout" if isinstance(exc, SamplingTimeoutError) else None)
    return error_body(str(exc), param=getattr(exc, "param", None), code=code)


async def _sse(events: AsyncIterator[dict]) -> AsyncIterator[str]:
    try:
        async for event in events:
            yield f"data: {json.dumps(event)}\n\n"
    except ServingError as exc:  # the engine stopped the request after the first chunk: one error event
        yield f"data: {json.dumps(_serving_error(exc))}\n\n"
    yield "data: [DONE]\n\n"
