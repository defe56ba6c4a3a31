"""OpenTelemetry traces of the gateway: one SERVER span per request, one CLIENT span per backend call.

    tracing.configure(settings)            # in the lifespan: an SDK provider exporting OTLP over HTTP, when enabled
    app.add_middleware(tracing.RequestSpans)                                  # link/app.py: the request's span
    with tracing.model_call("chat", body, deployment) as span: ...            # link/proxy.py, each backend attempt
    chunks = tracing.traced_stream(chunks, "chat", body, deployment)          # link/proxy.py, a streamed attempt
    tracing.shutdown()                     # flushes the batch processor

Off by default. Tracing is on when `LINK_OTEL_ENABLED=true` or an OTLP endpoint is set (`LINK_OTEL_ENDPOINT`, or the
standard `OTEL_EXPORTER_OTLP_ENDPOINT`); the service is named by `LINK_OTEL_SERVICE_NAME` / `OTEL_SERVICE_NAME`.
When off, `_tracer` stays None: the middleware is not added, every hook checks `_tracer` once and returns None or a
shared `nullcontext`, and no `opentelemetry` module is imported (the API is imported only once a tracer is set), so a
request pays nothing.

The spans (attribute names from OpenTelemetry's GenAI semantic conventions, https://opentelemetry.io/docs/specs/semconv/gen-ai/):
- `link.request` (kind SERVER), from the request's arrival until its answer is sent (a stream's: until its last
  byte or the client leaving): `http.request.method`, `http.route`, `http.response.status_code`, `link.request_id`,
  `link.policy`, `link.model`, `link.status`, `link.cache` (the response cache's outcome, when the policy caches),
  `link.cost_usd`, `gen_ai.usage.input_tokens` / `gen_ai.usage.output_tokens` (the request's billed totals);
  status ERROR when the answer is not a success.
- `{gen_ai.operation.name} {gen_ai.request.model}` (kind CLIENT), a child of the request's span, for every attempt
  on a backend (a retry on the next replica or model is a new span; each MoA proposer, the aggregator, each cascade
  step and a cascade's judge are calls of their own): `gen_ai.operation.name` ("chat" | "text_completion"),
  `gen_ai.provider.name` and the older `gen_ai.system` (the deployment's kind: "openai", "litellm" or "local"),
  `gen_ai.request.model` (the provider's model id), `gen_ai.request.max_tokens`, `gen_ai.request.temperature`,
  `gen_ai.response.model`, `gen_ai.response.id`, `gen_ai.usage.input_tokens`, `gen_ai.usage.output_tokens`,
  `link.model` (the public name), `link.deployment`, `link.cost_usd` (at the deployment's prices); a failure sets
  status ERROR, `error.type` and an exception event. A stream's span ends with the stream.

Why spans are parented through OpenTelemetry's context (a context variable) rather than passed around: the calls
happen deep in link/proxy.py and in the MoA's and cascade's tasks, which copy the context of the request that made
them. Why a middleware holds the request's span rather than `handle`: a streamed answer's body is sent after `handle`
returns, and the middleware's call lasts until its last byte, with the span current throughout; `handle` only leaves
its record in the ASGI scope (one assignment, whether tracing is on or not).
"""

from __future__ import annotations

import logging
from contextlib import contextmanager, nullcontext
from typing import Any, AsyncIterator, Iterator

logger = logging.getLogger(__name__)

# The tracer of the configured provider; None while tracing is off (the one check each hook makes).
_tracer: Any = None
_provider: Any = None  # the provider `configure` built (and `shutdown` flushes); None when set by `use` or off
_OFF = nullcontext()
SCOPE = "togetherlink.gateway"
OPERATIONS = {"chat": "chat", "completion": "text_completion"}
PACKAGES = "opentelemetry-sdk opentelemetry-exporter-otlp-proto-http"


class TracingUnavailable(RuntimeError):
    """Tracing is enabled but the OpenTelemetry SDK or its OTLP exporter is not installed."""


def is_enabled(settings) -> bool:
    """True when the settings ask for traces: `otel_enabled`, or an OTLP endpoint set."""
    return bool(settings.otel_enabled or settings.otel_endpoint)


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL of a collector's base URL, as OTEL_EXPORTER_OTLP_ENDPOINT is read by the OTLP
    exporter spec: "/v1/traces" appended (kept as it is when the URL already ends with it)."""
    endpoint = endpoint.rstrip("/")
    return endpoint if endpoint.endswith("/v1/traces") else endpoint + "/v1/traces"


def configure(settings) -> bool:
    """Install an SDK TracerProvider (resource `service.name` = `settings.otel_service_name`) exporting its spans in
    batches over OTLP/HTTP (protobuf), when `is_enabled(settings)`; else change nothing. Returns whether it did.

    The endpoint is `settings.otel_endpoint` (a collector's base URL, `traces_url`); without one the exporter reads
    the standard OTEL_EXPORTER_OTLP_* variables itself (default http://localhost:4318/v1/traces).

    Raises:
        TracingUnavailable: enabled, but opentelemetry-sdk or opentelemetry-exporter-otlp-proto-http is missing.
    """
    global _provider
    if not is_enabled(settings):
        return False
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise TracingUnavailable(f"tracing is enabled (LINK_OTEL_ENABLED / OTEL_EXPORTER_OTLP_ENDPOINT) but {exc.name} "
                                 f"is missing: pip install {PACKAGES} (the `otel` extra)") from exc
    provider = TracerProvider(resource=Resource.create({"service.name": settings.otel_service_name}))
    exporter = OTLPSpanExporter(endpoint=traces_url(settings.otel_endpoint)) if settings.otel_endpoint else OTLPSpanExporter()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    use(provider)
    _provider = provider
    return True


def use(provider) -> None:
    """Trace with `provider` (an OpenTelemetry TracerProvider, e.g. a test's with an in-memory exporter); None turns
    tracing off."""
    global _tracer, _provider
    _tracer = None if provider is None else provider.get_tracer(SCOPE)
    _provider = None


def shutdown() -> None:
    """Flush and stop the provider `configure` installed, and turn tracing off; nothing when none was."""
    global _tracer, _provider
    if _provider is not None:
        _provider.shutdown()
        _tracer = _provider = None


# --- the request's span (an ASGI middleware, added by link/app.py when tracing is on) ---

# The scope key under which `link.routes.openai.handle` leaves the request's `RequestRecord`.
RECORD = "link.record"


class RequestSpans:
    """ASGI middleware: a SERVER span `link.request` around every `POST /v1/...` (chat, completions, Anthropic's
    messages, responses), current while the app runs (so the backend calls' spans are its children, streamed bodies
    included) and ended once the answer is sent: for a stream, after its last byte. Its attributes come from the
    request's `RequestRecord` (`scope[RECORD]`, settled by then) and the response's status. A pass-through while
    `_tracer` is None; `link/app.py` adds it only when tracing is configured, so a gateway without tracing has no
    such layer at all.
    """

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if _tracer is None or scope["type"] != "http" or scope["method"] != "POST" or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        from opentelemetry import context, trace

        span = _tracer.start_span("link.request", kind=trace.SpanKind.SERVER,
                                  attributes={"http.request.method": "POST", "http.route": scope["path"]})
        token = context.attach(trace.set_span_in_context(span))
        status = [0]

        async def sending(message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except BaseException as exc:
            fail(span, exc)
            raise
        finally:
            try:
                end_request(span, scope.get(RECORD), status[0])
            finally:
                context.detach(token)


def is_active() -> bool:
    """True while a tracer is installed (`configure` or `use`)."""
    return _tracer is not None


def end_request(span, record, status_code: int) -> None:
    """End the request's span with what its `RequestRecord` says (policy, model, status, usage, cost, cache outcome;
    None: a request `handle` never saw) and the HTTP status sent (0: none was)."""
    from opentelemetry.trace import Status, StatusCode

    if record is None:
        span.set_attribute("http.response.status_code", status_code)
        if status_code >= 500 or not status_code:
            span.set_status(Status(StatusCode.ERROR))
        span.end()
        return
    http_status = int(record.http_status or status_code)
    attributes = {"link.request_id": record.request_id, "link.status": record.status or "",
                  "http.response.status_code": http_status,
                  "gen_ai.usage.input_tokens": int(record.prompt_tokens or 0),
                  "gen_ai.usage.output_tokens": int(record.completion_tokens or 0),
                  "link.cost_usd": float(record.cost_usd or 0.0)}
    if record.policy:
        attributes["link.policy"] = record.policy
    if record.model:
        attributes["link.model"] = record.model
    cache = record.decision.get("cache")
    if isinstance(cache, dict):
        attributes["link.cache"] = cache.get("outcome", "bypass")
    span.set_attributes(attributes)
    if record.status != "ok":
        span.set_status(Status(StatusCode.ERROR, record.error or record.status or None))
        span.set_attribute("error.type", record.status or str(http_status))
    span.end()


# --- a backend call's span (link/proxy.py) ---

def _call_attributes(endpoint: str, body: dict[str, Any], deployment) -> dict[str, Any]:
    operation = OPERATIONS.get(endpoint, endpoint)
    attributes = {"gen_ai.operation.name": operation, "gen_ai.provider.name": deployment.kind,
                  "gen_ai.system": deployment.kind, "gen_ai.request.model": deployment.provider_model,
                  "link.model": deployment.name, "link.deployment": deployment.deployment_id}
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if isinstance(max_tokens, int) and not isinstance(max_tokens, bool):
        attributes["gen_ai.request.max_tokens"] = max_tokens
    temperature = body.get("temperature")
    if isinstance(temperature, (int, float)) and not isinstance(temperature, bool):
        attributes["gen_ai.request.temperature"] = float(temperature)
    return attributes


def _start_call(endpoint: str, body: dict[str, Any], deployment):
    from opentelemetry.trace import SpanKind

    attributes = _call_attributes(endpoint, body, deployment)
    return _tracer.start_span(f"{attributes['gen_ai.operation.name']} {deployment.provider_model}", kind=SpanKind.CLIENT,
                              attributes=attributes)


def model_call(endpoint: str, body: dict[str, Any], deployment):
    """A context manager around one whole backend call: its CLIENT span (yielded; None when off), current inside
    and ended at exit, with an exception recorded as the call's error (`fail`)."""
    if _tracer is None:
        return _OFF
    return _call_span(endpoint, body, deployment)


@contextmanager
def _call_span(endpoint: str, body: dict[str, Any], deployment) -> Iterator[Any]:
    from opentelemetry.trace import use_span

    span = _start_call(endpoint, body, deployment)
    with use_span(span, end_on_exit=True, record_exception=False, set_status_on_exception=False):
        try:
            yield span
        except BaseException as exc:
            fail(span, exc)
            raise


def fail(span, exc: BaseException) -> None:
    """Record `exc` on `span`: status ERROR, `error.type` (a BackendError's code, else the exception's class) and an
    exception event."""
    from opentelemetry.trace import Status, StatusCode

    span.set_attribute("error.type", getattr(exc, "code", None) or type(exc).__name__)
    span.record_exception(exc)
    span.set_status(Status(StatusCode.ERROR, str(exc) or type(exc).__name__))


def record_answer(span, answer: dict[str, Any], deployment) -> None:
    """Set a call's response attributes from its whole answer (or a stream's last usage and model)."""
    if span is None:
        return
    attributes = {}
    if isinstance(answer.get("model"), str):
        attributes["gen_ai.response.model"] = answer["model"]
    if isinstance(answer.get("id"), str):
        attributes["gen_ai.response.id"] = answer["id"]
    usage = answer.get("usage")
    if isinstance(usage, dict):
        prompt_tokens, completion_tokens = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
        attributes.update({"gen_ai.usage.input_tokens": prompt_tokens, "gen_ai.usage.output_tokens": completion_tokens,
                           "link.cost_usd": float(deployment.cost_usd(prompt_tokens, completion_tokens))})
    span.set_attributes(attributes)


def traced_stream(chunks: AsyncIterator[dict], endpoint: str, body: dict[str, Any], deployment) -> AsyncIterator[dict]:
    """`chunks` (a backend stream's chunks) inside a CLIENT span that starts with the first read and ends with the
    stream (its last chunk, a failure, or its close); `chunks` itself when tracing is off."""
    if _tracer is None:
        return chunks
    return _traced(chunks, endpoint, body, deployment)


async def _traced(chunks: AsyncIterator[dict], endpoint: str, body: dict[str, Any], deployment) -> AsyncIterator[dict]:
    span = _start_call(endpoint, body, deployment)
    seen: dict[str, Any] = {}
    try:
        async for chunk in chunks:
            for key in ("id", "model", "usage"):
                if chunk.get(key):
                    seen[key] = chunk[key]
            yield chunk
    except GeneratorExit:  # closed before its end: the client left, or a plan stopped reading
        span.set_attribute("link.closed_early", True)
        raise
    except BaseException as exc:
        fail(span, exc)
        raise
    finally:
        record_answer(span, seen, deployment)
        span.end()
        await chunks.aclose()
