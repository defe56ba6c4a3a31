"""The standalone engine server on loopback, driven by the official `openai` client and raw HTTP."""

from __future__ import annotations

import time

import httpx
import openai
import pytest

from serving.api.server import create_engine_app

pytestmark = pytest.mark.slow  # loads a real model (tests/test_markers.py)

MODEL = "smollm2-135m-instruct"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    # float32 weights of SmolLM2-135M (134,515,008 parameters, the tied embedding once) plus the rotary buffers
    assert 4 * 134_515_008 <= client.models.list().data[0].model_extra["resident_bytes"] < 4 * 134_515_008 * 1.01
    assert httpx.get(server[0] + "/health").json() == {"status": "ok"}


def test_chat_whole_and_streamed_agree_with_the_same_usage(client, smollm2):
    kwargs = dict(model=MODEL, messages=QUESTION, temperature=0.7, seed=11, max_tokens=24)
    whole = client.chat.completions.create(**kwargs)
    text = whole.choices[0].message.content
    assert whole.object == "chat.completion" and whole.model == MODEL and text
    prompt = smollm2.loaded.chat_format.render(QUESTION)
    assert whole.usage.prompt_tokens == len(smollm2.tokenizer.encode(prompt))
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens
    chunks = list(client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage


def test_chat_answers_paris_and_reports_logprobs(client):
    out = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=32, logprobs=True, top_logprobs=2)
    choice = out.choices[0]
    assert "Paris" in choice.message.content and choice.finish_reason == "stop"
    content = choice.logprobs.content
    assert len(content) == out.usage.completion_tokens
    assert all(len(t.top_logprobs) == 2 and t.logprob == pytest.approx(t.top_logprobs[0].logprob) for t in content)


def test_completions_whole_streamed_and_n(client):
    kwargs = dict(model=MODEL, prompt="The capital of France is", temperature=0, max_tokens=8)
    whole = client.completions.create(**kwargs)
    assert "Paris" in whole.choices[0].text
    streamed = "".join(c.choices[0].text for c in client.completions.create(**kwargs, stream=True) if c.choices)
    assert streamed == whole.choices[0].text
    several = client.completions.create(model=MODEL, prompt=["1, 2, 3,", "a, b, c,"], n=2, temperature=1.0, seed=3, max_tokens=6)
    assert sorted(c.index for c in several.choices) == [0, 1, 2, 3]
    assert several.usage.completion_tokens <= 4 * 6


def test_stop_string_never_leaks_into_a_stream(client):
    kwargs = dict(model=MODEL, prompt="Count: 1, 2, 3, 4, 5, 6, 7, 8,", temperature=0, max_tokens=20, stop=[" 11"])
    whole = client.completions.create(**kwargs)
    streamed = "".join(c.choices[0].text for c in client.completions.create(**kwargs, stream=True) if c.choices)
    assert whole.choices[0].finish_reason == "stop" and " 11" not in whole.choices[0].text
    assert streamed == whole.choices[0].text


@pytest.mark.parametrize("kwargs,status,needle", [
    (dict(model="gpt-17", messages=QUESTION), 404, "does not exist"),
    (dict(model=MODEL, messages=[{"role": "user", "content": "word " * 9000}]), 400, "maximum context length"),
    (dict(model=MODEL, messages=QUESTION, max_tokens=9000), 400, "maximum context length"),
    (dict(model=MODEL, messages=QUESTION, temperature=5), 400, "temperature"),
    (dict(model=MODEL, messages=[]), 400, "messages"),
    (dict(model=MODEL, messages=[{"role": "wizard", "content": "hi"}]), 400, "role"),
])
def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(client, kwargs, status, needle):
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(**kwargs)
    assert info.value.status_code == status
    assert needle in info.value.body["message"]
    assert client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=2).choices[0].message.content is not None


def test_malformed_json_is_a_400(server):
    response = httpx.post(server[0] + "/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert response.status_code == 400 and "error" in response.json()


def test_client_disconnect_frees_blocks(server):
    base, app = server
    engine = app.state.engine_state.engine
    total = engine.engine.block_manager.num_blocks
    body = {"model": MODEL, "prompt": "Tell me a very long story.", "max_tokens": 500, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", base + "/v1/completions", json=body, timeout=60) as response:
        lines = response.iter_lines()
        for _ in range(6):
            next(lines)
    deadline = time.monotonic() + 30
    while engine.engine.block_manager.num_free_blocks != total or engine.engine.has_unfinished_requests:
        assert time.monotonic() < deadline, "aborted request still holds KV blocks"
        time.sleep(0.05)


def test_metrics_expose_engine_state(server, client):
    client.completions.create(model=MODEL, prompt="Hello", max_tokens=3)
    text = httpx.get(server[0] + "/metrics").text
    for name in ("link_engine_requests_running", "link_engine_kv_blocks_used", "link_engine_prefix_cache_hit_rate",
                 "link_engine_time_to_first_token_seconds_bucket", "link_engine_inter_token_latency_seconds_bucket",
                 "link_engine_generation_tokens_total"):
        assert name in text


def test_requests_past_the_kv_cache_get_a_400_and_the_engine_survives(smollm2):
    """A KV cache smaller than the model's context caps max_model_len; nothing past it reaches the engine."""
    from fastapi.testclient import TestClient

    from serving.engine.llm_engine import EngineConfig

    app = create_engine_app(MODEL, loaded=smollm2.loaded, engine_config=EngineConfig(num_blocks=20))  # 320 tokens
    with TestClient(app) as http:
        assert http.get("/v1/models").json()["data"][0]["max_model_len"] == 320
        too_long = http.post("/v1/completions", json={"model": MODEL, "prompt": [504] * 200, "max_tokens": 300})
        assert too_long.status_code == 400 and too_long.json()["error"]["code"] == "context_length_exceeded"
        bad_ids = http.post("/v1/completions", json={"model": MODEL, "prompt": [-1]})
        assert bad_ids.status_code == 400 and "token ids" in bad_ids.json()["error"]["message"]
        ok = http.post("/v1/completions", json={"model": MODEL, "prompt": [504] * 200, "max_tokens": 100, "ignore_eos": True})
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 100
        assert http.get("/health").json() == {"status": "ok"}
