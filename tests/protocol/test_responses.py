"""The Responses API wire format (protocol/responses.py, protocol/responses_stream.py): request -> chat request,
chat answer -> Response object, chat chunks -> Responses events; each case written out by hand, and the objects
read back with the official `openai` SDK's types."""

from __future__ import annotations

import json

import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter, ValidationError

from protocol.errors import describe_errors
from protocol.responses import ResponsesRequest, output_messages, to_chat, whole_response
from protocol.responses_stream import ResponseStream, event_frame


def request(**fields) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"model": "m", "input": "hi", **fields})


def test_to_chat_maps_every_supported_field():
    req = request(
        instructions="Be brief.", temperature=0.5, top_p=0.9, max_output_tokens=64, parallel_tool_calls=False,
        metadata={"k": "v"}, user="u", stream=True, reasoning={"effort": "low"},
        text={"format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}, "strict": True},
              "verbosity": "low"},
        tools=[{"type": "function", "name": "f", "description": "d", "parameters": {"type": "object"}, "strict": True}],
        tool_choice={"type": "function", "name": "f"},
        input=[{"role": "developer", "content": "dev"},
               {"role": "user", "content": [{"type": "input_text", "text": "look "},
                                            {"type": "input_image", "image_url": "https://x/y.png", "detail": "low"}]},
               {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
                "content": [{"type": "output_text", "text": "calling", "annotations": []}]},
               {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}", "id": "fc_1", "status": "completed"},
               {"type": "function_call", "call_id": "c2", "name": "f", "arguments": "{\"a\":1}"},
               {"type": "function_call_output", "call_id": "c1", "output": "one"},
               {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "two"}]}])
    assert to_chat(req, history=[{"role": "user", "content": "before"}]) == {
        "model": "m",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "before"},
            {"role": "developer", "content": "dev"},
            {"role": "user", "content": [{"type": "text", "text": "look "},
                                         {"type": "image_url", "image_url": {"url": "https://x/y.png", "detail": "low"}}]},
            {"role": "assistant", "content": "calling", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                {"id": "c2", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "one"},
            {"role": "tool", "tool_call_id": "c2", "content": "two"}],
        "temperature": 0.5, "top_p": 0.9, "parallel_tool_calls": False, "metadata": {"k": "v"}, "user": "u",
        "max_completion_tokens": 64,
        "tools": [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"},
                                                    "strict": True}}],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
        "response_format": {"type": "json_schema", "json_schema": {"name": "out", "schema": {"type": "object"}, "strict": True}},
        "verbosity": "low", "reasoning_effort": "low", "stream": True, "stream_options": {"include_usage": True}}


def test_json_object_and_text_formats():
    assert to_chat(request(text={"format": {"type": "json_object"}}))["response_format"] == {"type": "json_object"}
    assert "response_format" not in to_chat(request(text={"format": {"type": "text"}}))
    assert to_chat(request()) == {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("fields, param", [
    ({"tools": [{"type": "file_search", "vector_store_ids": []}]}, "tools[0].type"),
    ({"tools": [{"type": "function", "name": "f", "extra": 1}]}, "tools[0].extra"),
    ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice.type"),
    ({"tool_choice": "any"}, "tool_choice"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
    ({"input": [{"role": "assistant", "content": [{"type": "input_text", "text": "x"}]}]}, "input[0].content[0].type"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, "input[0].arguments"),
    ({"input": [{"type": "function_call_output", "call_id": 3, "output": "x"}]}, "input[0].call_id"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
    ({"text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format.name"),
    ({"text": {"format": {"type": "grammar"}}}, "text.format.type"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"truncation": "auto"}, "truncation"),
    ({"include": ["reasoning.encrypted_content"]}, "include"),
    ({"stream_options": {"include_obfuscation": False}}, "stream_options"),
    ({"top_p": 1.5}, "top_p"),
    ({"max_output_tokens": 15}, "max_output_tokens"),
])
def test_refusals_name_the_field(fields, param):
    with pytest.raises(ValidationError) as caught:
        request(**fields)
    assert describe_errors(caught.value.errors())[1] == param


def test_whole_response_with_text_and_calls_at_the_token_limit():
    req = request(max_output_tokens=16)
    chat = {"id": "x", "model": "m2", "choices": [{"index": 0, "finish_reason": "length", "message": {
        "role": "assistant", "content": "Let me check",
        "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"a\""}}]}}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 16, "total_tokens": 23}}
    response = whole_response(req, "resp_1", 1700000000, chat)
    message, call = response["output"]
    assert message == {"type": "message", "id": message["id"], "status": "incomplete", "role": "assistant",
                       "content": [{"type": "output_text", "text": "Let me check", "annotations": [], "logprobs": []}]}
    assert call == {"type": "function_call", "id": call["id"], "call_id": "call_1", "name": "f", "arguments": "{\"a\"",
                    "status": "incomplete"}
    assert message["id"].startswith("msg_") and call["id"].startswith("fc_")
    assert (response["status"], response["incomplete_details"], response["model"]) == \
        ("incomplete", {"reason": "max_output_tokens"}, "m2")
    assert response["usage"] == {"input_tokens": 7, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0}, "output_tokens": 16,
                                 "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 23}
    parsed = Response.model_validate(response)
    assert parsed.output_text == "Let me check" and parsed.max_output_tokens == 16
    assert output_messages(response["output"]) == [{"role": "assistant", "content": "Let me check", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"a\""}}]}]


def _chunk(delta: dict | None = None, finish: str | None = None, usage: dict | None = None) -> dict:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return {"id": "c", "object": "chat.completion.chunk", "model": "m", "choices": choices, "usage": usage}


def test_stream_of_text_then_a_call():
    stream = ResponseStream(request(), "resp_2", 1700000000, "m")
    events = stream.start()
    for chunk in [_chunk({"role": "assistant", "content": ""}), _chunk({"content": "Hel"}), _chunk({"content": "lo"}),
                  _chunk({"tool_calls": [{"index": 0, "id": "call_9", "type": "function",
                                          "function": {"name": "f", "arguments": ""}}]}),
                  _chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}), _chunk({}, "tool_calls"),
                  _chunk(usage={"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8})]:
        events += stream.add(chunk)
    events += stream.finish()
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.output_item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.done", "response.output_item.done",
        "response.completed"]
    assert [e["sequence_number"] for e in events] == list(range(14))
    assert (events[6]["text"], events[11]["arguments"], events[9]["output_index"]) == ("Hello", "{}", 1)
    final = events[-1]["response"]
    assert final["status"] == "completed" and final["usage"]["total_tokens"] == 8
    assert [i["type"] for i in final["output"]] == ["message", "function_call"]
    assert final["output"][0]["id"] == events[2]["item"]["id"] and final["output"][1]["call_id"] == "call_9"
    adapter = TypeAdapter(ResponseStreamEvent)
    assert [adapter.validate_python(e).type for e in events] == [e["type"] for e in events]
    assert event_frame(events[0]) == b"event: response.created\ndata: " + json.dumps(
        events[0], separators=(",", ":")).encode() + b"\n\n"


def test_failed_stream():
    stream = ResponseStream(request(), "resp_3", 1700000000, "m")
    events = [*stream.start(), *stream.add(_chunk({"content": "Hi"})), *stream.fail("server_error", "backend died")]
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["status"] == "failed"
    assert events[-1]["response"]["error"] == {"code": "server_error", "message": "backend died"}
