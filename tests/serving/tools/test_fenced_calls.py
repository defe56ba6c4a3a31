"""`fenced_calls="call"`: a reply that is only a Markdown code block holding a call, or only the call's JSON
without tags, is that call (Qwen2.5-Coder's unforced habits); anything else around or in the block leaves it
content, and streaming holds it back meanwhile."""

from __future__ import annotations

import dataclasses
import json

import pytest

from serving.tools.formats import DEFAULT_FORMAT, ToolFormatError
from serving.tools.harness import parse_tool_calls, streamable_length

FENCED = dataclasses.replace(DEFAULT_FORMAT, fenced_calls="call")
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]
REPLY = '```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Tokyo"\n  }\n}\n```'  # the 0.5B's, verbatim


def test_a_reply_that_is_one_fenced_call_is_that_call():
    parsed = parse_tool_calls(REPLY, TOOLS, fmt=FENCED)
    assert parsed.content is None and len(parsed.tool_calls) == 1
    fn = parsed.tool_calls[0]["function"]
    assert fn["name"] == "get_weather" and json.loads(fn["arguments"]) == {"city": "Tokyo"}
    assert parse_tool_calls("\n" + REPLY.replace("```json", "```") + "\n", TOOLS, fmt=FENCED).tool_calls


@pytest.mark.parametrize("text", [
    "Here it is:\n" + REPLY,                                   # text before the block
    REPLY + "\nDone.",                                         # text after it
    REPLY.replace("get_weather", "get_time"),                  # a function not offered
    '```json\n{"city": "Tokyo"}\n```',                         # JSON that is not a call
    '```python\nprint("hi")\n```',                             # code
])
def test_anything_else_stays_content(text):
    assert parse_tool_calls(text, TOOLS, fmt=FENCED).tool_calls == [] and parse_tool_calls(text, TOOLS, fmt=FENCED).content == text


BARE = '{"name": "get_weather", "arguments": {"city": "Tokyo"}}'  # the 0.5B's through the gateway, verbatim


def test_a_reply_that_is_only_a_bare_call_is_that_call():
    parsed = parse_tool_calls(" " + BARE + "\n", TOOLS, fmt=FENCED)
    assert parsed.content is None and len(parsed.tool_calls) == 1
    assert json.loads(parsed.tool_calls[0]["function"]["arguments"]) == {"city": "Tokyo"}
    for text in (BARE.replace("get_weather", "get_time"), '{"city": "Tokyo"}', BARE + " Done.", "Sure: " + BARE):
        parsed = parse_tool_calls(text, TOOLS, fmt=FENCED)
        assert parsed.tool_calls == [] and parsed.content == text
    assert parse_tool_calls(BARE, TOOLS).content == BARE  # the default format: content
    assert all(streamable_length(BARE[:k], FENCED) == 0 for k in range(1, len(BARE) + 1))


def test_the_default_format_leaves_the_block_as_content():
    assert parse_tool_calls(REPLY, TOOLS).content == REPLY and DEFAULT_FORMAT.fenced_calls == "content"
    assert streamable_length(REPLY[:19]) == 19  # streamed as it comes


def test_streaming_holds_a_block_until_it_is_known_to_be_content():
    assert all(streamable_length(REPLY[:k], FENCED) == 0 for k in range(len(REPLY) + 1))
    assert streamable_length(REPLY + "\nDone.", FENCED) == len(REPLY + "\nDone.")
    assert streamable_length("Sunny.", FENCED) == len("Sunny.")


def test_fenced_calls_is_checked():
    with pytest.raises(ToolFormatError, match="fenced_calls"):
        dataclasses.replace(DEFAULT_FORMAT, fenced_calls="yes")
