"""Strict validation of a chat request's nested objects (protocol/chat_fields.py, used by
protocol/openai.py for both the engine server and the gateway): each case is a 400 in OpenAI, with
`param` the client's field path; what OpenAI accepts still passes. No model, no server.

    .venv/bin/python -m pytest -q tests/serving/test_chat_fields.py
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from protocol.errors import ValidationProblem, describe_errors
from protocol.openai import ChatCompletionRequest
from serving.frontend.chat_tools import prepare_chat

USER = [{"role": "user", "content": "hi"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}


def _error(**fields) -> tuple[str, str | None]:
    with pytest.raises(ValidationError) as info:
        ChatCompletionRequest.model_validate({"model": "m", "messages": USER, **fields})
    return describe_errors(info.value.errors())


@pytest.mark.parametrize("fields, param", [
    ({"messages": [{"role": "user", "content": "hi", "bogus": 1}]}, "messages[0].bogus"),
    ({"tools": [{"type": "function", "function": {"name": "f", "foo": 1}}]}, "tools[0].function.foo"),
    ({"tools": [{"type": "function", "function": {"name": "f"}, "bar": 1}]}, "tools[0].bar"),
    ({"response_format": {"type": "json_object", "foo": 1}}, "response_format.foo"),
    ({"stream": True, "stream_options": {"foo": True}}, "stream_options.foo"),
    ({"messages": [*USER, {"role": "assistant", "tool_calls": [{**CALL, "extra": 1}]}]}, "messages[1].tool_calls[0].extra"),
    ({"messages": [{"role": "tool", "content": "x", "tool_call_id": "c", "refusal": "no"}]}, "messages[0].refusal"),
])
def test_unknown_nested_keys_are_400s_naming_their_path(fields, param):
    assert _error(**fields) == (f"Unrecognized request argument supplied: {param}", param)


@pytest.mark.parametrize("fields, param, words", [
    ({"tools": [{"type": "function", "function": {"name": "my func!"}}]}, "tools[0].function.name", "does not match pattern"),
    ({"tools": [{"type": "function", "function": {"name": "f" * 65}}]}, "tools[0].function.name", "string too long"),
    ({"tools": [{"function": {"name": "f"}}]}, "tools[0].type", "Missing required parameter"),
    ({"tools": [{"type": "web", "function": {"name": "f"}}]}, "tools[0].type", "Supported values are: 'function' and 'custom'"),
    ({"tools": []}, "tools", "empty array"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}},
     "response_format.json_schema.name", "Missing required parameter"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}}},
     "response_format.json_schema.name", "does not match pattern"),
    ({"response_format": {"type": "yaml"}}, "response_format.type", "Invalid value: 'yaml'"),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content[0].text", "Missing required"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, "messages[0].content[0].text", "expected a string"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "bogus"}]}]},
     "messages[0].content[1].type", "Invalid value: 'bogus'"),
    ({"messages": [{"role": "system", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content[0].type", "Supported values are: 'text'"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     "messages[0].content[0].image_url.url", "Missing required"),
    ({"messages": [*USER, {"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "f"}}]}]},
     "messages[1].tool_calls[0].function.arguments", "Missing required"),
    ({"messages": [*USER, {"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "f", "arguments": {}}}]}]},
     "messages[1].tool_calls[0].function.arguments", "expected a string"),
    ({"messages": [{"role": "user", "content": "hi", "name": 5}]}, "messages[0].name", "expected a string"),
    ({"tool_choice": "auto"}, "tool_choice", "'tool_choice' is only allowed when 'tools' are specified."),
    ({"tool_choice": "none"}, "tool_choice", "only allowed when 'tools' are specified"),
    ({"tool_choice": {"type": "function", "function": {"name": "get_weather"}}}, "tool_choice", "only allowed when 'tools'"),
    ({"parallel_tool_calls": False}, "parallel_tool_calls", "only allowed when 'tools' are specified"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", "'nope' not found"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", "Invalid value: 'sometimes'"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_weather", "x": 1}}},
     "tool_choice.function.x", "Unrecognized"),
    ({"max_tokens": 5, "max_completion_tokens": 6}, "max_tokens",
     "Setting 'max_tokens' and 'max_completion_tokens' at the same time is not supported."),
])
def test_malformed_nested_objects_are_400s_naming_their_path(fields, param, words):
    message, got = _error(**fields)
    assert got == param and words in message, message


def test_tool_choice_without_tools_is_openais_message():
    assert _error(tool_choice="required") == (
        "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.", "tool_choice")


@pytest.mark.parametrize("fields", [
    {"messages": [{"role": "user", "content": "hi", "name": "ann"}, {"role": "system", "content": "x", "name": "s"}]},
    {"messages": [*USER, {"role": "assistant", "content": "ok", "refusal": None, "audio": None, "function_call": None,
                          "tool_calls": None, "annotations": []}]},  # a response's message sent back as it came
    {"messages": [*USER, {"role": "assistant", "content": None, "tool_calls": [CALL]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "sunny", "name": "get_weather"}]},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                               {"type": "image_url", "image_url": {"url": "https://x/y.png", "detail": "low"}}]}]},
    {"messages": [*USER, {"role": "assistant", "content": [{"type": "refusal", "refusal": "I can't."}]}]},
    {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "parallel_tool_calls": False},
    {"tools": TOOLS, "tool_choice": "none"},
    {"tools": [{"type": "function", "function": {"name": "a-b_C9", "description": "d", "parameters": {}, "strict": True}}]},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "w-1", "schema": {"type": "object"}, "strict": True}}},
    {"response_format": {"type": "text"}},
    {"stream": True, "stream_options": {"include_usage": True}},
    {"max_completion_tokens": 6},
    {"tool_choice": None, "parallel_tool_calls": None},  # null is absent
])
def test_what_openai_accepts_still_passes(fields):
    request = ChatCompletionRequest.model_validate({"model": "m", "messages": USER, **fields})
    # every field sent with a value is kept; an explicit null stays absent
    assert all((getattr(request, k) is not None) == (v is not None) for k, v in fields.items())


def test_a_local_model_refuses_image_parts_naming_the_part():
    body = ChatCompletionRequest.model_validate({"model": "m", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": "x"}}]}]})
    with pytest.raises(ValidationProblem) as info:
        prepare_chat(body)
    assert info.value.param == "messages[0].content[1]" and "'image_url'" in info.value.message
