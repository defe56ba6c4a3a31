"""The gateway: one OpenAI-compatible API over local and provider models (`link serve` runs it).

    app = create_app()                                  # Settings from LINK_* variables, config from LINK_CONFIG
    app = create_app(get_settings(database_url=...), load_config(Path("link.yaml")))
    uvicorn.run(app, host="127.0.0.1", port=8000)

The lifespan builds everything (link/state.py): the database engine (migrated to the newest schema),
the request-log writer, the rate limiter, the budget ledger, the local engine pool and one deployment
pool per model name with its health checks; shutdown closes them all and drains the log writer.
Routes: link/routes/ (openai: /v1/*, anthropic: /v1/messages, responses: /v1/responses, policies: /api/policies, route: /api/route, requests: /api/requests,
traffic: /api/traffic, keys: /api/keys, models: /api/models, evals: /api/evals, traces: /api/traces, system:
/health and /metrics); the console under /console, mounted by `web` through the entry point group
`togetherlink.apps` (`link` never imports `web`). Every API error is an OpenAI error object.
Before any route, every request passes the request boundary (protocol/boundary.py, the engine server's
too): a body over `Settings.max_body_bytes` is a 413, one nested deeper than `Settings.max_json_depth` a 400
(on `/v1/chat/completions`, `/v1/completions` and `/v1/messages` answered by the route, to log the request like any other).
The routes' path and query parameters follow the bodies' text rule (protocol/url_params.py): a NUL in one
is a 400 naming it, never a database error. `/docs` and `/redoc` load their scripts from package files, not a CDN
(protocol/docs.py), so they render offline.
"""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager
from importlib.metadata import entry_points

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from link import tracing
from link.config import LinkConfig, load_config
from link.routes import (anthropic, evals, keys, model_cards, models, openai, policies, requests, responses, route,
                         system, traces, traffic)
from link.schemas import OpenAIError, describe_errors, error_body
from link.settings import Settings, get_settings
from link.state import close_gateway, open_gateway
from protocol.boundary import RequestBoundary
from protocol.docs import mount_offline_docs
from protocol.drain import Drain, DrainGuard
from protocol.errors import ValidationProblem
from protocol.url_params import check_url_params


log = logging.getLogger(__name__)
# Packages that add to the gateway app (the console in web/) register `mount(app, settings)` under this group
# (pyproject.toml [project.entry-points."togetherlink.apps"]), so dependencies keep pointing web -> link.
APP_EXTENSIONS = "togetherlink.apps"
# the routes whose every request gets a request-log row, refusals by the request boundary included
LOGGED_PATHS = (*openai.LOGGED_PATHS, *anthropic.LOGGED_PATHS, *responses.LOGGED_PATHS)


def mount_extensions(app: FastAPI, settings: Settings) -> list[str]:
    """Call every `togetherlink.apps` entry point's `mount(app, settings)`, in name order. Returns their names.

    Raises:
        whatever an extension raises while loading or mounting: a broken extension stops the gateway.
    """
    names = []
    for ep in sorted(entry_points(group=APP_EXTENSIONS), key=lambda ep: ep.name):
        ep.load()(app, settings)
        names.append(ep.name)
    if not names:
        log.info("no %s entry points (the console is one): is togetherlink installed (pip install -e .)?",
                 APP_EXTENSIONS)
    return names


def _error_page(request: Request, status_code: int, message: str):
    """The error page an extension registered in `app.state.error_pages` for the request's path, else None (the
    API's OpenAI error object)."""
    for prefix, render in request.app.state.error_pages.items():
        if request.url.path == prefix or request.url.path.startswith(prefix + "/"):
            return render(request, status_code, message)
    return None


def create_app(settings: Settings | None = None, config: LinkConfig | None = None) -> FastAPI:
    """Build the gateway app; nothing starts until the ASGI server runs its lifespan.

    Args:
        settings: process settings (default: `get_settings()`, i.e. the LINK_* environment).
        config: models and policies (default: `load_config(settings.config)`; the embedded default without one).
    Raises:
        pydantic.ValidationError: invalid LINK_* settings. link.config.ConfigError: an invalid config file.
    """
    settings = settings or get_settings()
    config = config or load_config(settings.config)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        is_traced = tracing.configure(settings)  # OpenTelemetry, when LINK_OTEL_* / OTEL_* ask for it (link/tracing.py)
        app.state.gateway = await open_gateway(settings, config)
        try:
            yield
        finally:
            await close_gateway(app.state.gateway)
            if is_traced:
                tracing.shutdown()

    app = FastAPI(title="TogetherLink gateway", lifespan=lifespan, docs_url=None, redoc_url=None)
    mount_offline_docs(app)
    # path prefix -> render(request, status_code, message): an extension's own error pages (the console's HTML)
    app.state.error_pages = {}
    for module in (openai, model_cards, anthropic, responses, policies, route, requests, traffic, keys, models, evals,
                   traces, system):
        app.include_router(module.router, dependencies=[Depends(check_url_params)])
    mount_extensions(app, settings)
    # the OpenAI and Anthropic routes answer a refused body themselves, so that it gets its x-link-* headers and log row
    app.add_middleware(RequestBoundary, limits=settings.body_limits,
                       defer=lambda scope: scope["method"] == "POST" and scope["path"] in LOGGED_PATHS)
    # outermost: on SIGTERM `link serve` drains (protocol/drain.py); /health answers 503, new requests are refused
    app.state.drain = Drain()
    app.add_middleware(DrainGuard, drain=app.state.drain)
    if tracing.is_enabled(settings) or tracing.is_active():  # outermost: a stream's span lasts until its last byte
        app.add_middleware(tracing.RequestSpans)

    @app.exception_handler(OpenAIError)
    async def _openai_error(request: Request, exc: OpenAIError):
        return JSONResponse(exc.body(), status_code=exc.status_code, headers=exc.headers or None)

    @app.exception_handler(ValidationProblem)
    async def _problem(request: Request, exc: ValidationProblem):
        return JSONResponse(error_body(exc.message, exc.type, exc.param, exc.code), status_code=exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        errors = exc.errors()
        skip = 1 if errors and tuple(errors[0].get("loc", ()))[:1] in (("body",), ("query",), ("path",)) else 0
        message, param = describe_errors(errors, skip=skip)
        return _error_page(request, 400, message) or JSONResponse(error_body(message, param=param), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        # As OpenAI: an unknown route is a 404 "Invalid URL (POST /v1/foo)" of type invalid_request_error.
        if exc.status_code == 404:
            message = f"Invalid URL ({request.method} {request.url.path})"
        elif exc.status_code == 405:
            message = f"Method {request.method} is not allowed on {request.url.path}."
        else:
            message = str(exc.detail)
        return (_error_page(request, exc.status_code, message)
                or JSONResponse(error_body(message), status_code=exc.status_code, headers=exc.headers))

    return app
