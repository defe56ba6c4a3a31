"""Traces: the OpenAI JSONL reader (good files, every bad input with the file, line and field to fix), the checks
of a single trace, and the errors raised for a whole file before any training.

    LINK_HOME=.link LINK_DATASETS_DIR=../shared/data .venv/bin/python -m pytest -q tests/posttrain/test_traces.py
"""

from __future__ import annotations

import json

import pytest

from posttrain.errors import PosttrainDataError
from posttrain.traces import Trace, check_trace, read_openai_jsonl

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
