"""The tool-call harness format (serving/tools/harness.py): parsing hand-written outputs, rendering, the
streamed hold-back, and the standalone server with tools on the real SmolLM2-135M-Instruct.

    LINK_HOME=.link LINK_DATASETS_DIR=../shared/data .venv/bin/python -m pytest -q tests/serving/tools/test_harness.py
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from serving.frontend.chat_tools import ToolStream, tool_message
from serving.tools.harness import (
    ToolFormatError, parse_tool_calls, render_messages, render_tools_system_prompt, streamable_length,
)

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "Local time in a city.",
                                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
TOOLS = [WEATHER, TIME]


def _calls(parsed) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.tool_calls]


def test_single_call():
    parsed = parse_tool_calls('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', TOOLS)
    assert parsed.content is None and _calls(parsed) == [("get_weather", {"city": "Paris"})]
    call = parsed.tool_calls[0]
    assert call["type"] == "function" and call["id"].startswith("call_") and len(call["id"]) > 10
    assert isinstance(call["function"]["arguments"], str)


def test_parallel_calls_have_distinct_ids():
    text = ('<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>\n'
            '<tool_call>{"name": "get_time", "arguments": {"city": "Rome"}}</tool_call>')
    parsed = parse_tool_calls(text, TOOLS)
    assert _calls(parsed) == [("get_weather", {"city": "Paris"}), ("get_time", {"city": "Rome"})]
    assert parsed.content is None and len({c["id"] for c in parsed.tool_calls}) == 2


def test_text_around_calls_is_content():
    text = 'Let me check.\n<tool_call>{"name": "get_time", "arguments": {"city": "Oslo"}}</tool_call>\nOne moment.'
    parsed = parse_tool_calls(text, TOOLS)
    assert parsed.content == "Let me check.\nOne moment." and _calls(parsed) == [("get_time", {"city": "Oslo"})]


@pytest.mark.parametrize("text", [
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"</tool_call>',   # malformed JSON
    '<tool_call>{"arguments": {"city": "Paris"}}</tool_call>',                       # no name
    '<tool_call>{"name": "get_weather", "arguments": [1]}</tool_call>',              # arguments not an object
    '<tool_call>"get_weather"</tool_call>',                                          # unknown shape
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}',            # unclosed tag
    '<tool_call>{"name": "launch_rocket", "arguments": {}}</tool_call>',             # unknown tool
    "I don't know.",                                                                 # no call
    "",
])
def test_anything_else_stays_content_verbatim(text):
    parsed = parse_tool_calls(text, TOOLS)
    assert parsed.tool_calls == [] and parsed.content == text


def test_malformed_block_next_to_a_good_one_stays_content():
    text = '<tool_call>{oops}</tool_call> then <tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    parsed = parse_tool_calls(text, TOOLS)
    assert parsed.content == "<tool_call>{oops}</tool_call> then" and _calls(parsed) == [("get_time", {})]


def test_unknown_names_are_accepted_without_tools_and_variants_are_tolerated():
    assert _calls(parse_tool_calls('<tool_call>{"name": "x", "arguments": {}}</tool_call>')) == [("x", {})]
    nested = {"city": "Paris", "when": {"days": [1, 2], "exact": None}, "note": "é \"q\" </tool>"}
    variants = [
        '<tool_call>\n\n  {"name": "get_weather",\n "arguments": %s}  \n</tool_call>' % json.dumps(nested, indent=2),
        '<tool_call>{"name": "get_weather", "arguments": %s}</tool_call>' % json.dumps(json.dumps(nested)),  # JSON string
        '<tool_call>[{"name": "get_weather", "parameters": %s}]</tool_call>' % json.dumps(nested),  # a list, "parameters"
    ]
    for text in variants:
        assert _calls(parse_tool_calls(text, TOOLS)) == [("get_weather", nested)], text


def test_render_then_parse_round_trips():
    calls = [{"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris","unit":"C"}'}},
             {"id": "call_b", "type": "function", "function": {"name": "get_time", "arguments": '{"city": "Rome"}'}}]
    messages = [{"role": "user", "content": "Weather in Paris, time in Rome?"},
                {"role": "assistant", "content": None, "tool_calls": calls},
                {"role": "tool", "tool_call_id": "call_a", "content": "18 C"},
                {"role": "tool", "tool_call_id": "call_b", "content": "14:05"}]
    out = render_messages(messages, TOOLS)
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user"]
    assert all(set(m) == {"role", "content"} for m in out)
    parsed = parse_tool_calls(out[2]["content"], TOOLS)
    assert parsed.content is None
    assert _calls(parsed) == [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]
    assert 'name="get_weather" tool_call_id="call_a"' in out[3]["content"] and "14:05" in out[3]["content"]
    assert '"name": "get_time"' in out[0]["content"]


def test_system_prompt_merges_and_follows_tool_choice():
    out = render_messages([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}], TOOLS)
    assert out[0]["content"].startswith("Be brief.\n\n# Tools") and len(out) == 2
    assert "plain text" in render_tools_system_prompt(TOOLS, "auto")
    assert "must call at least one" in render_tools_system_prompt(TOOLS, "required")
    named = render_tools_system_prompt(TOOLS, {"type": "function", "function": {"name": "get_time"}})
    assert "must call the function get_time" in named
    assert "do not call" in render_tools_system_prompt(TOOLS, "none")
    assert "at most one" in render_tools_system_prompt(TOOLS, "auto", parallel_tool_calls=False)
    with pytest.raises(ToolFormatError, match="not in tools"):
        render_tools_system_prompt(TOOLS, {"type": "function", "function": {"name": "nope"}})
    with pytest.raises(ToolFormatError, match="tools\\[0\\]"):
        render_tools_system_prompt([{"type": "function"}])


@pytest.mark.parametrize("text", [
    "Sure, checking.\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>\nDone.",
    "<tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call>",
    "Plain answer with a < sign and <tool_c",
    "<tool_call>{broken}</tool_call> and text",
])
def test_streamed_pieces_reassemble_to_the_whole_message(text):
    stream, sent = ToolStream(TOOLS), 0
    content = ""
    for end in range(1, len(text)):  # the output grows one character at a time
        safe = min(end, stream.safe_length(text[:end], sent))
        content, sent = content + text[sent:safe], safe
    deltas, finish = stream.final_deltas(text, sent, "stop")
    content += "".join(d.get("content", "") for d in deltas)
    streamed_calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    message, whole_finish = tool_message(text, "stop", TOOLS)
    assert (content or None) == message["content"] and finish == whole_finish
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in streamed_calls] == \
        [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls", [])]
    assert streamable_length(text) <= len(text)


@pytest.mark.parametrize("tail", ["", "\n", "\n</", "\n</tool_call"])
def test_auto_a_whole_call_cut_inside_its_end_tag_by_max_tokens_is_a_call(tail):
    text = 'Checking.\n<tool_call>\n{"name": "get_time", "arguments": {"city": "Oslo"}}' + tail
    message, finish = tool_message(text, "length", TOOLS)
    assert message["content"] == "Checking." and finish == "length"
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]] == [("get_time", '{"city": "Oslo"}')]
    stream, sent = ToolStream(TOOLS), 0
    for end in range(1, len(text)):
        sent = min(end, stream.safe_length(text[:end], sent))
    deltas, streamed_finish = stream.final_deltas(text, sent, "length")
    assert text[:sent] + "".join(d.get("content", "") for d in deltas) == "Checking." and streamed_finish == "length"
    assert [d["tool_calls"][0]["function"]["arguments"] for d in deltas if "tool_calls" in d] == ['{"city": "Oslo"}']
    # Not cut by max_tokens (the model ended without closing), or cut inside the JSON: content, as before.
    assert tool_message(text, "stop", TOOLS)[0] == {"role": "assistant", "content": text}
    cut_json = text.split('"Oslo"')[0]
    assert tool_message(cut_json, "length", TOOLS) == ({"role": "assistant", "content": cut_json}, "length")


# ---------------------------------------------------------------------------------------------
# The real model behind the standalone server
# ---------------------------------------------------------------------------------------------

MODEL = "smollm2-135m-instruct"
ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]


@pytest.fixture(scope="module")
def base_url(server):  # the loopback engine server of tests/serving/conftest.py
    return server[0]


def _reassemble(chunks) -> tuple[str | None, list[tuple[str, str]], str]:
    content, calls, finish = "", {}, None
    for chunk in chunks:
        for choice in chunk.choices:
            delta = choice.delta
            content += delta.content or ""
            for tc in delta.tool_calls or []:
                entry = calls.setdefault(tc.index, {"name": "", "arguments": "", "id": tc.id})
                entry["name"] += tc.function.name or ""
                entry["arguments"] += tc.function.arguments or ""
            finish = choice.finish_reason or finish
    return content or None, [(c["name"], c["arguments"]) for _, c in sorted(calls.items())], finish


@pytest.mark.slow
# "auto": SmolLM2 answers in prose here, held back and streamed like any content (40 tokens show it as well as 80);
# "required": room for a whole forced call with its arguments (about 40 tokens).
@pytest.mark.parametrize("tool_choice, max_tokens", [("auto", 40), ("required", 80)])
def test_real_model_tool_calls_are_well_formed_whole_and_streamed(base_url, tool_choice, max_tokens):
    client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=300)
    kwargs = dict(model=MODEL, messages=ASK, tools=TOOLS, tool_choice=tool_choice, temperature=0.7, seed=3, max_tokens=max_tokens)
    whole = client.chat.completions.create(**kwargs)
    choice = whole.choices[0]
    calls = choice.message.tool_calls or []
    if calls:
        assert choice.finish_reason == "tool_calls"
        for call in calls:
            assert call.type == "function" and call.id.startswith("call_") and call.function.name in {"get_weather", "get_time"}
            assert isinstance(json.loads(call.function.arguments), dict)
    else:
        assert choice.finish_reason in ("stop", "length") and isinstance(choice.message.content, str)
    content, streamed_calls, finish = _reassemble(client.chat.completions.create(**kwargs, stream=True))
    assert content == choice.message.content and finish == choice.finish_reason
    assert streamed_calls == [(c.function.name, c.function.arguments) for c in calls]


@pytest.mark.slow
def test_bad_tool_requests_are_400s_naming_the_field(base_url):
    body = {"model": MODEL, "messages": ASK, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}
    r = httpx.post(base_url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"
    body = {"model": MODEL, "messages": ASK, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"d": {"type": "string", "format": "date"}}}}}}
    r = httpx.post(base_url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format" and "'format'" in r.json()["error"]["message"]


@pytest.mark.slow
def test_real_model_json_schema_over_http_whole_and_streamed(base_url):
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "sunny": {"type": "boolean"}},
              "required": ["city", "sunny"], "additionalProperties": False}
    client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=300)
    kwargs = dict(model=MODEL, messages=ASK, temperature=0, max_tokens=60,
                  response_format={"type": "json_schema", "json_schema": {"name": "weather", "schema": schema, "strict": True}})
    whole = client.chat.completions.create(**kwargs)
    text = whole.choices[0].message.content
    assert whole.choices[0].finish_reason == "stop", text
    value = json.loads(text)
    assert set(value) == {"city", "sunny"} and isinstance(value["sunny"], bool)
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(**kwargs, stream=True) if c.choices)
    assert streamed == text
