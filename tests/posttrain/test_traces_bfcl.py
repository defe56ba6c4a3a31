"""BFCL -> traces: counts and ids, a hand-checked target, and the property that BFCL's own grader gives 1.0 to
the target calls of every item of the five categories (as tool_calls and after the harness round trip).

    LINK_DATASETS_DIR=../shared/data .venv/bin/python -m pytest -q tests/posttrain/test_traces_bfcl.py
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from evals.bfcl_match import match_calls
from evals.bfcl_schema import decode_tool_calls, to_openai_tools
from posttrain.errors import PosttrainDataError
from posttrain.traces_bfcl import BFCL_NO_CALL_ANSWER, bfcl_target_calls, read_bfcl
from serving.tools.harness import parse_tool_calls, render_messages


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
