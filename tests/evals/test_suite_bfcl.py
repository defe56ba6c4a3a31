"""The BFCL suite: loading, OpenAI tool conversion, grading OpenAI tool_calls and prompt-mode text."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from evals.base import Answer, make_suite
from evals.bfcl_schema import convert_schema, decode_tool_calls, openai_name, parse_python_calls, to_openai_tools
from evals.targets import Completion

SKIP = {("parallel_multiple_12", "permeability"), ("parallel_multiple_26", "type"), ("simple_python_307", "venue")}


class ToolCallTarget:
    """Answers every request with one canned Completion (tool calls included) and records the requests."""

    name = "fake"

    def __init__(self, completion: Completion):
        self.completion, self.requests = completion, []

    async def chat(self, messages, **params):
        self.requests.append(("chat", messages, params))
        return self.completion

    async def complete(self, prompt, **params):
        self.requests.append(("completion", prompt, params))
        return self.completion


def tool_call(name, arguments):
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": "call_1", "type": "function", "function": {"name": name, "arguments": raw}}


def grade(suite, item, completion):
    return asyncio.run(suite.grade(item, Answer([completion])))


def has_value(options):
    """Whether accepted values hold more than BFCL's "may be omitted" marker ""."""
    return any(o != "" or not isinstance(o, str) for o in options)


def first(options):
    """The first accepted value other than "", rendered (accepted dicts become plain dicts)."""
    value = next((o for o in options if o != "" or not isinstance(o, str)), None)
    if isinstance(value, dict):
        return {k: first(v) for k, v in value.items() if has_value(v)}
    if isinstance(value, list):
        return [first([v]) for v in value]
    return value


@pytest.fixture(scope="module")
def items(data_dir):
    return make_suite("bfcl", data_dir).load("test")


def test_load(items):
    counts = {}
    for item in items:
        counts[item.metadata["category"]] = counts.get(item.metadata["category"], 0) + 1
    assert counts == {"simple": 400, "multiple": 200, "parallel": 200, "parallel_multiple": 200, "irrelevance": 240}
    assert items[0].id == "bfcl/test/simple_python_0"
    assert items[0].prompt == "Find the area of a triangle with a base of 10 units and height of 5 units."
    assert items[0].reference == [{"calculate_triangle_area": {"base": [10], "height": [5], "unit": ["units", ""]}}]
    assert all(i.reference == [] for i in items if i.metadata["category"] == "irrelevance")


def test_tools_are_valid_openai_tools(items):
    bfcl_only = re.compile(r'"type": "(dict|float|tuple|any)"|"optional": ')
    for item in items:
        tools, names = to_openai_tools(item.metadata["functions"])
        for tool in tools:
            assert re.fullmatch(r"[A-Za-z0-9_-]{1,64}", tool["function"]["name"])
            assert tool["function"]["parameters"]["type"] == "object"
            assert not bfcl_only.search(json.dumps(tool["function"]["parameters"]))
        assert sorted(names.values()) == sorted(f["name"] for f in item.metadata["functions"])


def test_schema_conversion():
    schema = {"type": "dict", "properties": {
        "type": {"type": "string", "optional": True}, "x": {"type": "float"},
        "pair": {"type": "tuple", "items": {"type": "float"}}, "v": {"type": "any", "description": "anything"},
        "m": {"type": "dict", "properties": {"k": {"type": "integer"}}}},
        "required": ["x"]}
    assert convert_schema(schema) == {"type": "object", "properties": {
        "type": {"type": "string"}, "x": {"type": "number"}, "pair": {"type": "array", "items": {"type": "number"}},
        "v": {"description": "anything"}, "m": {"type": "object", "properties": {"k": {"type": "integer"}}}},
        "required": ["x"]}
    assert openai_name("math.factorial") == "math_factorial"
    with pytest.raises(ValueError, match="both become"):
        to_openai_tools([{"name": "a.b"}, {"name": "a_b"}])


def test_every_ground_truth_as_openai_tool_calls_scores_one(data_dir, items):
    suite = make_suite("bfcl", data_dir)
    failed = []
    for item in items:
        bfcl_id = item.id.rsplit("/", 1)[1]
        calls = [tool_call(openai_name(name), {k: first(v) for k, v in args.items()
                                               if (bfcl_id, k) not in SKIP and has_value(v)})
                 for (name, args), in (c.items() for c in item.reference)]
        g = grade(suite, item, Completion("", tool_calls=calls or None, finish_reason="tool_calls"))
        if g.score != 1.0:
            failed.append((item.id, g.details["reason"]))
    assert failed == []


def test_chat_request_and_grading(data_dir, items):
    suite = make_suite("bfcl", data_dir)
    item = next(i for i in items if i.id == "bfcl/test/simple_python_1")  # math.factorial(number=5)
    target = ToolCallTarget(Completion("", tool_calls=[tool_call("math_factorial", {"number": 5})]))
    answer = asyncio.run(suite.answer(item, target))
    kind, messages, params = target.requests[0]
    assert kind == "chat" and messages == [{"role": "user", "content": item.prompt}]
    assert params["tool_choice"] == "auto" and params["tools"][0]["function"]["name"] == "math_factorial"
    good = asyncio.run(suite.grade(item, answer))
    assert good.score == 1.0 and good.details["calls"] == [{"name": "math.factorial", "arguments": {"number": 5}}]
    assert grade(suite, item, Completion("", tool_calls=[tool_call("math_factorial", {"number": 6})])).score == 0.0
    assert grade(suite, item, Completion("", tool_calls=[tool_call("math_factorial", '{"number": 5')])).score == 0.0
    assert grade(suite, item, Completion("The factorial of 5 is 120.")).score == 0.0
    assert grade(suite, item, Completion("", tool_calls=[tool_call("math.factorial", {"number": 5})])).score == 1.0
    irrelevant = next(i for i in items if i.metadata["category"] == "irrelevance")
    assert grade(suite, irrelevant, Completion("None of the functions fits.")).score == 1.0
    fn = irrelevant.metadata["functions"][0]["name"]
    assert grade(suite, irrelevant, Completion("", tool_calls=[tool_call(openai_name(fn), {})])).score == 0.0
    assert asyncio.run(suite.grade(item, Answer([], error="timeout"))).score == 0.0


def test_completion_style(data_dir, items):
    suite = make_suite("bfcl", data_dir, style="completion", categories=["parallel", "irrelevance"])
    loaded = suite.load("test")
    assert {i.metadata["category"] for i in loaded} == {"parallel", "irrelevance"}
    item = loaded[0]  # spotify.play for Taylor Swift (20) and Maroon 5 (15)
    kind, payload = suite.request(item)
    assert kind == "completion" and payload["prompt"].endswith(f"Question: {item.prompt}\nCalls:")
    assert '"name": "spotify.play"' in payload["prompt"]
    reply = "[spotify.play(artist='Maroon 5', duration=15), spotify.play(artist='Taylor Swift', duration=20)]"
    assert grade(suite, item, Completion(reply)).score == 1.0
    assert grade(suite, item, Completion(reply.replace("15", "16"))).score == 0.0
    assert grade(suite, item, Completion("spotify.play(Taylor Swift)")).score == 0.0
    irrelevant = next(i for i in loaded if i.metadata["category"] == "irrelevance")
    assert grade(suite, irrelevant, Completion("[]")).score == 1.0
    assert grade(suite, irrelevant, Completion("I cannot help with that.")).score == 1.0


def test_parse_and_decode():
    calls = parse_python_calls("```python\n[a.b(x=1, y=(2, 3)), c(s='t')]\n```\nDone.")
    assert [(c.name, c.arguments) for c in calls] == [("a.b", {"x": 1, "y": [2, 3]}), ("c", {"s": "t"})]
    assert parse_python_calls("f(x=True)")[0].arguments == {"x": True}
    assert parse_python_calls("  ") == [] and parse_python_calls("[]") == []
    for bad in ("f(1)", "[f(x=y)]", "hello world", "[1, 2]"):
        with pytest.raises(ValueError):
            parse_python_calls(bad)
    raw = [tool_call("a_b", {"x": 1}), {"function": {"name": "z", "arguments": {"k": 2}}}]
    decoded = decode_tool_calls(raw, {"a_b": "a.b"})
    assert [(c.name, c.arguments) for c in decoded] == [("a.b", {"x": 1}), ("z", {"k": 2})]
    with pytest.raises(ValueError, match="not JSON"):
        decode_tool_calls([tool_call("a_b", "{x")], {})
    with pytest.raises(ValueError, match="JSON object"):
        decode_tool_calls([tool_call("a_b", "[1]")], {})


def test_errors(tmp_path, data_dir):
    with pytest.raises(FileNotFoundError, match="bfcl/BFCL_v4_simple_python.json"):
        make_suite("bfcl", tmp_path).load("test")
    with pytest.raises(ValueError, match="unknown BFCL categories"):
        make_suite("bfcl", data_dir, categories=["live_simple"]).load("test")
