"""Traces: the OpenAI JSONL reader (good files, every bad input with its line), BFCL -> traces whose target calls
BFCL's own grader accepts (all items of the five categories), and the errors raised before any training.

    LINK_HOME=.link LINK_DATASETS_DIR=../shared/data .venv/bin/python -m pytest -q tests/posttrain/test_traces.py
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from evals.bfcl_match import match_calls
from evals.bfcl_schema import decode_tool_calls, to_openai_tools
from posttrain.errors import PosttrainDataError
from posttrain.traces import (BFCL_NO_CALL_ANSWER, Trace, bfcl_target_calls, check_trace, read_bfcl,
                              read_openai_jsonl)
from serving.toolcalls import parse_tool_calls, render_messages

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}


def _call(call_id="call_1", name="get_weather", arguments='{"city": "Paris"}'):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _conversation(**overrides):
    row = {"messages": [{"role": "system", "content": "Be brief."},
                        {"role": "user", "content": "Weather in Paris?"},
                        {"role": "assistant", "content": None, "tool_calls": [_call()]},
                        {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
                        {"role": "assistant", "content": "It is 18 C and sunny in Paris."}],
           "tools": [WEATHER]}
    row.update(overrides)
    return row


def _write(tmp_path, rows, name="traces.jsonl"):
    path = tmp_path / name
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def test_openai_jsonl_reads_conversations_with_ids_and_line_numbers(tmp_path):
    plain = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]}
    path = _write(tmp_path, [_conversation(), "", plain, {**_conversation(), "id": "conv-7", "category": "weather"}])
    traces = read_openai_jsonl(path)
    assert [t.meta["line"] for t in traces] == [1, 3, 4]
    assert traces[0].messages == _conversation()["messages"] and traces[0].tools == [WEATHER]
    assert traces[0].meta["source"] == "openai" and traces[0].id.startswith("openai/")
    assert traces[1].tools == [] and traces[1].num_learned_turns == 1
    assert traces[2].id == "conv-7" and traces[2].category == "weather" and traces[2].num_learned_turns == 2
    # The id is a hash of the content: the same conversation in another file gets the same id (same split side).
    again = read_openai_jsonl(_write(tmp_path, [_conversation()], "other.jsonl"))
    assert again[0].id == traces[0].id


def test_openai_jsonl_converts_legacy_functions(tmp_path):
    row = {"messages": [{"role": "user", "content": "Weather in Paris?"},
                        {"role": "assistant", "content": None,
                         "function_call": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
                        {"role": "function", "name": "get_weather", "content": "18 C"},
                        {"role": "assistant", "content": "18 C."}],
           "functions": [WEATHER["function"]]}
    (trace,) = read_openai_jsonl(_write(tmp_path, [row]))
    assert trace.tools == [WEATHER]
    assert trace.messages[1] == {"role": "assistant", "content": None, "tool_calls": [_call("call_0")]}
    assert trace.messages[2] == {"role": "tool", "tool_call_id": "call_0", "name": "get_weather", "content": "18 C"}


def _with_message(index, message):
    row = _conversation()
    row["messages"][index] = message
    return row


BAD_LINES = [
    ('{"messages": [', "not valid JSON"),
    ('["a list"]', 'each line must be a JSON object {"messages"'),
    (_with_message(1, {"role": "human", "content": "Hi"}), "messages[1]: role must be one of"),
    (_with_message(1, {"role": "user", "content": [{"type": "image_url"}]}), "content must be a string"),
    (_with_message(2, {"role": "assistant", "content": None, "tool_calls": [_call(arguments={"city": "Paris"})]}),
     "arguments must be a JSON string of an object"),
    (_with_message(2, {"role": "assistant", "tool_calls": [_call(arguments='{"city": ')]}), "arguments are not valid JSON"),
    (_with_message(2, {"role": "assistant", "tool_calls": [_call(arguments='["Paris"]')]}), "must encode a JSON object"),
    (_with_message(2, {"role": "assistant", "tool_calls": [_call(name="get_time")]}),
     "calls 'get_time', which is not among the offered tools (get_weather)"),
    (_with_message(2, {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]}),
     "id must be a non-empty string"),
    (_with_message(2, {"role": "assistant", "tool_calls": []}), "tool_calls must be a non-empty list"),
    (_with_message(2, {"role": "assistant", "content": ""}), "needs content or tool_calls"),
    (_with_message(3, {"role": "tool", "tool_call_id": "call_9", "content": "18 C"}), "'call_9' is not the id of a previous"),
    (_with_message(4, {"role": "assistant", "content": "ok", "weight": 2}), "weight must be 0"),
    (_conversation(messages=[{"role": "user", "content": "Hi"}]), "no assistant message to learn from"),
    (_conversation(tools=[WEATHER, WEATHER]), "'get_weather' is offered twice"),
    (_conversation(tools=[{"type": "function", "function": {"description": "no name"}}]), 'tools[0] must be {"type": "function"'),
]


@pytest.mark.parametrize("bad, message", BAD_LINES)
def test_openai_jsonl_bad_line_names_file_line_and_fix(tmp_path, bad, message):
    path = _write(tmp_path, [_conversation(), _conversation(id="second"), bad])
    with pytest.raises(PosttrainDataError) as err:
        read_openai_jsonl(path)
    assert f"{path}:3" in str(err.value) and message in str(err.value)


def test_openai_jsonl_whole_file_errors(tmp_path):
    plain = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]}
    with pytest.raises(PosttrainDataError, match="none of the 2 conversations .* offers tools"):
        read_openai_jsonl(_write(tmp_path, [plain, {**plain, "id": "b"}]))
    with pytest.raises(PosttrainDataError, match="holds no conversations"):
        read_openai_jsonl(_write(tmp_path, ["", "  "], "empty.jsonl"))
    with pytest.raises(PosttrainDataError, match="trace file not found"):
        read_openai_jsonl(tmp_path / "missing.jsonl")
    with pytest.raises(PosttrainDataError, match="'same' occurs twice"):
        read_openai_jsonl(_write(tmp_path, [{**_conversation(), "id": "same"}] * 2, "dup.jsonl"))


def test_check_trace_accepts_context_only_turns_before_a_learned_one():
    messages = _conversation()["messages"]
    trace = Trace("t", [*messages[:2], {**messages[2], "weight": 0}, *messages[3:]], [WEATHER])
    check_trace(trace)
    assert trace.num_learned_turns == 1
    with pytest.raises(PosttrainDataError, match="no assistant message to learn from"):
        check_trace(Trace("t", [messages[1], {"role": "assistant", "content": "x", "weight": 0}], []))
    with pytest.raises(PosttrainDataError, match="id must be a non-empty string"):
        Trace("", messages, [])


def test_bfcl_target_calls_hand_checked():
    functions = [{"name": "geo.distance", "parameters": {"type": "dict", "required": ["a", "units"], "properties": {
        "a": {"type": "string"}, "units": {"type": "string"}, "round": {"type": "boolean"},
        "opts": {"type": "dict"}, "pts": {"type": "array"}}}}]
    truth = [{"geo.distance": {"a": ["Paris", "paris"], "units": ["", "km"], "round": ["", True],
                               "opts": [{"mode": ["fast"], "cache": ["", False]}], "pts": [[1, 2]]}}]
    (call,) = bfcl_target_calls(truth, functions)
    assert call["id"] == "call_0" and call["type"] == "function" and call["function"]["name"] == "geo_distance"
    # "units" may be omitted but is required, so it takes its first given value; "round" is optional: left out.
    assert json.loads(call["function"]["arguments"]) == {"a": "Paris", "units": "km", "opts": {"mode": "fast"}, "pts": [1, 2]}


@pytest.fixture(scope="module")
def bfcl_traces(data_dir):
    return read_bfcl(data_dir)


def test_read_bfcl_counts_ids_and_meta(bfcl_traces, data_dir):
    assert Counter(t.category for t in bfcl_traces) == {"simple": 400, "multiple": 200, "parallel": 200,
                                                        "parallel_multiple": 200, "irrelevance": 240}
    assert len({t.id for t in bfcl_traces}) == 1240
    first = bfcl_traces[0]
    assert first.id == "bfcl/test/simple_python_0" and first.meta["source"] == "bfcl"
    assert first.messages[0]["role"] == "user" and first.messages[-1]["role"] == "assistant"
    assert first.tools == to_openai_tools(first.meta["functions"])[0]
    # The bfcl folder itself is accepted too, and a subset of categories.
    subset = read_bfcl(data_dir / "bfcl", categories=["irrelevance"])
    assert len(subset) == 240 and {t.id for t in subset} <= {t.id for t in bfcl_traces}


def test_bfcl_targets_score_one_under_bfcl_grader(bfcl_traces):
    """Property over all 1240 items: the target turn is graded 1.0 by evals.bfcl_match, both as OpenAI tool_calls
    and after rendering it in the harness format and parsing it back as the gateway parses a model's output."""
    failures = []
    for t in bfcl_traces:
        names = to_openai_tools(t.meta["functions"])[1]
        answer = t.messages[-1]
        if t.category == "irrelevance":
            assert answer == {"role": "assistant", "content": BFCL_NO_CALL_ANSWER} and t.meta["ground_truth"] == []
        direct = match_calls(decode_tool_calls(answer.get("tool_calls"), names), t.meta["ground_truth"], t.meta["functions"])
        text = render_messages(t.messages, t.tools)[-1]["content"]
        parsed = parse_tool_calls(text, t.tools)
        reparsed = match_calls(decode_tool_calls(parsed.tool_calls, names), t.meta["ground_truth"], t.meta["functions"])
        if not (direct.ok and reparsed.ok):
            failures.append((t.id, direct.reason, reparsed.reason))
    assert failures == []


def test_read_bfcl_errors(tmp_path, data_dir):
    with pytest.raises(PosttrainDataError, match="unknown BFCL categories \\['java'\\]"):
        read_bfcl(data_dir, categories=["java"])
    with pytest.raises(PosttrainDataError, match="BFCL data not found"):
        read_bfcl(tmp_path)
