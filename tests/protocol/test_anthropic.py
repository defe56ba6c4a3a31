"""protocol/anthropic.py: Messages requests -> OpenAI chat requests, answers and chunks -> Messages objects and
events, and Anthropic's error objects; every expected value written out by hand from the two APIs' references."""

from __future__ import annotations

import json

import pytest

from protocol.anthropic import (MessagesProblem, MessageStream, error_object, parse_messages_request, to_chat_request,
                                to_message)


def chat_of(body: dict) -> dict:
    return to_chat_request(parse_messages_request({"model": "m", "max_tokens": 9, **body}))


def test_full_request_translation():
    chat = chat_of({
        "system": [{"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}}, {"type": "text", "text": "b"}],
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "text", "text": "let me look"},
                                              {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"x": 1}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "boom", "is_error": True},
                                         {"type": "text", "text": "and?"}]}],
        "tools": [{"name": "f", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "stop_sequences": ["END"], "temperature": 0.2, "top_p": 0.9, "top_k": 5, "metadata": {"user_id": "u"},
        "stream": True})
    assert chat == {
        "model": "m", "max_tokens": 9, "temperature": 0.2, "top_p": 0.9, "top_k": 5, "stop": ["END"], "user": "u",
        "stream": True, "stream_options": {"include_usage": True},
        "messages": [
            {"role": "system", "content": "a\n\nb"},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "let me look", "tool_calls": [
                {"id": "toolu_1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}]},
            {"role": "tool", "tool_call_id": "toolu_1", "content": "Error: boom"},
            {"role": "user", "content": "and?"}],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        "tool_choice": "required", "parallel_tool_calls": False}


@pytest.mark.parametrize("choice, expected", [
    ({"type": "auto"}, "auto"), ({"type": "none"}, "none"),
    ({"type": "tool", "name": "f"}, {"type": "function", "function": {"name": "f"}})])
def test_tool_choice(choice, expected):
    chat = chat_of({"messages": [{"role": "user", "content": "x"}], "tool_choice": choice,
                    "tools": [{"name": "f", "description": "d", "input_schema": {"type": "object"}}]})
    assert chat["tool_choice"] == expected and "parallel_tool_calls" not in chat


@pytest.mark.parametrize("body, message", [
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"name": "f", "input_schema": {"type": "array"}}]},
     "tools.0.custom.input_schema.type: Input should be 'object'"),
    ({"messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "any"}},
     "tool_choice.any: tool_choice needs `tools`"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]}]},
     "messages.0.content.0.tool_use: tool_use blocks belong in assistant messages"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/bmp",
                                                                             "data": "x"}}]}]},
     "messages.0.content.0.image.source.base64.media_type: Input should be 'image/jpeg', 'image/png', 'image/gif' or "
     "'image/webp'"),
    ({"messages": []}, "messages: List should have at least 1 item after validation, not 0"),
])
def test_refusals_name_the_field(body, message):
    with pytest.raises(MessagesProblem) as caught:
        chat_of(body)
    assert caught.value.message == message


def completion(message: dict, finish: str, **choice) -> dict:
    return {"id": "c1", "model": "m", "choices": [{"index": 0, "message": message, "finish_reason": finish, **choice}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}}


@pytest.mark.parametrize("finish, matched, reason, sequence", [
    ("stop", None, "end_turn", None), ("stop", "END", "stop_sequence", "END"), ("stop", "OTHER", "end_turn", None),
    ("length", None, "max_tokens", None), ("content_filter", None, "refusal", None)])
def test_whole_answer_and_stop_reasons(finish, matched, reason, sequence):
    message = to_message(completion({"role": "assistant", "content": "hi"}, finish, stop_reason=matched),
                         message_id="msg_1", stop_sequences=["END"])
    assert message == {"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
                       "content": [{"type": "text", "text": "hi"}], "stop_reason": reason, "stop_sequence": sequence,
                       "usage": {"input_tokens": 7, "output_tokens": 3}}


def test_whole_tool_call_answer():
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"city": "Paris"}'}}
    message = to_message(completion({"role": "assistant", "content": None, "tool_calls": [call]}, "tool_calls"),
                         message_id="msg_2", stop_sequences=None)
    assert message["content"] == [{"type": "tool_use", "id": "call_1", "name": "f", "input": {"city": "Paris"}}]
    assert message["stop_reason"] == "tool_use"
    bad = {**call, "function": {"name": "f", "arguments": "[1]"}}
    with pytest.raises(ValueError, match="not a JSON object"):
        to_message(completion({"role": "assistant", "tool_calls": [bad]}, "tool_calls"), message_id="m", stop_sequences=None)


def parsed(frames: list[bytes]) -> list[tuple[str, dict]]:
    out = []
    for data in frames:
        name, payload = data.decode().removesuffix("\n\n").split("\n")
        out.append((name.removeprefix("event: "), json.loads(payload.removeprefix("data: "))))
    return out


def test_stream_of_text_then_a_tool_call():
    stream = MessageStream("msg_3", "m", stop_sequences=None)
    chunks = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
              {"choices": [{"index": 0, "delta": {"content": "Hi"}}]},
              {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_9", "type": "function",
                                                                    "function": {"name": "f", "arguments": '{"a"'}}]}}]},
              {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": ': 1}'}}]}}]},
              {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
              {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 6}}]
    frames = [f for chunk in chunks for f in stream.feed(chunk)] + stream.finish()
    assert parsed(frames) == [
        ("message_start", {"type": "message_start", "message": {
            "id": "msg_3", "type": "message", "role": "assistant", "model": "m", "content": [], "stop_reason": None,
            "stop_sequence": None, "usage": {"input_tokens": 0, "output_tokens": 0}}}),
        ("ping", {"type": "ping"}),
        ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("content_block_start", {"type": "content_block_start", "index": 1, "content_block": {
            "type": "tool_use", "id": "call_9", "name": "f", "input": {}}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 1,
                                 "delta": {"type": "input_json_delta", "partial_json": '{"a"'}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 1,
                                 "delta": {"type": "input_json_delta", "partial_json": ': 1}'}}),
        ("content_block_stop", {"type": "content_block_stop", "index": 1}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                           "usage": {"input_tokens": 5, "output_tokens": 6}}),
        ("message_stop", {"type": "message_stop"})]


def test_stream_error_event():
    assert parsed(MessageStream("m", "m", stop_sequences=None).error(500, "backend died")) == [
        ("error", {"type": "error", "error": {"type": "api_error", "message": "backend died"}})]


@pytest.mark.parametrize("status, kind", [
    (400, "invalid_request_error"), (401, "authentication_error"), (403, "permission_error"), (404, "not_found_error"),
    (413, "request_too_large"), (422, "invalid_request_error"), (429, "rate_limit_error"), (500, "api_error"),
    (502, "api_error"), (504, "timeout_error"), (529, "overloaded_error")])
def test_error_types_by_status(status, kind):
    assert error_object(status, "why") == {"type": "error", "error": {"type": kind, "message": "why"}}
