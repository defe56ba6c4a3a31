"""The gateway's OpenAI contract over real HTTP on loopback, against the mock backend (fast).

SSE framing and `data: [DONE]`; finish_reason null until the final chunk; the usage chunk only when
asked; 404 for an unknown model and 400 naming the field of an invalid body (OpenAI error objects);
n=2 in both modes; the x-link-* headers; pass-through of tools/tool_choice/response_format/...; the
official `openai` client and LiteLLM as clients; streamed and whole answers account identically; /health
200 with every model in rotation and /metrics behind the master key. (More error cases: test_gateway_errors.py.)
"""

from __future__ import annotations

import json
import os
import time

import httpx
import openai
import pytest
import yaml

from tests.link.gateway_launch import MASTER_KEY, gateway_settings, mock_deployment, start_gateway_thread
from tests.link.sse import sse_events

AUTH = {"Authorization": f"Bearer {MASTER_KEY}"}
HEADERS = ("x-link-request-id", "x-link-policy", "x-link-model")
CHAT = {"model": "mock-a", "messages": [{"role": "user", "content": "hello there world"}]}


@pytest.fixture(scope="module")
def gateway(mock, new_database_url, tmp_path_factory):
    from link.config import parse_config

    config = parse_config({"models": [mock_deployment("mock-a", mock.api_base),
                                      mock_deployment("mock-lite", mock.api_base, kind="litellm")],
                           "policies": [{"name": "team/fixed", "type": "fixed", "models": ["mock-lite"]}]})
    settings = gateway_settings(new_database_url("sqlite"), tmp_path_factory.mktemp("home"))
    with start_gateway_thread(settings, config) as server:
        yield server


@pytest.fixture(scope="module")
def client(gateway):
    return openai.OpenAI(base_url=gateway.base_url, api_key=MASTER_KEY, max_retries=0)


def log_row(gateway, request_id: str) -> dict:
    """A request's log row; it is written just after the response ends, so poll briefly."""
    deadline = time.monotonic() + 10
    while True:
        gateway.flush_log()
        row = httpx.get(f"{gateway.url}/api/requests/{request_id}", headers=AUTH)
        if row.status_code == 200 or time.monotonic() > deadline:
            return row.json()
        time.sleep(0.05)


def sse(gateway, body: dict, path: str = "/chat/completions") -> tuple[httpx.Response, str]:
    with httpx.stream("POST", gateway.base_url + path, json={**body, "stream": True}, headers=AUTH, timeout=30) as r:
        return r, r.read().decode()


def test_whole_chat_names_the_serving_model_and_carries_headers(client):
    raw = client.chat.completions.with_raw_response.create(**CHAT)
    answer = raw.parse()
    assert answer.choices[0].message.content == "You said: hello there world"
    assert answer.model == "mock-a" and answer.usage.completion_tokens == 5
    assert raw.headers["x-link-model"] == "mock-a" and raw.headers["x-link-policy"] == "mock-a"
    assert len(raw.headers["x-link-request-id"]) == 32
    # gateway_launch prices: 1000 USD / 1e6 prompt tokens, 2000 USD / 1e6 completion tokens
    usage = answer.usage
    expected = (usage.prompt_tokens * 1000.0 + usage.completion_tokens * 2000.0) / 1e6
    assert float(raw.headers["x-link-cost-usd"]) == pytest.approx(expected, abs=1e-9)


def test_stream_framing_finish_reason_and_no_usage_unless_asked(gateway):
    response, text = sse(gateway, CHAT)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    assert all(response.headers[h] for h in HEADERS)
    chunks = sse_events(text)
    assert all("usage" not in c for c in chunks)
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == "You said: hello there world"
    assert {c["model"] for c in chunks} == {"mock-a"}


def test_usage_chunk_when_asked(gateway, client):
    _, text = sse(gateway, {**CHAT, "stream_options": {"include_usage": True}})
    chunks = sse_events(text)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5
    assert all(c["usage"] is None for c in chunks[:-1])
    streamed = list(client.chat.completions.create(**CHAT, stream=True, stream_options={"include_usage": True}))
    assert streamed[-1].usage.total_tokens == 8 and streamed[-1].choices == []


@pytest.mark.parametrize("stream", [False, True])
def test_n_2_gives_indexes_0_and_1(client, stream):
    if not stream:
        answer = client.chat.completions.create(**CHAT, n=2)
        assert [c.index for c in answer.choices] == [0, 1]
        return
    chunks = list(client.chat.completions.create(**CHAT, n=2, stream=True))
    finals = sorted(ch.choices[0].index for ch in chunks if ch.choices and ch.choices[0].finish_reason)
    assert finals == [0, 1]


def test_completions_whole_and_streamed(client):
    whole = client.completions.create(model="mock-a", prompt="one two three", max_tokens=3)
    assert whole.choices[0].text == "You said: one" and whole.choices[0].finish_reason == "length"
    pieces = list(client.completions.create(model="mock-a", prompt="one two three", max_tokens=3, stream=True))
    assert "".join(p.choices[0].text for p in pieces if p.choices) == whole.choices[0].text


def test_unknown_model_is_a_404_error_object(client, gateway):
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="no-such-model", messages=CHAT["messages"])
    error = info.value.body
    assert error["code"] == "model_not_found" and error["param"] == "model" and error["type"] == "invalid_request_error"
    assert all(info.value.response.headers[h] is not None for h in HEADERS)
    r = httpx.get(gateway.base_url + "/models/no-such-model", headers=AUTH)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


@pytest.mark.parametrize("patch,param", [
    ({"messages": None}, "messages"), ({"n": "2"}, "n"), ({"temperature": 5}, "temperature"),
    ({"stream_options": {"include_usage": "yes"}}, "stream_options.include_usage"), ({"max_tokens": 0}, "max_tokens"),
])
def test_invalid_body_is_a_400_naming_the_field(gateway, patch, param):
    body = {k: v for k, v in {**CHAT, **patch}.items() if v is not None}
    r = httpx.post(gateway.base_url + "/chat/completions", json=body, headers=AUTH)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and param in r.json()["error"]["message"]
    assert r.headers["x-link-request-id"]
    bad = httpx.post(gateway.base_url + "/chat/completions", content=b"{not json", headers=AUTH)
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"


def test_missing_or_wrong_key_is_a_401_error_object(gateway):
    for headers in ({}, {"Authorization": "Bearer sk-link-nope"}):
        r = httpx.post(gateway.base_url + "/chat/completions", json=CHAT, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"


def test_full_request_schema_passes_through_untouched(client, mock):
    tools = [{"type": "function", "function": {"name": "lookup", "description": "Look up a word.",
                                               "parameters": {"type": "object", "properties": {"text": {"type": "string"}}}}}]
    fields = dict(tools=tools, tool_choice="auto", parallel_tool_calls=False, user="u-1", metadata={"team": "a"}, seed=7,
                  stop=["zzz"], logprobs=True, top_logprobs=2, max_completion_tokens=20, temperature=0.5,
                  response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}})
    answer = client.chat.completions.create(**CHAT, **fields)
    sent = mock.last_body()
    for key, value in fields.items():
        assert sent[key] == value, key
    assert sent["model"] == "mock-model" and "stream_options" not in sent
    call = answer.choices[0].message.tool_calls[0]
    assert answer.choices[0].finish_reason == "tool_calls" and call.function.name == "lookup"
    assert json.loads(call.function.arguments) == {"text": "You said: hello there world"}
    chunks = list(client.chat.completions.create(**CHAT, **fields, stream=True))
    calls = [d for ch in chunks if ch.choices for d in (ch.choices[0].delta.tool_calls or [])]
    assert calls[0].function.name == "lookup" and chunks[-1].choices[0].finish_reason == "tool_calls"
    assert mock.last_body()["stream_options"] == {"include_usage": True}  # the gateway always accounts


def test_streamed_and_whole_account_identically(client, gateway):
    whole = client.chat.completions.with_raw_response.create(**CHAT, max_tokens=4)
    streamed = client.chat.completions.with_raw_response.create(**CHAT, max_tokens=4, stream=True)
    list(streamed.parse())
    rows = [log_row(gateway, r.headers["x-link-request-id"]) for r in (whole, streamed)]
    assert [r["stream"] for r in rows] == [False, True]
    assert rows[0]["prompt_tokens"] == rows[1]["prompt_tokens"] == 3
    assert rows[0]["completion_tokens"] == rows[1]["completion_tokens"] == 4
    assert rows[0]["cost_usd"] == rows[1]["cost_usd"] == pytest.approx((3 * 1000 + 4 * 2000) / 1e6)
    assert rows[1]["ttft_ms"] is not None and all(r["status"] == "ok" for r in rows)


def test_models_list_names_models_and_policies(client):
    listed = {m.id: m for m in client.models.list().data}
    assert {"mock-a", "mock-lite", "team/fixed"} <= set(listed)
    assert client.models.retrieve("team/fixed").id == "team/fixed"


def test_health_is_ok_with_a_replica_of_every_model_in_rotation(gateway):
    response = httpx.get(gateway.url + "/health")
    assert response.status_code == 200 and response.json()["status"] == "ok"
    assert set(response.json()["models"]) == {"mock-a", "mock-lite"}


def test_metrics_per_model_and_policy(gateway, client):
    client.chat.completions.create(model="team/fixed", messages=CHAT["messages"])
    assert httpx.get(gateway.url + "/metrics").status_code == 401  # the master key is configured
    text = httpx.get(gateway.url + "/metrics", headers=AUTH).text
    assert 'link_requests_total{model="mock-lite",policy="team/fixed",status="ok"}' in text
    for name in ("link_prompt_tokens_total", "link_completion_tokens_total", "link_cost_usd_total",
                 "link_request_latency_seconds_bucket", "link_time_to_first_token_seconds_bucket"):
        assert name in text


def test_litellm_as_a_client(gateway):
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    answer = litellm.completion(model="openai/mock-a", api_base=gateway.base_url, api_key=MASTER_KEY,
                                messages=CHAT["messages"])
    assert answer.choices[0].message.content == "You said: hello there world"


def test_link_serve_refuses_a_bad_config_with_a_clear_error(tmp_path):
    from typer.testing import CliRunner

    from cli.app import app

    result = CliRunner().invoke(app, ["serve", "--config", str(tmp_path / "missing.yaml")])
    assert result.exit_code == 2 and "cannot read config" in result.output


def test_link_serve_refuses_a_bad_policy_before_the_server_starts(tmp_path):
    """A policy whose router file is missing: one line naming the policy and the field, exit 2, no traceback."""
    from typer.testing import CliRunner

    from cli.app import app

    config = tmp_path / "link.yaml"
    config.write_text(yaml.safe_dump({
        "models": [{"name": "m1", "kind": "openai", "api_base": "http://127.0.0.1:9/v1"},
                   {"name": "m2", "kind": "openai", "api_base": "http://127.0.0.1:9/v1"}],
        "policies": [{"name": "my-router", "type": "router", "models": ["m1", "m2"],
                      "options": {"path": str(tmp_path / "none.safetensors")}}]}))
    result = CliRunner().invoke(app, ["serve", "--config", str(config), "--port", "1"])
    assert result.exit_code == 2, result.output
    assert "policies[0].options.path (name 'my-router'): no router file" in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


def test_link_serve_checks_policies_against_the_registered_models_too(tmp_path, monkeypatch):
    """A cascade judged by a model registered in the database (not in link.yaml) is served: the start-up check
    sees the database's models as the gateway does."""
    from sqlmodel import Session
    from typer.testing import CliRunner

    import protocol.drain
    from cli.app import app
    from link.db import make_db_engine, upgrade
    from link.db.models import ModelRow

    url = f"sqlite:///{tmp_path / 'link.db'}"
    upgrade(url)
    engine = make_db_engine(url)
    with Session(engine) as session:
        session.add(ModelRow(name="m3", kind="openai", config={"api_base": "http://127.0.0.1:9/v1"}))
        session.commit()
    engine.dispose()
    config = tmp_path / "link.yaml"
    config.write_text(yaml.safe_dump({
        "models": [{"name": n, "kind": "openai", "api_base": "http://127.0.0.1:9/v1"} for n in ("m1", "m2")],
        "policies": [{"name": "judged", "type": "cascade", "models": ["m1", "m2"], "options": {"judge": "m3"}}]}))
    started = []
    monkeypatch.setattr(protocol.drain, "serve_draining", lambda app_, drain, **kwargs: started.append(kwargs["port"]))
    monkeypatch.setenv("LINK_DATABASE_URL", url)
    result = CliRunner().invoke(app, ["serve", "--config", str(config), "--port", "8799"])
    assert result.exit_code == 0 and started == [8799], result.output
    # without the registered model the same policy is refused before the server starts
    monkeypatch.setenv("LINK_DATABASE_URL", f"sqlite:///{tmp_path / 'empty.db'}")
    result = CliRunner().invoke(app, ["serve", "--config", str(config), "--port", "8799"])
    assert result.exit_code == 2 and "policies[0].options.judge (name 'judged'): judge model 'm3' is not served" in result.output
    assert started == [8799]
