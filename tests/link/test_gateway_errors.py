"""The gateway's request validation and error objects, as OpenAI answers them, over real HTTP against the
mock backend (fast).

Unknown fields are 400s naming them, at the top level and inside messages, content parts, tools,
tool_choice, response_format and stream_options, while every documented field passes through; a message
without content, `stream_options` without `stream`, `tool_choice` without `tools`, a bad tool name and a
mistyped `stop` name the client's field path; a rate
limit's 429 says which limit (`requests` or `tokens`); an unknown route is OpenAI's "Invalid URL"; every
error answer names the requested or last tried model and the policy in its x-link-* headers.
"""

from __future__ import annotations

import httpx
import pytest
from sqlmodel import Session

from link.db import make_db_engine
from link.keys import create_key
from tests.link.gateway_launch import MASTER_KEY, gateway_settings, mock_deployment, start_gateway_thread
from tests.link.mock_launch import refused_url

AUTH = {"Authorization": f"Bearer {MASTER_KEY}"}
MESSAGES = [{"role": "user", "content": "hello there world"}]
CHAT = {"model": "mock-a", "messages": MESSAGES}


@pytest.fixture(scope="module")
def gateway(mock, new_database_url, tmp_path_factory):
    from link.config import parse_config

    config = parse_config({"models": [mock_deployment("mock-a", mock.api_base), mock_deployment("down", refused_url()),
                                      mock_deployment("down-too", refused_url())],
                           "policies": [{"name": "fb-down", "type": "fallback", "models": ["down", "down-too"]},
                                        {"name": "路由", "type": "fixed", "models": ["mock-a"]}]})
    settings = gateway_settings(new_database_url("sqlite"), tmp_path_factory.mktemp("home"))
    with start_gateway_thread(settings, config) as server:
        yield server


def post(gateway, body: dict, path: str = "/chat/completions", headers: dict | None = None) -> httpx.Response:
    return httpx.post(gateway.base_url + path, json=body, headers=headers or AUTH, timeout=30)


def error_of(response: httpx.Response, status: int = 400) -> dict:
    assert response.status_code == status, response.text
    assert set(response.json()) == {"error"} and set(response.json()["error"]) == {"message", "type", "param", "code"}
    return response.json()["error"]


def test_unknown_fields_are_400s_naming_them(gateway):
    error = error_of(post(gateway, {**CHAT, "foo": 1}))
    assert error["message"] == "Unrecognized request argument supplied: foo" and error["param"] == "foo"
    error = error_of(post(gateway, {"model": "mock-a", "prompt": "hi", "metadata": {"a": "b"}}, "/completions"))
    assert error["param"] == "metadata"  # Completions has no `metadata` in OpenAI's schema


@pytest.mark.parametrize("field,value", [
    ("user", "u-1"), ("metadata", {"team": "a"}), ("store", True), ("service_tier", "auto"),
    ("logit_bias", {"17": 5}), ("prediction", {"type": "content", "content": "x"}),
    ("reasoning_effort", "low"), ("modalities", ["text"]), ("audio", {"voice": "alloy", "format": "wav"}),
    ("functions", [{"name": "f", "parameters": {"type": "object"}}]), ("function_call", "auto"),
    ("web_search_options", {}), ("verbosity", "low"), ("safety_identifier", "s-1"), ("prompt_cache_key", "k"),
])
def test_documented_fields_reach_the_backend(gateway, mock, field, value):
    response = post(gateway, {**CHAT, field: value})
    assert response.status_code == 200, response.text
    assert mock.last_body()[field] == value


TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]


@pytest.mark.parametrize("patch,param", [
    ({"messages": [{"role": "user", "content": "hi", "bogus": 1}]}, "messages[0].bogus"),
    ({"tools": [{"type": "function", "function": {"name": "f", "foo": 1}}]}, "tools[0].function.foo"),
    ({"tools": [{"type": "function", "function": {"name": "f"}, "bar": 1}]}, "tools[0].bar"),
    ({"tools": [{"type": "function", "function": {"name": "my func!"}}]}, "tools[0].function.name"),
    ({"response_format": {"type": "json_object", "foo": 1}}, "response_format.foo"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}}, "response_format.json_schema.name"),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content[0].text"),
    ({"messages": [*MESSAGES, {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f"}}]}]},
     "messages[1].tool_calls[0].function.arguments"),
    ({"stream": True, "stream_options": {"foo": True}}, "stream_options.foo"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "bogus"}]}]}, "messages[0].content[1].type"),
    ({"tool_choice": "none"}, "tool_choice"), ({"parallel_tool_calls": False}, "parallel_tool_calls"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"max_tokens": 5, "max_completion_tokens": 6}, "max_tokens"),
])
def test_malformed_nested_objects_are_400s_naming_their_path(gateway, mock, patch, param):
    error = error_of(post(gateway, {**CHAT, **patch}))
    assert error["param"] == param and error["type"] == "invalid_request_error", error


def test_tool_choice_without_tools_is_openais_400(gateway):
    error = error_of(post(gateway, {**CHAT, "tool_choice": "auto"}))
    assert error["message"] == "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified."


def test_what_openai_accepts_in_nested_objects_reaches_the_backend(gateway, mock):
    image = {"role": "user", "name": "ann", "content": [{"type": "text", "text": "What is this?"},
                                                        {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}
    echoed = {"role": "assistant", "content": "A cat.", "refusal": None, "audio": None, "annotations": []}
    body = {**CHAT, "messages": [image, echoed, *MESSAGES], "tools": TOOLS, "parallel_tool_calls": False,
            "tool_choice": {"type": "function", "function": {"name": "lookup"}}}
    assert post(gateway, body).status_code == 200
    assert mock.last_body()["messages"] == body["messages"] and mock.last_body()["parallel_tool_calls"] is False


@pytest.mark.parametrize("messages,param", [
    ([{"role": "user"}], "messages[0].content"),
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": None}], "messages[1].content"),
    ([{"role": "assistant"}], "messages[0].content"),
    ([{"content": "hi"}], "messages[0].role"),
    ([{"role": "user", "content": 5}], "messages[0].content"),
])
def test_a_message_without_content_or_role_is_a_400_naming_it(gateway, messages, param):
    error = error_of(post(gateway, {"model": "mock-a", "messages": messages}))
    assert error["param"] == param and param in error["message"]


def test_an_assistant_message_with_tool_calls_may_omit_content(gateway):
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    messages = [*MESSAGES, {"role": "assistant", "tool_calls": [call]}, {"role": "tool", "tool_call_id": "call_1", "content": "ok"}]
    assert post(gateway, {"model": "mock-a", "messages": messages}).status_code == 200


def test_stream_options_need_stream(gateway):
    for body in ({**CHAT, "stream_options": {"include_usage": True}}, {**CHAT, "stream": False, "stream_options": {}}):
        error = error_of(post(gateway, body))
        assert error["param"] == "stream_options"
        assert error["message"] == "The 'stream_options' parameter is only allowed when 'stream' is enabled."


@pytest.mark.parametrize("patch,param", [
    ({"stop": 5}, "stop"), ({"stop": ["a", 7]}, "stop[1]"), ({"messages": [5]}, "messages[0]"),
    ({"logit_bias": {"x": 1}}, "logit_bias"),
])
def test_params_are_the_clients_field_paths(gateway, patch, param):
    error = error_of(post(gateway, {**CHAT, **patch}))
    assert error["param"] == param, error
    assert ".str" not in error["message"] and "list[" not in error["message"]


def test_a_bad_json_body_names_the_position(gateway):
    response = httpx.post(gateway.base_url + "/chat/completions", content=b'{"model": "mock-a",}', headers=AUTH)
    error = error_of(response)
    assert "not parse the JSON body" in error["message"] and "line 1 column 20" in error["message"]


def test_unknown_routes_are_invalid_url_errors(gateway):
    error = error_of(httpx.post(gateway.base_url + "/foo", json={}, headers=AUTH), 404)
    assert error == {"message": "Invalid URL (POST /v1/foo)", "type": "invalid_request_error", "param": None, "code": None}


def test_error_answers_name_the_model_and_policy(gateway):
    invalid = post(gateway, {**CHAT, "n": "2"})
    assert invalid.status_code == 400 and invalid.headers["x-link-model"] == "mock-a"
    assert invalid.headers["x-link-policy"] == "mock-a" and len(invalid.headers["x-link-request-id"]) == 32
    unknown = post(gateway, {**CHAT, "model": "no-such-model"})
    assert unknown.status_code == 404 and unknown.headers["x-link-model"] == "no-such-model"
    failed = post(gateway, {**CHAT, "model": "fb-down"})  # both candidates refuse the connection
    assert failed.status_code == 503, failed.text
    assert failed.headers["x-link-model"] == "down-too" and failed.headers["x-link-policy"] == "fb-down"
    not_json = httpx.post(gateway.base_url + "/chat/completions", content=b"{", headers=AUTH)
    assert not_json.status_code == 400 and not_json.headers["x-link-request-id"]
    assert "x-link-model" in not_json.headers and "x-link-policy" in not_json.headers


@pytest.mark.parametrize("metadata,param,says", [
    ({f"k{i}": "v" for i in range(17)}, "metadata", "Invalid 'metadata': too many properties. Expected an object with "
     "at most 16 properties, but got an object with 17 properties instead."),
    ({"k" * 65: "v"}, "metadata", "Expected a key with maximum length 64, but got a key with length 65 instead."),
    ({"note": "x" * 513}, "metadata.note", "Invalid 'metadata.note': string too long. Expected a string with maximum "
     "length 512, but got a string with length 513 instead."),
])
def test_metadata_keeps_openais_limits(gateway, metadata, param, says):
    error = error_of(post(gateway, {**CHAT, "metadata": metadata}))
    assert error["param"] == param and says in error["message"]
    assert post(gateway, {**CHAT, "metadata": {f"k{i}": "v" * 512 for i in range(16)}}).status_code == 200


def test_empty_messages_are_an_empty_array_as_openai_says(gateway):
    error = error_of(post(gateway, {**CHAT, "messages": []}))
    assert error["param"] == "messages"
    assert error["message"] == ("Invalid 'messages': empty array. Expected an array with minimum length 1, but got an "
                                "empty array instead.")


def test_names_outside_printable_ascii_are_percent_encoded_in_the_headers(gateway):
    # an HTTP header holds Latin-1 at most and no line break: such a name once turned the answer into a 500
    answered = post(gateway, {**CHAT, "model": "路由"})
    assert answered.status_code == 200, answered.text
    assert answered.headers["x-link-policy"] == "%E8%B7%AF%E7%94%B1" and answered.headers["x-link-model"] == "mock-a"
    unknown = post(gateway, {**CHAT, "model": "模型"})
    assert error_of(unknown, 404)["code"] == "model_not_found"
    assert unknown.headers["x-link-model"] == "%E6%A8%A1%E5%9E%8B"
    injected = post(gateway, {**CHAT, "model": "a\r\nx-evil: 1"})
    assert error_of(injected, 404)["code"] == "model_not_found" and "x-evil" not in injected.headers
    assert injected.headers["x-link-model"] == "a%0D%0Ax-evil: 1"


@pytest.mark.parametrize("name,header", [(" ", "%20"), ("  a b ", "%20%20a b%20"), ("a ", "a%20")])
def test_spaces_at_the_ends_of_a_name_are_encoded_in_the_headers(gateway, name, header):
    # the fuzzer's find: a `model` of " " made the header value " ", which the server refused to send (no answer)
    unknown = post(gateway, {**CHAT, "model": name})
    assert error_of(unknown, 404)["code"] == "model_not_found"
    assert unknown.headers["x-link-model"] == header and unknown.headers["x-link-policy"] == header


@pytest.mark.parametrize("limits,kind", [({"tpm_limit": 5}, "tokens"), ({"rpm_limit": 1}, "requests")])
def test_a_rate_limit_429_names_its_limit(gateway, limits, kind):
    engine = make_db_engine(gateway.state.settings.database_url)
    try:
        with Session(engine) as session:
            _, plaintext = create_key(session, f"limited-{kind}", **limits)
    finally:
        engine.dispose()
    headers = {"Authorization": f"Bearer {plaintext}"}
    assert post(gateway, CHAT, headers=headers).status_code == 200  # 8 tokens: over 5 for the next one
    limited = post(gateway, CHAT, headers=headers)
    error = error_of(limited, 429)
    assert error["type"] == kind and error["code"] == "rate_limit_exceeded" and int(limited.headers["Retry-After"]) >= 1
