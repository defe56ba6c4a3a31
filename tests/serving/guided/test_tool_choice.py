"""Forced tool calls (`tool_choice` "required" or a named function) by constrained decoding: the structural
tag `serving.guided.tool_choice` builds, then the real SmolLM2 behind the engine server and the gateway's local
backend, whole and streamed.

    LINK_HOME=.link LINK_DATASETS_DIR=../shared/data .venv/bin/python -m pytest -q tests/serving/guided/test_tool_choice.py
"""

from __future__ import annotations

import asyncio
import json

import jsonschema
import openai
import pytest

from protocol.errors import ValidationProblem
from protocol.openai import ChatCompletionRequest
from serving.engine.llm_engine import EngineConfig
from serving.frontend.chat_tools import ToolStream, prepare_chat, tool_message
from serving.guided.automaton import automaton_for
from serving.guided.tool_choice import MAX_PARALLEL_CALLS, forced_tool_tag, forced_tools
from serving.tools.harness import ToolFormatError, parse_tool_calls, render_tool_call

WEATHER_PARAMS = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
                  "required": ["city", "unit"]}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city.",
                                            "parameters": WEATHER_PARAMS}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "Local time in a city.",
                                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                        "required": ["city"]}}}
TOOLS = [WEATHER, TIME]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def _accepts(tag: str, text: str) -> bool:
    auto = automaton_for(None, tag)
    state = auto.feed(auto.start(), text)
    return state is not None and auto.is_complete(state)


def test_a_named_call_is_exactly_the_harness_block_the_parser_reads():
    tag = forced_tool_tag(TOOLS, NAMED)
    spec = json.loads(tag)
    assert spec["max_blocks"] == 1 and len(spec["structures"]) == 1
    args = {"city": "Paris", "unit": "celsius"}
    text = render_tool_call("get_weather", args)  # what the harness renders for past calls
    assert text == '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>'
    assert _accepts(tag, text)
    calls = parse_tool_calls(text, TOOLS).tool_calls
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [("get_weather", args)]
    assert not _accepts(tag, render_tool_call("get_time", {"city": "Paris"}))  # the other tool
    assert not _accepts(tag, render_tool_call("get_weather", {"city": "Paris"}))  # "unit" is required
    assert not _accepts(tag, render_tool_call("get_weather", {**args, "unit": "kelvin"}))  # the enum
    assert not _accepts(tag, render_tool_call("get_weather", {**args, "day": 1}))  # closed: undeclared argument
    assert not _accepts(tag, "Sure. " + text) and not _accepts(tag, text + "\n" + text)


def test_required_offers_every_tool_and_parallel_calls_back_to_back():
    tag = forced_tool_tag(TOOLS, "required")
    assert [s["begin"].split('"')[3] for s in json.loads(tag)["structures"]] == ["get_weather", "get_time"]
    weather, time = render_tool_call("get_weather", {"city": "Oslo", "unit": "celsius"}), render_tool_call("get_time", {"city": "Oslo"})
    assert _accepts(tag, weather) and _accepts(tag, time) and _accepts(tag, time + weather)
    assert not _accepts(tag, time + "\n" + weather)  # no separator between blocks
    assert not _accepts(tag, time * (MAX_PARALLEL_CALLS + 1)) and _accepts(tag, time * MAX_PARALLEL_CALLS)
    single = forced_tool_tag(TOOLS, "required", parallel_tool_calls=False)
    assert _accepts(single, time) and not _accepts(single, time + weather)
    assert forced_tool_tag(TOOLS, "auto") is None and forced_tool_tag(TOOLS, "none") is None and forced_tool_tag(TOOLS, None) is None
    assert forced_tool_tag(None, "required") is None


def test_parameter_schemas_closed_loosened_or_refused():
    def only(parameters, strict=None):
        fn = {"name": "f", "parameters": parameters, **({"strict": strict} if strict is not None else {})}
        return forced_tool_tag([{"type": "function", "function": fn}], {"type": "function", "function": {"name": "f"}})

    open_schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": True}
    assert _accepts(only(open_schema), render_tool_call("f", {"a": 1, "b": 2}))  # said so: kept open
    assert not _accepts(only({"properties": {"a": {"type": "integer"}}}), render_tool_call("f", {"a": 1, "b": 2}))
    loose = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a", "b"]}  # "b" undeclared
    assert _accepts(only(loose), render_tool_call("f", {"a": 1, "b": 2}))
    assert _accepts(only(None), render_tool_call("f", {})) and not _accepts(only(None), '<tool_call>\n{"name": "f", "arguments": []}')
    assert not _accepts(only({"type": "string"}), render_tool_call("f", "x"))  # arguments are an object, always
    assert _accepts(only({"type": "string"}), render_tool_call("f", {"x": 1}))
    unsupported = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0}}}
    assert _accepts(only(unsupported), render_tool_call("f", {"a": -1, "z": [1]}))  # any object, as non-strict promises
    with pytest.raises(ToolFormatError, match="'minimum'"):
        only(unsupported, strict=True)
    body = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], tool_choice="required",
                                 tools=[{"type": "function", "function": {"name": "f", "parameters": unsupported, "strict": True}}])
    with pytest.raises(ValidationProblem) as info:
        prepare_chat(body)
    assert info.value.param == "tools"


def test_forced_arguments_are_compact_json():
    tag = forced_tool_tag(TOOLS, NAMED)
    head = '<tool_call>\n{"name": "get_weather", "arguments": '
    assert _accepts(tag, head + '{"city": "Paris", "unit": "celsius"}}\n</tool_call>')
    assert _accepts(tag, head + '{ "city" : "Paris" , "unit": "celsius" }}\n</tool_call>')  # one space anywhere
    assert not _accepts(tag, head + '{\n    "city": "Paris", "unit": "celsius"}}\n</tool_call>')  # no pretty-printing
    assert not _accepts(tag, head + '{"city":  "Paris", "unit": "celsius"}}\n</tool_call>')  # no runs of spaces
    assert automaton_for(None, json.dumps({"structures": json.loads(tag)["structures"]})).feed(
        automaton_for(None, tag).start(), head + '{\n  "city"') is not None  # the default "any" is unchanged


CUT = [  # (output cut by max_tokens, the call it still is)
    ('<tool_call>\n{"name": "get_weather", "arguments": {\n    "city": "Paris",\n    "unit": "c',
     ("get_weather", '{\n    "city": "Paris",\n    "unit": "c')),  # inside the arguments: as produced
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</',
     ("get_weather", '{"city": "Paris", "unit": "celsius"}')),  # only the end tag cut: a whole call
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}',
     ("get_weather", '{"city": "Paris", "unit": "celsius"}')),
    ('<tool_call>\n{"name": "get_ti', ("get_time", "")),  # inside the name, which only one tool starts with
]


@pytest.mark.parametrize("text, call, choice", [(text, call, choice) for text, call in CUT for choice in ("required", NAMED)
                                                 if choice == "required" or call[0] == "get_weather"])
def test_a_forced_call_cut_by_max_tokens_is_still_a_tool_call(text, call, choice):
    tools = forced_tools(TOOLS, choice)
    message, finish = tool_message(text, "length", tools, forced=True)
    assert message["content"] is None and finish == "length", message
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]] == [call]
    stream = ToolStream(tools, forced=True)
    assert all(stream.safe_length(text[:end], 0) == 0 for end in range(len(text)))  # no markup streamed as content
    deltas, streamed_finish = stream.final_deltas(text, 0, "length")
    assert not any(d.get("content") for d in deltas) and streamed_finish == "length"
    assert [(d["tool_calls"][0]["function"]["name"], d["tool_calls"][0]["function"]["arguments"])
            for d in deltas if "tool_calls" in d] == [call]


def test_a_forced_output_after_whole_calls_keeps_them_and_never_leaks_markup():
    whole = render_tool_call("get_time", {"city": "Oslo"})
    message, finish = tool_message(whole + '<tool_call>\n{"name": "get_weather", "arguments": {"ci', "length", TOOLS, forced=True)
    assert message["content"] is None and finish == "length"
    assert [c["function"]["arguments"] for c in message["tool_calls"]] == ['{"city": "Oslo"}', '{"ci']
    message, finish = tool_message('<tool_call>\n{"name": "get_', "length", TOOLS, forced=True)  # either tool may follow
    assert message == {"role": "assistant", "content": None} and finish == "length"
    message, finish = tool_message(whole[:-3], "stop", TOOLS, forced=True)  # a stop string cut the end tag
    assert finish == "tool_calls" and message["content"] is None and len(message["tool_calls"]) == 1


# ---------------------------------------------------------------------------------------------
# The real SmolLM2: engine server and gateway local backend, whole and streamed
# ---------------------------------------------------------------------------------------------

MODEL = "smollm2-135m-instruct"
ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]


def _streamed(chunks) -> tuple[str | None, list[tuple[str, str]], str | None]:
    """(content, [(name, arguments)], finish_reason) reassembled from chunk dicts."""
    content, calls, finish = "", {}, None
    for chunk in chunks:
        for choice in chunk["choices"]:
            delta = choice["delta"]
            content += delta.get("content") or ""
            for tc in delta.get("tool_calls") or []:
                entry = calls.setdefault(tc["index"], ["", ""])
                entry[0] += tc["function"].get("name") or ""
                entry[1] += tc["function"].get("arguments") or ""
            finish = choice["finish_reason"] or finish
    return content or None, [tuple(v) for _, v in sorted(calls.items())], finish


def _check_whole(whole: dict, names: set[str]) -> list[tuple[str, str]]:
    choice = whole["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None, choice
    calls = choice["message"]["tool_calls"]
    assert calls and all(c["type"] == "function" and c["id"].startswith("call_") and c["function"]["name"] in names for c in calls)
    for call in calls:
        params = {"get_weather": WEATHER_PARAMS, "get_time": TIME["function"]["parameters"]}[call["function"]["name"]]
        jsonschema.validate(json.loads(call["function"]["arguments"]), params)
    return [(c["function"]["name"], c["function"]["arguments"]) for c in calls]


@pytest.mark.slow
@pytest.mark.parametrize("tool_choice, names, temperature", [
    (NAMED, {"get_weather"}, 0.0), (NAMED, {"get_weather"}, 0.9), ("required", {"get_weather", "get_time"}, 0.0),
])
def test_real_model_forced_calls_over_the_engine_server(server, tool_choice, names, temperature):
    client = openai.OpenAI(base_url=server[0] + "/v1", api_key="unused", max_retries=0, timeout=300)
    kwargs = dict(model=MODEL, messages=ASK, tools=TOOLS, tool_choice=tool_choice, temperature=temperature, seed=5, max_tokens=80)
    whole = client.chat.completions.create(**kwargs).model_dump()
    calls = _check_whole(whole, names)
    streamed = [c.model_dump() for c in client.chat.completions.create(**kwargs, stream=True)]
    assert _streamed(streamed) == (None, calls, "tool_calls")


@pytest.mark.slow
@pytest.mark.parametrize("tool_choice, max_tokens", [("required", 24), ("required", 32), (NAMED, 28)])
def test_real_model_forced_call_cut_by_max_tokens_is_still_a_tool_call(server, tool_choice, max_tokens):
    client = openai.OpenAI(base_url=server[0] + "/v1", api_key="unused", max_retries=0, timeout=300)
    kwargs = dict(model=MODEL, messages=ASK, tools=TOOLS, tool_choice=tool_choice, temperature=0, max_tokens=max_tokens)
    whole = client.chat.completions.create(**kwargs).model_dump()
    choice = whole["choices"][0]
    assert choice["finish_reason"] == "length" and choice["message"]["content"] is None, choice
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in choice["message"]["tool_calls"]]
    assert len(calls) == 1 and calls[0][0] in {"get_weather", "get_time"} and "tool_call>" not in json.dumps(whole)
    assert "\n" not in calls[0][1]  # compact arguments
    streamed = [c.model_dump() for c in client.chat.completions.create(**kwargs, stream=True)]
    assert _streamed(streamed) == (None, calls, "length")


@pytest.mark.slow
def test_real_model_forced_calls_through_the_gateway_local_backend(smollm2):
    from link.backends.local import EnginePool, LocalBackend
    from link.config import ModelDeployment

    deployment = ModelDeployment(name=MODEL, kind="local", local=MODEL)
    body = {"model": MODEL, "messages": ASK, "tools": TOOLS, "temperature": 0, "max_tokens": 80}

    async def go():
        # No stored kernel winners warmed up again for this engine: the session's are in effect process-wide.
        pool = EnginePool(engine_config=EngineConfig(tuned_kernels=False))
        pool.add_loaded(MODEL, smollm2.loaded)
        backend = LocalBackend(deployment, pool)
        try:
            answers = []
            for choice in (NAMED, "required"):
                whole = await backend.complete("chat", {**body, "tool_choice": choice})
                chunks = [c async for c in backend.stream("chat", {**body, "tool_choice": choice, "stream": True})]
                answers.append((whole, chunks))
            return answers
        finally:
            await pool.aclose()

    (named_whole, named_chunks), (required_whole, required_chunks) = asyncio.run(go())
    calls = _check_whole(named_whole, {"get_weather"})
    assert _streamed(named_chunks) == (None, calls, "tool_calls")
    calls = _check_whole(required_whole, {"get_weather", "get_time"})
    assert _streamed(required_chunks) == (None, calls, "tool_calls")
