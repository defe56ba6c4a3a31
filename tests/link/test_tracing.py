"""OpenTelemetry traces of a real gateway on loopback (link/tracing.py), read from the SDK's in-memory exporter.

A fixed model's request is one SERVER span with one CLIENT child per backend call, its GenAI attributes holding the
mock's exact token counts (the mock counts one token per whitespace-separated word and answers "You said: " + the
last message); a retry on the next candidate is a new child, in error; a stream's span ends with the stream; a
cascade has one child per step (and its judge's verdict), a Mixture-of-Agents one per proposer and the aggregator.
With tracing off a request imports no `opentelemetry` module (checked in a fresh interpreter).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("opentelemetry.sdk", reason="the `otel` extra (opentelemetry-sdk) is not installed")
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from link import tracing
from routers.moa import SYNTHESIS_PROMPT
from tests.link.gateway_launch import MASTER_KEY, gateway_settings, mock_deployment, start_gateway_thread
from tests.link.mock_launch import start_mock_thread

AUTH = {"Authorization": f"Bearer {MASTER_KEY}"}
QUESTION = "what is two plus three"
MESSAGES = [{"role": "user", "content": QUESTION}]
PRICE_IN, PRICE_OUT = 1000.0, 2000.0  # mock_deployment's USD per million tokens
ROOT = Path(__file__).resolve().parents[2]


def words(text: str) -> int:
    return len(text.split())


REPLY = f"You said: {QUESTION}"
PROMPT_TOKENS, COMPLETION_TOKENS = words(QUESTION), words(REPLY)  # 5 and 7


def cost(prompt_tokens: int, completion_tokens: int) -> float:
    return (prompt_tokens * PRICE_IN + completion_tokens * PRICE_OUT) / 1e6


@pytest.fixture(scope="module")
def exporter():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use(provider)
    yield exporter
    tracing.use(None)
    provider.shutdown()


@pytest.fixture(scope="module")
def gateway(exporter, new_database_url, tmp_path_factory):
    from link.config import parse_config

    with start_mock_thread() as fast, start_mock_thread() as other, start_mock_thread(reply="no") as no, \
            start_mock_thread(chunk_delay_s=0.05) as slow, start_mock_thread(mode="die") as dying:
        models = [mock_deployment("fast", fast.api_base), mock_deployment("other", other.api_base),
                  mock_deployment("no-judge", no.api_base), mock_deployment("slow", slow.api_base),
                  mock_deployment("dying", dying.api_base)]
        policies = [
            {"name": "dying-then-fast", "type": "fallback", "models": ["dying", "fast"]},
            {"name": "escalating", "type": "cascade", "models": ["fast", "other"],
             "options": {"judge": "no-judge", "judge_logprobs": False}},
            {"name": "mixture", "type": "moa", "models": ["fast", "other"], "options": {"aggregator": "slow"}},
            {"name": "cached", "type": "fixed", "models": ["fast"], "options": {"cache": {"mode": "exact"}}},
        ]
        config = parse_config({"models": models, "policies": policies})
        settings = gateway_settings(new_database_url("sqlite"), tmp_path_factory.mktemp("home"))
        with start_gateway_thread(settings, config) as server:
            yield server


def post(gateway, **body) -> httpx.Response:
    response = httpx.post(f"{gateway.base_url}/chat/completions", json={"messages": MESSAGES, **body}, headers=AUTH,
                          timeout=30)
    assert response.status_code == 200, response.text
    return response


def trace_of(exporter, request_id: str, timeout_s: float = 5.0):
    """(the request's SERVER span, its children in start order), once the request's span has ended."""
    deadline = time.monotonic() + timeout_s
    while True:
        spans = exporter.get_finished_spans()
        roots = [s for s in spans if s.name == "link.request" and s.attributes.get("link.request_id") == request_id]
        if roots or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert len(roots) == 1, [s.name for s in spans]
    root = roots[0]
    children = sorted((s for s in spans if s.parent is not None and s.parent.span_id == root.context.span_id),
                      key=lambda s: s.start_time)
    assert all(s.context.trace_id == root.context.trace_id for s in children)
    return root, children


def check_call(span, model: str, prompt_tokens: int, completion_tokens: int, **request) -> None:
    """A successful chat call's CLIENT span on the mock deployment `model`."""
    assert span.kind == SpanKind.CLIENT and span.name == "chat mock-model"
    assert span.status.status_code == StatusCode.UNSET
    expected = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "gen_ai.system": "openai",
                "gen_ai.request.model": "mock-model", "gen_ai.response.model": "mock-model", "link.model": model,
                "link.deployment": f"{model}#0", "gen_ai.usage.input_tokens": prompt_tokens,
                "gen_ai.usage.output_tokens": completion_tokens, **request}
    assert {k: span.attributes.get(k) for k in expected} == expected
    assert span.attributes["link.cost_usd"] == pytest.approx(cost(prompt_tokens, completion_tokens), rel=1e-9)
    assert span.attributes["gen_ai.response.id"].startswith("mock-")


def test_a_fixed_model_request_is_one_server_span_with_one_client_child(gateway, exporter):
    response = post(gateway, model="fast", max_tokens=50, temperature=0.25)
    root, children = trace_of(exporter, response.headers["x-link-request-id"])
    assert root.kind == SpanKind.SERVER and root.parent is None and root.status.status_code == StatusCode.UNSET
    assert dict(root.attributes) == {
        "http.request.method": "POST", "http.route": "/v1/chat/completions", "http.response.status_code": 200,
        "link.request_id": response.headers["x-link-request-id"], "link.policy": "fast", "link.model": "fast",
        "link.status": "ok", "gen_ai.usage.input_tokens": PROMPT_TOKENS, "gen_ai.usage.output_tokens": COMPLETION_TOKENS,
        "link.cost_usd": pytest.approx(cost(PROMPT_TOKENS, COMPLETION_TOKENS), rel=1e-9)}
    assert len(children) == 1
    check_call(children[0], "fast", PROMPT_TOKENS, COMPLETION_TOKENS,
               **{"gen_ai.request.max_tokens": 50, "gen_ai.request.temperature": 0.25})
    assert root.start_time <= children[0].start_time and children[0].end_time <= root.end_time


def test_a_retry_on_the_next_candidate_is_a_new_child_span_in_error(gateway, exporter):
    response = post(gateway, model="dying-then-fast")  # "dying" drops the connection midway through its answer
    root, children = trace_of(exporter, response.headers["x-link-request-id"])
    assert root.attributes["link.policy"] == "dying-then-fast" and root.attributes["link.model"] == "fast"
    assert [c.attributes["link.model"] for c in children] == ["dying", "fast"]
    failed = children[0]
    assert failed.status.status_code == StatusCode.ERROR and failed.attributes["error.type"]
    assert [e.name for e in failed.events] == ["exception"]
    check_call(children[1], "fast", PROMPT_TOKENS, COMPLETION_TOKENS)


def test_a_cache_hit_is_a_request_span_with_its_outcome_and_no_call(gateway, exporter):
    first = post(gateway, model="cached", temperature=0, max_tokens=20)
    hit = post(gateway, model="cached", temperature=0, max_tokens=20)
    assert (first.headers["x-link-cache"], hit.headers["x-link-cache"]) == ("miss", "hit")
    root, children = trace_of(exporter, first.headers["x-link-request-id"])
    assert root.attributes["link.cache"] == "miss" and len(children) == 1
    root, children = trace_of(exporter, hit.headers["x-link-request-id"])
    assert root.attributes["link.cache"] == "hit" and root.attributes["link.cost_usd"] == 0.0 and children == []


def test_a_refused_request_is_a_span_in_error(gateway, exporter):
    response = httpx.post(f"{gateway.base_url}/chat/completions", json={"model": "no-such-model", "messages": MESSAGES},
                          headers=AUTH, timeout=30)
    assert response.status_code == 404
    root, children = trace_of(exporter, response.headers["x-link-request-id"])
    assert root.status.status_code == StatusCode.ERROR and children == []
    assert root.attributes["http.response.status_code"] == 404 and root.attributes["link.status"] == "invalid_request"


def test_a_streamed_requests_span_ends_with_the_stream(gateway, exporter):
    body = {"model": "slow", "messages": MESSAGES, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{gateway.base_url}/chat/completions", json=body, headers=AUTH, timeout=30) as response:
        assert response.status_code == 200
        headers_at = time.time_ns()
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    root, children = trace_of(exporter, response.headers["x-link-request-id"])
    # the mock sends 10 events 0.05 s apart (role, 7 words, finish, usage): the span outlives the headers by ~0.4 s
    assert root.end_time - headers_at > 0.3e9
    assert len(children) == 1 and children[0].end_time <= root.end_time
    check_call(children[0], "slow", PROMPT_TOKENS, COMPLETION_TOKENS)
    assert root.attributes["link.status"] == "ok" and root.attributes["gen_ai.usage.output_tokens"] == COMPLETION_TOKENS


def test_a_cascade_has_one_child_per_step_and_the_judges_verdict(gateway, exporter):
    response = post(gateway, model="escalating", max_tokens=50)
    root, children = trace_of(exporter, response.headers["x-link-request-id"])
    assert root.attributes["link.policy"] == "escalating" and root.attributes["link.model"] == "other"
    # the cheap step, the judge's "no", then the last step (which is never judged)
    assert [c.attributes["link.model"] for c in children] == ["fast", "no-judge", "other"]
    check_call(children[0], "fast", PROMPT_TOKENS, COMPLETION_TOKENS, **{"gen_ai.request.max_tokens": 50})
    assert children[1].attributes["gen_ai.usage.output_tokens"] == 1  # "no"
    check_call(children[2], "other", PROMPT_TOKENS, COMPLETION_TOKENS, **{"gen_ai.request.max_tokens": 50})
    billed = response.json()["usage"]["link_billed"]
    assert sum(c.attributes["gen_ai.usage.input_tokens"] for c in children) == billed["prompt_tokens"]
    assert root.attributes["gen_ai.usage.input_tokens"] == billed["prompt_tokens"]
    assert root.attributes["link.cost_usd"] == pytest.approx(sum(c.attributes["link.cost_usd"] for c in children), rel=1e-9)


def test_a_mixture_of_agents_has_one_child_per_proposer_and_the_aggregator(gateway, exporter):
    response = post(gateway, model="mixture", max_tokens=50)
    root, children = trace_of(exporter, response.headers["x-link-request-id"])
    assert root.attributes["link.policy"] == "mixture" and root.attributes["link.model"] == "slow"
    assert sorted(c.attributes["link.model"] for c in children[:2]) == ["fast", "other"]
    for proposer in children[:2]:
        check_call(proposer, proposer.attributes["link.model"], PROMPT_TOKENS, COMPLETION_TOKENS)
    aggregator = children[2]
    assert len(children) == 3 and aggregator.start_time >= max(p.end_time for p in children[:2])
    system = SYNTHESIS_PROMPT + "".join(f"\n\nAnswer {i}:\n{REPLY}" for i in (1, 2))
    check_call(aggregator, "slow", words(system) + words(QUESTION), COMPLETION_TOKENS)
    assert root.attributes["gen_ai.usage.output_tokens"] == 3 * COMPLETION_TOKENS


def test_tracing_settings_build_an_otlp_exporter_and_refuse_nothing_when_off(monkeypatch):
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    from link.settings import get_settings

    assert tracing.traces_url("http://collector:4318/") == "http://collector:4318/v1/traces"
    assert tracing.traces_url("http://c:4318/v1/traces") == "http://c:4318/v1/traces"
    off = get_settings(otel_enabled=False, otel_endpoint=None)
    assert not tracing.is_enabled(off) and tracing.configure(off) is False
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9/")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "gateway-under-test")
    settings = get_settings()
    assert settings.otel_endpoint == "http://127.0.0.1:9/" and tracing.is_enabled(settings)
    saved = tracing._tracer
    try:
        assert tracing.configure(settings) is True
        provider = tracing._provider
        assert provider.resource.attributes["service.name"] == "gateway-under-test"
        (processor,) = provider._active_span_processor._span_processors
        assert type(processor).__name__ == "BatchSpanProcessor"
        exporter = processor._batch_processor._exporter
        assert isinstance(exporter, OTLPSpanExporter) and exporter._endpoint == "http://127.0.0.1:9/v1/traces"
    finally:
        tracing.shutdown()
        tracing._tracer = saved
    assert tracing._provider is None


def test_enabled_without_the_sdk_names_the_packages(monkeypatch):
    from link.settings import get_settings

    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)  # as if not installed
    with pytest.raises(tracing.TracingUnavailable, match="pip install opentelemetry-sdk"):
        tracing.configure(get_settings(otel_enabled=True))


def test_with_tracing_off_a_request_imports_no_opentelemetry_module(tmp_path):
    script = textwrap.dedent(f"""
        import sys, httpx
        from link.config import parse_config
        from tests.link.gateway_launch import MASTER_KEY, gateway_settings, mock_deployment, start_gateway_thread
        from tests.link.mock_launch import start_mock_thread

        with start_mock_thread() as mock:
            config = parse_config({{"models": [mock_deployment("fast", mock.api_base)]}})
            settings = gateway_settings("sqlite:///{tmp_path / 'link.db'}", {str(tmp_path)!r})
            with start_gateway_thread(settings, config) as server:
                body = {{"model": "fast", "messages": [{{"role": "user", "content": "hi"}}]}}
                auth = {{"Authorization": "Bearer " + MASTER_KEY}}
                post = lambda **extra: httpx.post(server.base_url + "/chat/completions", json={{**body, **extra}},
                                                  headers=auth, timeout=30)
                assert post().status_code == 200  # warm: the first request's own imports are not tracing's
                before = {{m for m in sys.modules if m.startswith("opentelemetry")}}
                assert post().status_code == 200 and post(stream=True).status_code == 200
                after = {{m for m in sys.modules if m.startswith("opentelemetry")}}
        from link import tracing
        assert tracing._tracer is None
        print("NEW", sorted(after - before))
        print("SDK", sorted(m for m in after if m.startswith(("opentelemetry.sdk", "opentelemetry.exporter"))))
    """)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LINK_HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "NEW []" in done.stdout and "SDK []" in done.stdout, done.stdout
