"""POST /v1/messages through a real gateway on loopback, driven by Anthropic's official Python client, over the
mock OpenAI server (tests/link/mock_openai.py): whole and streamed text, a tool_use round trip, the system prompt
and the translated request as the backend got them, stop reasons, usage and cost in the request-log row and the
key's budget, and Anthropic-shaped errors (auth, anthropic-version, validation, unknown model, 429, 413).

The mock answers "You said: " + the last message's content, one token per word; its prompt tokens are the words
of every message's content. With tools (and tool_choice not "none") it calls the first tool with
{"text": <that answer>}, id "call_mock_0". Prices: $1000 / $2000 per million prompt / completion tokens.
"""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest
from sqlmodel import Session

from link.config import parse_config
from link.keys import create_key, get_key
from tests.link.gateway_launch import MASTER_KEY, gateway_settings, logged_request, mock_deployment, start_gateway_thread
from tests.link.mock_launch import start_mock_thread

PRICE_IN, PRICE_OUT = 1000.0, 2000.0
HELLO = [{"role": "user", "content": "hello world"}]
WEATHER = {"name": "get_weather", "description": "The weather in a city.",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
HEADERS = {"x-api-key": MASTER_KEY, "anthropic-version": "2023-06-01"}
MAX_BODY_BYTES = 64 * 1024


@pytest.fixture(scope="module")
def mock():
    with start_mock_thread() as server:
        yield server


@pytest.fixture(scope="module")
def gateway(mock, new_database_url, tmp_path_factory):
    config = parse_config({"models": [mock_deployment("m", mock.api_base)],
                           "policies": [{"name": "moa", "type": "moa", "models": ["m"], "options": {"aggregator": "m"}}]})
    settings = gateway_settings(new_database_url("sqlite"), tmp_path_factory.mktemp("home"), max_body_bytes=MAX_BODY_BYTES)
    with start_gateway_thread(settings, config) as server:
        yield server


def sse_events(text: str) -> list[dict]:
    """The JSON `data` of each event of an Anthropic SSE body (`event: NAME` then `data: JSON`)."""
    return [json.loads(line.removeprefix("data: ")) for line in text.splitlines() if line.startswith("data: ")]


def client(gateway, key: str = MASTER_KEY, **options) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key=key, max_retries=0, timeout=30, **options)


def last_body(mock) -> dict:
    return httpx.get(mock.url + "/mock/last").json()


def cost(prompt_tokens: int, completion_tokens: int) -> float:
    return (prompt_tokens * PRICE_IN + completion_tokens * PRICE_OUT) / 1e6


def test_whole_text_with_system_prompt_usage_and_log_row(gateway, mock):
    raw = client(gateway).messages.with_raw_response.create(
        model="m", max_tokens=50, system="be brief", messages=HELLO, metadata={"user_id": "user-7"},
        extra_body={"temperature": 0.5})  # this client version takes the sampling fields as extra body fields
    message = raw.parse()
    request_id = raw.headers["x-link-request-id"]
    assert message.id == f"msg_{request_id}" and message.type == "message" and message.role == "assistant"
    assert message.model == "m" and raw.headers["x-link-model"] == "m" and raw.headers["x-link-policy"] == "m"
    assert [b.to_dict() for b in message.content] == [{"type": "text", "text": "You said: hello world"}]
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    # the mock's prompt: "be brief" + "hello world" = 4 words; the answer: 4 words
    assert (message.usage.input_tokens, message.usage.output_tokens) == (4, 4)
    assert float(raw.headers["x-link-cost-usd"]) == pytest.approx(cost(4, 4))
    assert last_body(mock) == {"model": "mock-model", "max_tokens": 50, "temperature": 0.5, "user": "user-7",
                               "messages": [{"role": "system", "content": "be brief"}, *HELLO]}
    row = logged_request(gateway, request_id)
    assert (row["status"], row["http_status"], row["stream"], row["user"]) == ("ok", 200, False, "user-7")
    assert row["decision"]["endpoint"] == "/v1/messages" and row["policy"] == "m" and row["model"] == "m"
    assert (row["prompt_tokens"], row["completion_tokens"]) == (4, 4)
    assert row["cost_usd"] == pytest.approx(cost(4, 4))


def test_bearer_auth_system_blocks_and_a_policy_name(gateway, mock):
    bearer = anthropic.Anthropic(base_url=gateway.url, auth_token=MASTER_KEY, max_retries=0, timeout=30)
    message = bearer.messages.create(model="moa", max_tokens=50, messages=HELLO,
                                     system=[{"type": "text", "text": "one"}, {"type": "text", "text": "two"}])
    assert message.content[0].text == "You said: hello world" and message.stop_reason == "end_turn"
    # the last call is the aggregator's, whose system message is the client's followed by its instructions
    assert last_body(mock)["messages"][0]["content"].startswith("one\n\ntwo\n\nOther assistants have already answered")


@pytest.mark.parametrize("max_tokens, stop, reason, text", [
    (2, None, "max_tokens", "You said:"),
    (50, ["hello"], "end_turn", "You said: "),   # the mock names no matched stop string (vLLM's stop_reason)
])
def test_stop_reasons(gateway, mock, max_tokens, stop, reason, text):
    message = client(gateway).messages.create(model="m", max_tokens=max_tokens, messages=HELLO,
                                              **({"stop_sequences": stop} if stop else {}))
    assert (message.stop_reason, message.stop_sequence, message.content[0].text) == (reason, None, text)
    assert last_body(mock).get("stop") == stop


def test_tool_use_round_trip(gateway, mock):
    api = client(gateway)
    question = [{"role": "user", "content": "weather in Paris?"}]
    first = api.messages.create(model="m", max_tokens=50, tools=[WEATHER], tool_choice={"type": "auto"}, messages=question)
    assert first.stop_reason == "tool_use"
    assert [b.to_dict() for b in first.content] == [
        {"type": "tool_use", "id": "call_mock_0", "name": "get_weather", "input": {"text": "You said: weather in Paris?"}}]
    sent = last_body(mock)
    assert sent["tools"] == [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER["input_schema"],
                                                               "description": "The weather in a city."}}]
    assert sent["tool_choice"] == "auto"
    history = [*question, {"role": "assistant", "content": [b.to_dict() for b in first.content]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_mock_0",
                                             "content": [{"type": "text", "text": "sunny"}]}]}]
    second = api.messages.create(model="m", max_tokens=50, tools=[WEATHER], tool_choice={"type": "none"}, messages=history)
    assert [b.to_dict() for b in second.content] == [{"type": "text", "text": "You said: sunny"}]
    assert second.stop_reason == "end_turn"
    sent = last_body(mock)
    assert sent["tool_choice"] == "none"
    assert sent["messages"] == [
        *question,
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_mock_0", "type": "function", "function": {
            "name": "get_weather", "arguments": json.dumps({"text": "You said: weather in Paris?"})}}]},
        {"role": "tool", "tool_call_id": "call_mock_0", "content": "sunny"}]


def test_streamed_text_events_and_final_message(gateway):
    with client(gateway).messages.stream(model="m", max_tokens=50, messages=HELLO) as stream:
        final = stream.get_final_message()
        request_id = stream.response.headers["x-link-request-id"]
    assert final.id == f"msg_{request_id}" and final.content[0].text == "You said: hello world"
    assert final.stop_reason == "end_turn" and (final.usage.input_tokens, final.usage.output_tokens) == (2, 4)
    response = httpx.post(gateway.url + "/v1/messages", headers=HEADERS, timeout=30,
                          json={"model": "m", "max_tokens": 50, "messages": HELLO, "stream": True})
    lines = [line for line in response.text.splitlines() if line.startswith("event: ")]
    assert lines == [f"event: {name}" for name in ("message_start", "ping", "content_block_start",
                                                     *["content_block_delta"] * 4, "content_block_stop",
                                                     "message_delta", "message_stop")]
    events = sse_events(response.text)
    assert [e["delta"]["text"] for e in events if e["type"] == "content_block_delta"] == ["You", " said:", " hello", " world"]
    assert events[-2] == {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                          "usage": {"input_tokens": 2, "output_tokens": 4}}
    row = logged_request(gateway, response.headers["x-link-request-id"])
    assert (row["status"], row["stream"], row["prompt_tokens"], row["completion_tokens"]) == ("ok", True, 2, 4)
    assert row["decision"]["endpoint"] == "/v1/messages" and row["cost_usd"] == pytest.approx(cost(2, 4))


def test_streamed_tool_use(gateway):
    with client(gateway).messages.stream(model="m", max_tokens=50, tools=[WEATHER], tool_choice={"type": "any"},
                                         messages=[{"role": "user", "content": "Paris"}]) as stream:
        events = list(stream)
        final = stream.get_final_message()
    assert [e.type for e in events if e.type.startswith("content_block")][:2] == ["content_block_start", "content_block_delta"]
    deltas = [e.delta.partial_json for e in events if e.type == "content_block_delta"]
    assert deltas == [json.dumps({"text": "You said: Paris"})]
    assert final.stop_reason == "tool_use"
    assert [(b.type, b.id, b.name, b.input) for b in final.content] == [
        ("tool_use", "call_mock_0", "get_weather", {"text": "You said: Paris"})]


def test_image_block_reaches_a_remote_backend_as_an_image_url_part(gateway, mock):
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    client(gateway).messages.create(model="m", max_tokens=5, messages=[
        {"role": "user", "content": [{"type": "text", "text": "what is it"}, image]}])
    assert last_body(mock)["messages"] == [{"role": "user", "content": [
        {"type": "text", "text": "what is it"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}]


def error_of(response: httpx.Response) -> tuple[int, dict]:
    return response.status_code, response.json()


def test_auth_failure_is_an_anthropic_401(gateway):
    with pytest.raises(anthropic.AuthenticationError) as caught:
        client(gateway, key="sk-wrong").messages.create(model="m", max_tokens=5, messages=HELLO)
    assert caught.value.status_code == 401
    assert caught.value.body == {"type": "error", "error": {"type": "authentication_error",
                                                            "message": "Incorrect API key provided (unknown or revoked)."}}
    assert caught.value.response.headers["x-link-request-id"]


def test_missing_anthropic_version_is_a_400(gateway):
    response = httpx.post(gateway.url + "/v1/messages", headers={"x-api-key": MASTER_KEY}, timeout=30,
                          json={"model": "m", "max_tokens": 5, "messages": HELLO})
    assert error_of(response) == (400, {"type": "error", "error": {"type": "invalid_request_error",
                                                                   "message": "anthropic-version: header is required"}})
    row = logged_request(gateway, response.headers["x-link-request-id"])
    assert (row["status"], row["http_status"], row["decision"]) == ("invalid_request", 400, {"endpoint": "/v1/messages"})


@pytest.mark.parametrize("body, message", [
    ({"model": "m", "messages": HELLO}, "max_tokens: Field required"),
    ({"model": "m", "max_tokens": 5, "messages": HELLO, "temperature": 1.5},
     "temperature: Input should be less than or equal to 1"),
    ({"model": "m", "max_tokens": 5, "messages": HELLO, "thinking": {"type": "enabled"}},
     "thinking: Extra inputs are not permitted"),
    ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "text"}]}]},
     "messages.0.content.0.text.text: Field required"),
])
def test_validation_errors_name_the_field(gateway, body, message):
    response = httpx.post(gateway.url + "/v1/messages", headers=HEADERS, json=body, timeout=30)
    assert error_of(response) == (400, {"type": "error", "error": {"type": "invalid_request_error", "message": message}})


def test_validation_error_through_the_sdk_and_unknown_model(gateway):
    with pytest.raises(anthropic.BadRequestError) as caught:
        client(gateway).messages.create(model="m", max_tokens=5, messages=HELLO, extra_body={"top_k": -1})
    assert caught.value.body["error"] == {"type": "invalid_request_error",
                                          "message": "top_k: Input should be greater than or equal to 0"}
    with pytest.raises(anthropic.NotFoundError) as caught:
        client(gateway).messages.create(model="nope", max_tokens=5, messages=HELLO)
    assert caught.value.body["error"]["type"] == "not_found_error"
    assert caught.value.body["error"]["message"].startswith("The model `nope` does not exist")


def test_rate_limit_is_an_anthropic_429_with_retry_after(gateway):
    with Session(gateway.state.db) as session:
        _, plaintext = create_key(session, "anthropic-rpm", rpm_limit=1)
    api = client(gateway, key=plaintext)
    api.messages.create(model="m", max_tokens=5, messages=HELLO)
    with pytest.raises(anthropic.RateLimitError) as caught:
        api.messages.create(model="m", max_tokens=5, messages=HELLO)
    assert caught.value.status_code == 429 and int(caught.value.response.headers["retry-after"]) >= 1
    assert caught.value.body["type"] == "error" and caught.value.body["error"]["type"] == "rate_limit_error"
    assert caught.value.body["error"]["message"].startswith("Rate limit reached for API key 'anthropic-rpm' on requests")


def test_budget_is_charged_the_answer_cost(gateway):
    with Session(gateway.state.db) as session:
        key, plaintext = create_key(session, "anthropic-budget", budget_usd=5.0)
    message = client(gateway, key=plaintext).messages.create(model="m", max_tokens=50, messages=HELLO)
    assert (message.usage.input_tokens, message.usage.output_tokens) == (2, 4)
    gateway.flush_log()
    with Session(gateway.state.db) as session:
        assert get_key(session, key.id).spend_usd == pytest.approx(cost(2, 4))


def test_a_body_over_the_size_limit_is_an_anthropic_413_with_its_log_row(gateway):
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x" * MAX_BODY_BYTES}]}
    response = httpx.post(gateway.url + "/v1/messages", headers=HEADERS, json=body, timeout=30)
    status, error = error_of(response)
    assert status == 413 and error["type"] == "error" and error["error"]["type"] == "request_too_large"
    assert error["error"]["message"].startswith("The request body is ")
    row = logged_request(gateway, response.headers["x-link-request-id"])
    assert (row["status"], row["http_status"]) == ("invalid_request", 413)
