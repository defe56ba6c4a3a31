"""posttrain/scorer.py: hand-checked grading of canned replies (a right call, a wrong argument, a block that does
not parse, a call on an irrelevance item, the OpenAI -> BFCL name mapping, the generic exact match), the gold
answers of every BFCL item graded right, the prompt equal to the gateway's, and one real run of SmolLM2 on six
BFCL items whose records agree with BFCL's grader.

    LINK_DATASETS_DIR=../shared/data .venv/bin/python -m pytest -q tests/posttrain/test_scorer.py
"""

from __future__ import annotations

import json

import pytest

from evals.bfcl_match import match_calls
from evals.bfcl_schema import decode_tool_calls, to_openai_tools
from posttrain.errors import ModelNotLocalError, PosttrainDataError
from posttrain.scorer import ItemScore, ScoreResult, grade_output, prompt_messages, render_table, summary_line
from posttrain.traces import Trace
from posttrain.traces_bfcl import bfcl_target_calls, read_bfcl

FACTORIAL = [{"name": "math.factorial", "description": "n!", "parameters": {
    "type": "dict", "properties": {"number": {"type": "integer"}, "exact": {"type": "boolean"}}, "required": ["number"]}}]


def _bfcl_trace(truth, functions=FACTORIAL, category="simple") -> Trace:
    """A BFCL trace as read_bfcl builds it (tools with OpenAI names, meta for the grader)."""
    tools = to_openai_tools(functions)[0]
    answer = ({"role": "assistant", "content": None, "tool_calls": bfcl_target_calls(truth, functions)} if truth
              else {"role": "assistant", "content": "None of the offered functions fits this request."})
    return Trace(f"bfcl/test/{category}_0", [{"role": "user", "content": "What is 5 factorial?"}, answer], tools,
                 {"source": "bfcl", "category": category, "functions": functions, "ground_truth": truth})


def _block(name: str, arguments) -> str:
    body = json.dumps({"name": name, "arguments": arguments}) if not isinstance(arguments, str) else arguments
    return f"<tool_call>\n{body}\n</tool_call>"


SIMPLE = _bfcl_trace([{"math.factorial": {"number": [5], "exact": ["", True]}}])
IRRELEVANT = _bfcl_trace([], category="irrelevance")


def test_a_right_call_is_graded_right_with_the_bfcl_name():
    item = grade_output(SIMPLE, "Sure.\n" + _block("math_factorial", {"number": 5}))
    # the OpenAI name math_factorial is graded (and recorded) as BFCL's math.factorial
    assert (item.correct, item.parsed, item.reason, item.expects_call) == (True, True, "", True)
    assert item.calls == ({"name": "math.factorial", "arguments": {"number": 5}},)
    assert grade_output(SIMPLE, _block("math_factorial", {"number": 5, "exact": True})).correct  # optional argument given


def test_a_wrong_argument_is_graded_wrong_with_the_graders_reason():
    item = grade_output(SIMPLE, _block("math_factorial", {"number": 6}))
    assert (item.correct, item.parsed) == (False, True)
    assert item.reason == "math.factorial: argument 'number' = 6 is not among [5]"
    wrong_type = grade_output(SIMPLE, _block("math_factorial", {"number": "5"}))
    assert not wrong_type.correct and "is not of type 'integer'" in wrong_type.reason
    # a BFCL name is not an offered tool name: the block is not a call
    dotted = grade_output(SIMPLE, _block("math.factorial", {"number": 5}))
    assert (dotted.correct, dotted.parsed, dotted.calls) == (False, False, ())


def test_a_block_that_does_not_parse():
    for text in ('<tool_call>\n{"name": "math_factorial", "arguments": {number: 5}}\n</tool_call>',  # not JSON
                 _block("math_factorial", '{"name": "math_factorial", "arguments": [5]}'),         # arguments not an object
                 '<tool_call>\n{"name": "math_factorial", "arguments": {"number": 5}}'):            # never closed
        item = grade_output(SIMPLE, text)
        assert (item.parsed, item.correct, item.calls) == (False, False, ()), text
        assert item.reason == "expected 1 call(s), got 0"
    # one good block beside a bad one: the good call is graded, the output does not count as parsed
    mixed = grade_output(SIMPLE, _block("math_factorial", {"number": 5}) + "\n<tool_call>\n{oops}\n</tool_call>")
    assert (mixed.parsed, mixed.correct) == (False, True)
    # plain text without any block parses (it is an answer without a call)
    plain = grade_output(SIMPLE, "5! is 120.")
    assert (plain.parsed, plain.correct, plain.reason) == (True, False, "expected 1 call(s), got 0")


def test_a_call_cut_at_its_close_tag_counts_only_when_the_reply_hit_max_tokens():
    text = '<tool_call>\n{"name": "math_factorial", "arguments": {"number": 5}}\n</tool'
    assert grade_output(SIMPLE, text, finish_reason="length").correct
    assert not grade_output(SIMPLE, text, finish_reason="stop").parsed


def test_irrelevance_items():
    call = grade_output(IRRELEVANT, _block("math_factorial", {"number": 5}))
    assert (call.correct, call.parsed, call.expects_call, call.reason) == (False, True, False, "expected no call, got 1")
    text = grade_output(IRRELEVANT, "None of these functions can help with that.")
    assert (text.correct, text.parsed) == (True, True)
    broken = grade_output(IRRELEVANT, "<tool_call>\n{broken\n</tool_call>")  # as in BFCL and the gateway: no call
    assert (broken.correct, broken.parsed) == (True, False)


def test_parallel_calls_match_in_any_order():
    functions = [{"name": "weather.get", "parameters": {"type": "dict", "properties": {"city": {"type": "string"}},
                                                        "required": ["city"]}}]
    trace = _bfcl_trace([{"weather.get": {"city": ["Paris"]}}, {"weather.get": {"city": ["Rome"]}}], functions, "parallel")
    rome_paris = _block("weather_get", {"city": "rome"}) + "\n" + _block("weather_get", {"city": "Paris"})
    assert grade_output(trace, rome_paris).correct  # order-free, strings compared case-insensitively (BFCL)
    assert not grade_output(trace, _block("weather_get", {"city": "Paris"})).correct


def test_generic_traces_exact_match():
    tools = [{"type": "function", "function": {"name": "lookup_order", "parameters": {
        "type": "object", "properties": {"order_id": {"type": "string"}, "verbose": {"type": "boolean"}}}}}]
    gold = {"role": "assistant", "tool_calls": [{"id": "c0", "type": "function", "function": {
        "name": "lookup_order", "arguments": json.dumps({"order_id": "A7", "verbose": True})}}]}
    trace = Trace("openai/1", [{"role": "user", "content": "Where is A7?"}, gold], tools, {"source": "openai", "category": "orders"})
    assert grade_output(trace, _block("lookup_order", {"verbose": True, "order_id": "A7"})).correct  # key order free
    wrong = grade_output(trace, _block("lookup_order", {"order_id": "a7", "verbose": True}))  # exact: case matters
    assert not wrong.correct and wrong.reason == 'no call lookup_order({"order_id": "A7", "verbose": true})'
    assert not grade_output(trace, _block("lookup_order", {"order_id": "A7"})).correct
    text_trace = Trace("openai/2", [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}], tools,
                       {"source": "openai"})
    assert grade_output(text_trace, "Hello, how can I help?").correct  # no call expected, none made
    assert not grade_output(text_trace, _block("lookup_order", {"order_id": "A7"})).correct


def test_the_gold_answer_of_every_bfcl_item_is_graded_right(data_dir):
    """Property: the target calls read_bfcl makes, written by the harness, are graded right, and parse."""
    from serving.tools.harness import render_messages

    traces = read_bfcl(data_dir)
    for trace in traces:
        gold_text = render_messages([trace.messages[-1]], trace.tools)[-1]["content"]  # the final turn as the model writes it
        item = grade_output(trace, gold_text)
        assert item.correct and item.parsed, (trace.id, item.reason)


def test_prompt_messages_refuses_a_trace_without_a_final_answer():
    with pytest.raises(PosttrainDataError, match="last message must be the assistant"):
        prompt_messages(Trace("t", [{"role": "user", "content": "Hi"}], SIMPLE.tools, {}))


def test_score_result_metrics_and_jsonl(tmp_path):
    def item(i, category, correct, parsed, expects_call=True):
        return ItemScore(f"id{i}", category, "out", (), parsed, correct, "" if correct else "no", expects_call)

    items = (item(0, "simple", True, True), item(1, "simple", False, False), item(2, "simple", False, True),
             item(3, "irrelevance", True, False, False), item(4, "irrelevance", False, True, False))
    result = ScoreResult("m", items, wall_s=2.0, generate_s=1.0)
    assert result.accuracy == pytest.approx(2 / 5) and result.parse_rate == pytest.approx(3 / 5)
    assert result.irrelevance_accuracy == pytest.approx(1 / 2) and result.call_accuracy == pytest.approx(1 / 3)
    cats = result.categories
    assert list(cats) == ["simple", "irrelevance", "all"]
    assert (cats["simple"].n, cats["simple"].correct, cats["simple"].parsed) == (3, 1, 2)
    metrics = result.metrics()
    assert metrics["categories"]["simple"]["accuracy"] == pytest.approx(1 / 3) and metrics["num_items"] == 5
    rows = [json.loads(line) for line in result.write_jsonl(tmp_path / "items.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == [f"id{i}" for i in range(5)] and rows[1]["parsed"] is False
    assert json.loads(result.write_metrics(tmp_path / "m.json").read_text())["accuracy"] == pytest.approx(0.4)
    assert render_table(result).row_count == 3
    assert summary_line(result) == ("accuracy 40.0% (items with calls 33.3%, irrelevance 50.0%), parsed 60.0%, 5 items in "
                                    "2.0 s (1.0 s generating)")
    assert ScoreResult("m", ()).irrelevance_accuracy is None


def test_a_model_that_is_not_local_fails_before_loading():
    from posttrain.local_models import local_model_spec

    with pytest.raises(ModelNotLocalError, match="looks like a provider model"):
        local_model_spec("openai/gpt-4o")
    with pytest.raises(ModelNotLocalError, match="is not a local model name"):
        local_model_spec("smollm9-1b")


# --- the real SmolLM2 ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def six_bfcl(data_dir):
    """Six BFCL items: the first two of simple and irrelevance, the first of multiple and parallel."""
    traces = read_bfcl(data_dir)
    picked = []
    for category, count in (("simple", 2), ("multiple", 1), ("parallel", 1), ("irrelevance", 2)):
        picked += [t for t in traces if t.category == category][:count]
    return picked


@pytest.fixture(scope="module")
def smollm2_scored(six_bfcl):
    from posttrain.scorer import ToolCallScorer

    scorer = ToolCallScorer("smollm2-135m-instruct", max_tokens=64)
    return scorer, scorer.score(six_bfcl)


@pytest.mark.slow
def test_prompts_are_the_gateways(smollm2_scored, six_bfcl):
    """The scorer's prompt ids equal those serving.frontend.responses.plan_chat builds for the same chat request."""
    from protocol.openai import ChatCompletionRequest
    from serving.frontend.responses import plan_chat

    scorer, _ = smollm2_scored
    for trace in six_bfcl:
        body = ChatCompletionRequest(model="smollm2-135m-instruct", messages=trace.messages[:-1], tools=trace.tools)
        plan = plan_chat(body, scorer.llm.loaded, scorer.llm.loaded.context_length)
        assert plan.prompts == [scorer.encode(trace)], trace.id


@pytest.mark.slow
def test_a_real_run_records_are_consistent(smollm2_scored, six_bfcl):
    from serving.tools.harness import parse_tool_calls

    _, result = smollm2_scored
    assert [i.id for i in result.items] == [t.id for t in six_bfcl]
    assert result.accuracy == pytest.approx(sum(i.correct for i in result.items) / 6)
    assert result.parse_rate == pytest.approx(sum(i.parsed for i in result.items) / 6)
    irrelevant = [i for i in result.items if i.category == "irrelevance"]
    assert result.irrelevance_accuracy == pytest.approx(sum(i.correct for i in irrelevant) / 2)
    assert result.call_accuracy == pytest.approx(sum(i.correct for i in result.items if i.category != "irrelevance") / 4)
    for trace, item in zip(six_bfcl, result.items):
        assert item.output_tokens >= 1 and item.finish_reason in ("stop", "length") and item.prompt_tokens > 100
        # each flag is BFCL's grader on the calls parsed from the output, recomputed here
        parsed = parse_tool_calls(item.output, trace.tools, cut=item.finish_reason == "length")
        calls = decode_tool_calls(parsed.tool_calls, to_openai_tools(trace.meta["functions"])[1])
        assert item.correct == match_calls(calls, trace.meta["ground_truth"], trace.meta["functions"]).ok, item
        assert list(item.calls) == [{"name": c.name, "arguments": c.arguments} for c in calls]
        assert item.parsed == ("<tool_call>" not in (parsed.content or ""))
