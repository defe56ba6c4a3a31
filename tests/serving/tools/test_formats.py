"""Configurable tool-call harness formats (serving/tools/formats.py, serving/tools/styles.py): for every built-in
and a custom format, parse(render(calls)) == calls on generated calls; hand-checked XML renderings; refusals
of what a format cannot carry; the streamed hold-back; config errors; the serving-side wiring.

    LINK_HOME=.link .venv/bin/python -m pytest -q tests/serving/tools/test_formats.py
"""

from __future__ import annotations

import json
import random

import pytest

from protocol.errors import ValidationProblem
from protocol.openai import ChatCompletionRequest
from serving.frontend.chat_tools import ToolStream, prepare_chat, tool_message
from serving.guided.tool_choice import forced_tool_tag, parse_forced_calls
from serving.tools.formats import (
    DEFAULT_FORMAT, FORMATS, XML_FORMAT, XML_WRAPPED_FORMAT, ToolCallFormat, register_format, tool_format_from_config,
)
from serving.tools.harness import ToolFormatError, parse_tool_calls, render_messages, render_tools_system_prompt

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                                   "unit": {"enum": ["C", "F"]}, "hours": {"type": "array"}},
                   "required": ["city"]}}}
ACME = tool_format_from_config({"name": "acme", "call_open": "<call>", "call_close": "</call>", "name_key": "function",
                                "arguments_key": "args"})
SCALAR_XML = tool_format_from_config({"base": "xml-wrapped", "name": "plain-xml", "nested_values": "refuse"})
ALL_FORMATS = [DEFAULT_FORMAT, XML_FORMAT, XML_WRAPPED_FORMAT, ACME, SCALAR_XML]

# Strings that trip naive writers/readers: JSON look-alikes, edge whitespace, markup that is not a format tag.
TRICKY = ["", "Paris", "42", "-1.5", "true", "null", '"quoted"', '{"a": 1}', "[1, 2]", " spaced ", "\nlead", "trail\n",
          "two\nlines", "\n", "tab\there", "é ü 中文", "<b>bold</b>", "a=b", "x > y", "{tools}", "São Paulo"]
TYPES = ["string", "integer", "number", "boolean", "enum", "object", "array", "untyped"]


def _schema(kind: str) -> dict:
    if kind == "enum":
        return {"enum": ["C", "F", "42"]}
    return {"description": "anything"} if kind == "untyped" else {"type": kind}


def _value(rng: random.Random, kind: str, depth: int = 0):
    if kind == "string":
        return rng.choice(TRICKY)
    if kind == "integer":
        return rng.randint(-10**6, 10**6)
    if kind == "number":
        return rng.choice([rng.randint(-50, 50), round(rng.uniform(-1e3, 1e3), rng.randint(0, 6)), 1e-7, 0.1])
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "enum":
        return rng.choice(["C", "F", "42"])
    if kind == "object":
        return {f"k{i}": _value(rng, rng.choice(["string", "integer", "array"] if depth < 2 else ["string"]), depth + 1)
                for i in range(rng.randint(0, 3))}
    if kind == "array":
        return [_value(rng, rng.choice(["string", "number", "object"] if depth < 2 else ["string"]), depth + 1)
                for _ in range(rng.randint(0, 3))]
    return _value(rng, rng.choice(["string", "integer", "number", "boolean", "object", "array"]), depth) \
        if rng.random() < 0.9 else None


def _tools_and_calls(rng: random.Random, scalars_only: bool):
    kinds = [k for k in TYPES if not scalars_only or k in ("string", "integer", "number", "boolean", "enum")]
    tools, params = [], {}
    for t in range(rng.randint(1, 3)):
        name = f"tool_{t}" + rng.choice(["", ".v2", "-x", "Ünï"])
        props = {f"p{i}_{k}": _schema(k) for i, k in enumerate(rng.sample(kinds, rng.randint(0, len(kinds))))}
        params[name] = props
        tools.append({"type": "function", "function": {"name": name, "description": rng.choice(TRICKY),
                                                       "parameters": {"type": "object", "properties": props}}})
    calls = []
    for c in range(rng.randint(1, 3)):
        name = rng.choice(sorted(params))
        args = {p: _value(rng, p.split("_", 1)[1]) for p in params[name] if rng.random() < 0.7}
        calls.append({"id": f"call_{c}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}})
    return tools, calls


def _canonical(calls) -> list[tuple[str, str]]:
    """(name, arguments) with arguments as sorted JSON, so 1 and 1.0 and True stay distinct."""
    return [(c["function"]["name"], json.dumps(json.loads(c["function"]["arguments"]), sort_keys=True)) for c in calls]


@pytest.mark.parametrize("fmt", ALL_FORMATS, ids=lambda f: f.name)
def test_parse_of_render_is_the_calls_for_generated_calls(fmt):
    rng = random.Random(f"round-trip-{fmt.name}")
    for _ in range(300):
        tools, calls = _tools_and_calls(rng, scalars_only=fmt.nested_values == "refuse")
        content = rng.choice([None, "", "Let me check.", "Sure {tools}: two\nlines.", "  indented"])
        history = [{"role": "user", "content": "q"}, {"role": "assistant", "content": content, "tool_calls": calls}]
        rendered = render_messages(history, tools, fmt=fmt, strict=True)
        assert rendered[0]["role"] == "system" and all(t["function"]["name"] in rendered[0]["content"] for t in tools)
        text = rendered[-1]["content"]
        parsed = parse_tool_calls(text, tools, fmt=fmt)
        assert _canonical(parsed.tool_calls) == _canonical(calls), text
        assert parsed.content == ((content or "").rstrip() or None)
        # Streamed: what is sent before the end is always a prefix of the whole message's content.
        stream, sent = ToolStream(tools, fmt=fmt), 0
        for i in range(1, len(text) + 1):
            sent = stream.safe_length(text[:i], sent)
            assert text[:sent] == (parsed.content or "")[:sent]
        deltas, finish = stream.final_deltas(text, sent, "stop")
        whole, whole_finish = tool_message(text, "stop", tools, fmt=fmt)
        assert text[:sent] + "".join(d.get("content", "") for d in deltas) == (whole["content"] or "")
        assert finish == whole_finish == "tool_calls"


def test_xml_renders_as_written_by_hand():
    history = [{"role": "user", "content": "Weather in Paris for 3 days?"},
               {"role": "assistant", "content": "Checking.", "tool_calls": [{"id": "c1", "type": "function", "function": {
                   "name": "get_weather", "arguments": '{"city": "Paris", "days": 3, "unit": "C", "hours": [9, 18]}'}}]},
               {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    out = render_messages(history, [WEATHER], "required", fmt=XML_FORMAT)
    assert out[2] == {"role": "assistant", "content": "Checking.\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
                      "<parameter=days>\n3\n</parameter>\n<parameter=unit>\nC\n</parameter>\n<parameter=hours>\n[9, 18]\n"
                      "</parameter>\n</function>"}
    assert out[3] == {"role": "user", "content": '<tool_response name="get_weather" tool_call_id="c1">\nsunny\n</tool_response>'}
    system = out[0]["content"]
    assert system.startswith("# Tools\n\nYou can call these functions. Each line in <tools></tools> describes one:\n<tools>\n"
                             + json.dumps(WEATHER["function"]) + "\n</tools>\n\nTo call a function, write a function block with "
                             "its name and one parameter element per argument:\n<function=FUNCTION_NAME>\n")
    assert system.endswith("Results come back in <tool_response></tool_response> blocks.\n"
                           "In this reply you must call at least one function; write only function blocks.")
    wrapped = render_messages(history[1:2], [WEATHER], fmt=XML_WRAPPED_FORMAT)[-1]["content"]
    assert wrapped.startswith("Checking.\n<tool_call>\n<function=get_weather>\n") and wrapped.endswith("</function>\n</tool_call>")


def test_json_custom_tags_and_keys_render_and_force():
    assert ACME.render_call("get_weather", '{"city": "Paris"}') == '<call>\n{"function": "get_weather", "args": {"city": "Paris"}}\n</call>'
    assert '<call>\n{"function": "<function name>", "args": {<argument name>: <value>, ...}}\n</call>' in \
        render_tools_system_prompt([WEATHER], fmt=ACME)
    tag = json.loads(forced_tool_tag([WEATHER], "required", True, ACME))
    assert tag["structures"][0]["begin"] == '<call>\n{"function": "get_weather", "args": ' and tag["structures"][0]["end"] == "}\n</call>"
    cut = '<call>\n{"function": "get_weather", "args": {"city": "Pa'
    assert _canonical(parse_forced_calls(cut + 'ris"}}\n</ca', [WEATHER], ACME).tool_calls) == [("get_weather", '{"city": "Paris"}')]
    assert parse_forced_calls(cut, [WEATHER], ACME).tool_calls[0]["function"]["arguments"] == '{"city": "Pa'


@pytest.mark.parametrize("fmt, text", [
    (XML_FORMAT, "<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</func"),
    (XML_WRAPPED_FORMAT, "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_"),
])
def test_xml_call_cut_inside_its_close_tag_is_a_call_only_when_cut(fmt, text):
    assert _canonical(parse_tool_calls(text, [WEATHER], cut=True, fmt=fmt).tool_calls) == [("get_weather", '{"city": "Paris"}')]
    assert parse_tool_calls(text, [WEATHER], fmt=fmt).tool_calls == []
    message, finish = tool_message(text, "length", [WEATHER], fmt=fmt)
    assert finish == "length" and message["content"] is None and len(message["tool_calls"]) == 1


@pytest.mark.parametrize("text", [
    "<function=get_time>\n<parameter=city>\nParis\n</parameter>\n</function>",     # a function not offered
    "<function=get_weather>\n<parameter=city>\nParis\n</function>",                # parameter never closed
    "<function=get_weather>\ncity: Paris\n</function>",                            # not a parameter element
    "<function=get_weather >\n</function>",                                         # a space in the name tag
])
def test_malformed_xml_stays_content_verbatim(text):
    assert parse_tool_calls(text, [WEATHER], fmt=XML_FORMAT).content == text


def test_xml_values_are_typed_by_the_schema():
    text = ("<function=get_weather>\n<parameter=city>\n42\n</parameter>\n<parameter=days>\n42\n</parameter>\n"
            "<parameter=other>\n42\n</parameter>\n<parameter=hours>\nnot json\n</parameter>\n</function>")
    (call,) = parse_tool_calls(text, [WEATHER], fmt=XML_FORMAT).tool_calls
    # string param: text; integer: JSON; undeclared: JSON when it reads as JSON; unparsable JSON-typed: kept as text.
    assert json.loads(call["function"]["arguments"]) == {"city": "42", "days": 42, "other": 42, "hours": "not json"}


def test_check_tools_refuses_what_the_format_cannot_carry():
    spaced = {"type": "function", "function": {"name": "get weather", "parameters": {}}}
    with pytest.raises(ToolFormatError, match=r"tools\[0\].*'get weather'.*rename"):
        XML_FORMAT.check_tools([spaced])
    bad_param = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a<b": {"type": "string"}}}}}
    with pytest.raises(ToolFormatError, match=r"tools\[1\] \(f\): the parameter name 'a<b'"):
        XML_FORMAT.check_tools([WEATHER, bad_param])
    with pytest.raises(ToolFormatError, match=r"tools\[0\] \(get_weather\): parameter 'hours' has type array.*nested_values"):
        SCALAR_XML.check_tools([WEATHER])
    for fmt in (DEFAULT_FORMAT, ACME):
        fmt.check_tools([spaced, bad_param, WEATHER])  # JSON carries any name and schema
    with pytest.raises(ToolFormatError, match=r"tools\[0\] must be"):
        DEFAULT_FORMAT.check_tools([{"type": "function", "function": {}}])


@pytest.mark.parametrize("fmt, arguments, problem", [
    (XML_FORMAT, {"city": "a</parameter>b"}, "tag"),          # a value holding the format's close tag
    (DEFAULT_FORMAT, {"city": "a</tool_call>b"}, "tag"),
    (XML_FORMAT, {"city": 7}, "type"),                         # a number where the schema says string
])
def test_strict_rendering_refuses_a_trace_that_would_not_parse_back(fmt, arguments, problem):
    calls = [{"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps(arguments)}}]
    history = [{"role": "user", "content": "q"}, {"role": "assistant", "content": None, "tool_calls": calls}]
    render_messages(history, [WEATHER], fmt=fmt)  # serving renders what it is given
    with pytest.raises(ToolFormatError, match=r"messages\[1\]\.tool_calls\[0\] \(get_weather.*does not survive"):
        render_messages(history, [WEATHER], fmt=fmt, strict=True)


def test_config_builds_validates_and_registers():
    assert tool_format_from_config(None) is DEFAULT_FORMAT and tool_format_from_config("default") is FORMATS["json"]
    custom = tool_format_from_config({"base": "xml", "call_open": "<invoke>", "call_close": "</invoke>"})
    assert custom.style == "xml" and custom.name == "custom" and custom.block == "invoke"
    assert tool_format_from_config({"style": "xml"}).system_template == XML_FORMAT.system_template
    for config, message in [
        ("yaml", r"unknown tool format 'yaml'; registered: default, json, .*xml"),
        ({"callopen": "<x>"}, r"unknown key\(s\) callopen; allowed: base, name, style, call_open"),
        ({"style": "yaml"}, r"unknown `style` 'yaml'; use one of json, xml"),
        ({"base": "xml", "call_open": "<x>"}, r"`call_open` and `call_close` must both be set or both be empty"),
        ({"call_open": "", "call_close": ""}, r"style json needs block tags"),
        ({"system_template": "Tools: {tool}"}, r"unknown placeholder\(s\) \{tool\}; allowed: \{tools\}"),
        ({"system_template": "no tools here"}, r"`system_template` must contain \{tools\}"),
        ({"response_template": "{name}"}, r"`response_template` must contain \{content\}"),
        ({"nested_values": "drop"}, r"`nested_values` must be 'json'"),
        ({"name_key": "x", "arguments_key": "x"}, r"two different non-empty keys"),
        ({"base": "nope"}, r"unknown tool format 'nope'"),
        (7, r"a registered name or a dict"),
    ]:
        with pytest.raises(ToolFormatError, match=message):
            tool_format_from_config(config)
    mine = register_format(ToolCallFormat(name="test-mine", call_open="[CALL]", call_close="[/CALL]"))
    try:
        assert tool_format_from_config("test-mine") is mine
    finally:
        FORMATS.pop("test-mine")


def test_serving_prepares_an_xml_request():
    body = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER],
                                                 "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})
    setup = prepare_chat(body, XML_FORMAT)
    # Not enforceable by constrained decoding: a prompt instruction, parsed like "auto" over the forced tool.
    assert setup.structural_tag is None and not setup.forced and setup.tool_format is XML_FORMAT
    assert setup.tools == [WEATHER] and "you must call the function get_weather; write only its function block" in setup.messages[0]["content"]
    assert prepare_chat(body).structural_tag is not None  # the default format forces by decoding
    spaced = {"type": "function", "function": {"name": "get weather", "parameters": {}}}
    with pytest.raises(ValidationProblem, match="'get weather' cannot be written") as info:
        prepare_chat(body.model_copy(update={"tools": [spaced], "tool_choice": "auto"}), XML_FORMAT)
    assert info.value.param == "tools"


def test_link_yaml_tool_format_is_checked_at_load():
    from link.config import ConfigError, ModelDeployment, parse_config

    entry = {"name": "m", "kind": "local", "local": "smollm2-135m-instruct"}
    assert ModelDeployment(**entry).harness_format is DEFAULT_FORMAT
    assert ModelDeployment(**entry, tool_format="xml").harness_format is XML_FORMAT
    assert ModelDeployment(**entry, tool_format={"base": "json", "call_open": "<c>", "call_close": "</c>"}).harness_format.call_open == "<c>"
    with pytest.raises(ConfigError, match=r"unknown tool format 'xlm'; registered: "):
        parse_config({"models": [{**entry, "tool_format": "xlm"}]})
    with pytest.raises(ConfigError, match=r"`tool_format` applies only to kind 'local'"):
        parse_config({"models": [{"name": "r", "kind": "openai", "api_base": "http://127.0.0.1:1/v1", "tool_format": "xml"}]})
