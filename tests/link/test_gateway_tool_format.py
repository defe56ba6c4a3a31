"""A local model's `tool_format` in link.yaml (serving/tools/formats.py) through the real gateway on loopback and the
official `openai` client, on the real SmolLM2-135M-Instruct: one engine, two public names speaking two harnesses.

- "smollm2-xml" (`tool_format: xml`): the rendered prompt and the parsed reply are XML calls
  (`<function=get_weather>\\n<parameter=city>\\nParis\\n</parameter>\\n</function>`); greedy decoding after one
  earlier call in the same format (the model copies it; XML calls are not forced by constrained decoding).
- "smollm2-acme" (a dict: JSON calls in `<call>` tags, keys "function"/"args"): a named tool_choice is
  forced by constrained decoding in that format.

    LINK_HOME=.link .venv/bin/python -m pytest -q tests/link/test_gateway_tool_format.py
"""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.link.gateway_launch import MASTER_KEY, gateway_settings, start_gateway_thread

pytestmark = pytest.mark.slow

LOCAL = "smollm2-135m-instruct"
ACME = {"name": "acme", "call_open": "<call>", "call_close": "</call>", "name_key": "function", "arguments_key": "args"}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
# One earlier exchange in the conversation (a call, its result), then the question to answer with a call.
HISTORY = [{"role": "user", "content": "What is the weather in Rome?"},
           {"role": "assistant", "content": None, "tool_calls": [
               {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
           {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
           {"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def client(new_database_url, tmp_path_factory, smollm2):
    from link.config import parse_config

    config = parse_config({"models": [
        {"name": "smollm2-xml", "kind": "local", "local": LOCAL, "tool_format": "xml"},
        {"name": "smollm2-acme", "kind": "local", "local": LOCAL, "tool_format": ACME}]})
    settings = gateway_settings(new_database_url("sqlite"), tmp_path_factory.mktemp("home"))
    with start_gateway_thread(settings, config) as gateway:
        gateway.state.engine_pool.add_loaded(LOCAL, smollm2.loaded)  # the session's model, not a second load
        yield openai.OpenAI(base_url=gateway.base_url, api_key=MASTER_KEY, max_retries=0, timeout=600)


def _calls(message) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]


def test_xml_format_model_returns_openai_tool_calls_whole_and_streamed(client):
    request = dict(model="smollm2-xml", messages=HISTORY, tools=[WEATHER], temperature=0, max_tokens=40)
    whole = client.chat.completions.create(**request)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None, choice
    assert _calls(choice.message) == [("get_weather", {"city": "Paris"})]
    assert choice.message.tool_calls[0].id.startswith("call_") and choice.message.tool_calls[0].type == "function"
    chunks = list(client.chat.completions.create(**request, stream=True))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    streamed = [(tc.function.name, json.loads(tc.function.arguments)) for c in chunks if c.choices
                for tc in c.choices[0].delta.tool_calls or []]
    assert content == "" and streamed == _calls(choice.message)  # no XML markup leaks into the stream
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_custom_json_format_forces_a_named_call_in_its_own_tags(client):
    answer = client.chat.completions.create(
        model="smollm2-acme", messages=HISTORY[-1:], tools=[WEATHER], temperature=0, max_tokens=40,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None, choice
    (name, arguments), = _calls(choice.message)
    assert name == "get_weather"
    jsonschema.validate(arguments, WEATHER["function"]["parameters"])


def test_a_tool_the_xml_format_cannot_carry_is_a_400_naming_it(client):
    spaced = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city name": {"type": "string"}}}}}
    with pytest.raises(openai.BadRequestError, match=r"tools\[0\] \(get_weather\): the parameter name 'city name'") as info:
        client.chat.completions.create(model="smollm2-xml", messages=HISTORY[-1:], tools=[spaced], max_tokens=4)
    assert info.value.body["param"] == "tools"
    # The same tool is fine for the JSON-style deployment of the same engine.
    client.chat.completions.create(model="smollm2-acme", messages=HISTORY[-1:], tools=[spaced], max_tokens=4)
