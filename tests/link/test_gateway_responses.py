"""The Responses API (`/v1/responses`) with the official `openai` client against a real gateway on loopback in
front of the mock OpenAI server (tests/link/mock_openai.py), on SQLite and PostgreSQL.

The mock answers "You said: " + the last message's content, one word per token; its prompt count is the words of
every message. With `tools` (tool_choice not "none") it calls the first tool with {"text": <that answer>}.
Prices: mock_deployment's 1000 / 2000 USD per million input / output tokens.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from sqlmodel import Session

from link.keys import create_key, get_key
from tests.link.gateway_launch import MASTER_KEY, gateway_settings, logged_request, mock_deployment, start_gateway_thread
from tests.link.mock_launch import start_mock_thread

PRICE_IN, PRICE_OUT = 1000.0, 2000.0
WEATHER_TOOL = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


@pytest.fixture(scope="module")
def stack(db_url, tmp_path_factory):
    from link.config import parse_config

    with start_mock_thread() as mock:
        config = parse_config({"models": [mock_deployment("m", mock.api_base)]})
        with start_gateway_thread(gateway_settings(db_url, tmp_path_factory.mktemp("home")), config) as server:
            yield server, mock


def client(gateway, key: str = MASTER_KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0, timeout=30)


def test_whole_text_with_instructions_usage_and_cost(stack, engine, session):
    gateway, mock = stack
    key, plaintext = create_key(session, "responses-whole", budget_usd=10.0)
    raw = client(gateway, plaintext).responses.with_raw_response.create(
        model="m", input="hello world", instructions="Be brief.", metadata={"team": "a"}, user="u-1")
    response = raw.parse()
    assert response.output_text == "You said: hello world"
    assert response.id.startswith("resp_") and response.object == "response" and response.status == "completed"
    assert (response.model, response.instructions, response.metadata, response.store) == ("m", "Be brief.", {"team": "a"}, True)
    [item] = response.output
    assert (item.type, item.role, item.status, [p.type for p in item.content]) == ("message", "assistant", "completed", ["output_text"])
    # prompt: "Be brief." + "hello world" = 4 words; answer: 4 words
    assert (response.usage.input_tokens, response.usage.output_tokens, response.usage.total_tokens) == (4, 4, 8)
    sent = mock.last_body()
    assert sent["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello world"}]
    assert (sent["metadata"], sent["user"]) == ({"team": "a"}, "u-1")
    cost = (4 * PRICE_IN + 4 * PRICE_OUT) / 1e6
    assert float(raw.headers["x-link-cost-usd"]) == pytest.approx(cost, rel=1e-9)
    row = logged_request(gateway, raw.headers["x-link-request-id"])
    assert (row["status"], row["prompt_tokens"], row["completion_tokens"], row["api_key_id"]) == ("ok", 4, 4, key.id)
    assert row["cost_usd"] == pytest.approx(cost, rel=1e-9) and row["decision"]["endpoint"] == "/v1/responses"
    assert (row["user"], row["metadata"]) == ("u-1", {"team": "a"})
    with Session(engine) as fresh:
        spent = get_key(fresh, key.id)
    assert spent.reserved_usd == 0 and spent.spend_usd == pytest.approx(cost, rel=1e-6)


def test_streamed_text_events(stack):
    gateway, _ = stack
    events = list(client(gateway).responses.create(model="m", input="hello world", stream=True))
    types = [e.type for e in events]
    assert types == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", *["response.output_text.delta"] * 4, "response.output_text.done",
                     "response.content_part.done", "response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "You said: hello world"
    final = events[-1].response
    assert final.output_text == "You said: hello world" and final.status == "completed"
    assert final.id == events[0].response.id and final.output[0].id == events[2].item.id
    assert (final.usage.input_tokens, final.usage.output_tokens, final.usage.total_tokens) == (2, 4, 6)
    # stored: the retrieved response is the streamed one
    assert client(gateway).responses.retrieve(final.id).output_text == "You said: hello world"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_function_call_round_trip(stack, stream):
    gateway, mock = stack
    api = client(gateway)
    if stream:
        events = list(api.responses.create(model="m", input="weather in Paris", tools=[WEATHER_TOOL], stream=True))
        assert [e.type for e in events][2:] == ["response.output_item.added", "response.function_call_arguments.delta",
                                                "response.function_call_arguments.done", "response.output_item.done",
                                                "response.completed"]
        first = events[-1].response
    else:
        first = api.responses.create(model="m", input="weather in Paris", tools=[WEATHER_TOOL])
    [call] = first.output
    assert (call.type, call.call_id, call.name) == ("function_call", "call_mock_0", "get_weather")
    assert json.loads(call.arguments) == {"text": "You said: weather in Paris"} and first.output_text == ""
    assert mock.last_body()["tools"] == [{"type": "function", "function": {k: v for k, v in WEATHER_TOOL.items() if k != "type"}}]
    second = api.responses.create(model="m", tools=[WEATHER_TOOL], tool_choice="none", store=False, input=[
        {"role": "user", "content": "weather in Paris"}, call.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": "call_mock_0", "output": "sunny 22C"}])
    assert second.output_text == "You said: sunny 22C" and second.store is False
    assert mock.last_body()["messages"] == [
        {"role": "user", "content": "weather in Paris"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_mock_0", "type": "function", "function": {
            "name": "get_weather", "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": "call_mock_0", "content": "sunny 22C"}]
    with pytest.raises(openai.NotFoundError):   # store=False: nothing to retrieve
        api.responses.retrieve(second.id)


def test_previous_response_id_chains_and_is_scoped_to_its_key(stack, session):
    gateway, mock = stack
    _, mine = create_key(session, "responses-owner")
    _, other = create_key(session, "responses-other")
    api, stranger = client(gateway, mine), client(gateway, other)
    first = api.responses.create(model="m", input="first turn", instructions="Answer in French.")
    second = api.responses.create(model="m", input="second turn", previous_response_id=first.id)
    assert second.output_text == "You said: second turn" and second.previous_response_id == first.id
    # the earlier input and output come first; the earlier instructions are not carried over (as OpenAI)
    assert mock.last_body()["messages"] == [{"role": "user", "content": "first turn"},
                                            {"role": "assistant", "content": "You said: first turn"},
                                            {"role": "user", "content": "second turn"}]
    third = api.responses.create(model="m", input="third", previous_response_id=second.id, instructions="Be short.")
    assert [m["content"] for m in mock.last_body()["messages"]] == [
        "Be short.", "first turn", "You said: first turn", "second turn", "You said: second turn", "third"]
    assert third.output_text == "You said: third"
    assert api.responses.retrieve(first.id).model_dump() == first.model_dump()
    for call in (lambda: stranger.responses.retrieve(first.id), lambda: stranger.responses.delete(first.id),
                 lambda: client(gateway).responses.retrieve(first.id)):   # the master key is another caller too
        with pytest.raises(openai.NotFoundError) as caught:
            call()
        assert caught.value.body == {"message": f"Response with id '{first.id}' not found.",
                                     "type": "invalid_request_error", "param": None, "code": None}
    with pytest.raises(openai.NotFoundError) as caught:
        stranger.responses.create(model="m", input="hi", previous_response_id=first.id)
    assert caught.value.body == {"message": f"Previous response with id '{first.id}' not found.",
                                 "type": "invalid_request_error", "param": "previous_response_id",
                                 "code": "previous_response_not_found"}
    deleted = httpx.delete(f"{gateway.base_url}/responses/{first.id}", headers={"Authorization": f"Bearer {mine}"})
    assert deleted.status_code == 200 and deleted.json() == {"id": first.id, "object": "response", "deleted": True}
    with pytest.raises(openai.NotFoundError):
        api.responses.retrieve(first.id)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_max_output_tokens_makes_an_incomplete_response(stack, stream):
    gateway, _ = stack
    words = [f"w{i}" for i in range(20)]
    body = dict(model="m", input=" ".join(words), max_output_tokens=16)
    if stream:
        events = list(client(gateway).responses.create(**body, stream=True))
        assert events[-1].type == "response.incomplete"
        response = events[-1].response
    else:
        response = client(gateway).responses.create(**body)
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.output_text == " ".join(["You", "said:", *words][:16]) and response.usage.output_tokens == 16
    assert response.output[0].status == "incomplete"


@pytest.mark.parametrize("body, param, words", [
    ({"temperature": 3}, "temperature", "less than or equal to 2"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type", "only 'function' tools"),
    ({"input": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]}, "input[0].content[0].type",
     "'input_text', 'input_image'"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input[0].type", "'message', 'function_call', 'function_call_output'"),
    ({"background": True}, "background", "not supported"),
    ({"max_output_tokens": 4}, "max_output_tokens", "greater than or equal to 16"),
    ({"frequency_penalty": 1}, "frequency_penalty", "Unrecognized request argument supplied: frequency_penalty"),
])
def test_validation_errors_name_the_field(stack, body, param, words):
    gateway, _ = stack
    with pytest.raises(openai.BadRequestError) as caught:
        client(gateway).responses.create(model="m", input="hi", extra_body=body)   # sent as is, unknown fields too
    assert caught.value.body["param"] == param and words in caught.value.body["message"], caught.value.body
    request_id = caught.value.response.headers["x-link-request-id"]
    assert logged_request(gateway, request_id)["status"] == "invalid_request"


def test_unknown_model_and_missing_key(stack):
    gateway, _ = stack
    with pytest.raises(openai.NotFoundError) as caught:
        client(gateway).responses.create(model="nope", input="hi")
    assert caught.value.body["code"] == "model_not_found"
    with pytest.raises(openai.AuthenticationError):
        client(gateway, "sk-wrong").responses.create(model="m", input="hi")
