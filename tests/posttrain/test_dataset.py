"""TraceDataset on the real SmolLM2 tokenizer and chat template (no weights loaded): labels cover exactly the
assistant's text and its end-of-turn token, each turn's prompt is token for token what the gateway's chat path
(`serving.frontend.responses.plan_chat`) builds, templates that break the prefix property are refused, long examples
are dropped and counted, and the split is deterministic, disjoint and stratified on BFCL.

    LINK_HOME=.link LINK_DATASETS_DIR=../shared/data .venv/bin/python -m pytest -q tests/posttrain/test_dataset.py
"""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch

from posttrain.dataset import (IGNORE_INDEX, TraceDataset, encode_trace, harness_messages, load_chat_tokenizer,
                               split_traces)
from posttrain.errors import PosttrainDataError
from posttrain.traces import Trace
from posttrain.traces_bfcl import read_bfcl
from protocol.openai import ChatCompletionRequest
from serving.frontend.responses import plan_chat
from serving.model_loader import LoadedModel
from serving.registry import default_registry
from serving.text.chat_format import TemplateChatFormat
from serving.tools.harness import render_tools_system_prompt

MODEL = "smollm2-135m-instruct"
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.fixture(scope="module")
def smollm2_chat():
    return load_chat_tokenizer(MODEL)


@pytest.fixture(scope="module")
def engine_model(smollm2_chat):
    """The parts of a loaded model the chat path reads (tokenizer, chat format); the weights are not needed."""
    tokenizer, chat_format = smollm2_chat
    return LoadedModel(spec=default_registry().get(MODEL), config=None, model=None, tokenizer=tokenizer,
                       chat_format=chat_format, dtype=torch.float32, context_length=8192, load_seconds=0.0)


@pytest.fixture(scope="module")
def bfcl(data_dir):
    return read_bfcl(data_dir)


def _weather_trace(first_weight=1):
    return Trace("w1", [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "weight": first_weight, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "18 C, sunny"},
        {"role": "assistant", "content": "It is 18 C and sunny."},
        {"role": "user", "content": "Thanks!"},
    ], [WEATHER], {"source": "test"})


def _label_runs(example):
    """(start, end) of each maximal run of labelled positions."""
    runs, start = [], None
    for i, label in enumerate([*example.labels, IGNORE_INDEX]):
        if label != IGNORE_INDEX and start is None:
            start = i
        elif label == IGNORE_INDEX and start is not None:
            runs.append((start, i))
            start = None
    return runs


def test_labels_are_exactly_the_assistant_turns(smollm2_chat):
    tokenizer, chat_format = smollm2_chat
    example = encode_trace(_weather_trace(), tokenizer, chat_format)
    runs = _label_runs(example)
    assert [tokenizer.decode(example.input_ids[a:b], False) for a, b in runs] == [
        CALL + "<|im_end|>", "It is 18 C and sunny.<|im_end|>"]
    assert all(example.labels[i] == example.input_ids[i] for a, b in runs for i in range(a, b))
    assert example.num_label_tokens == sum(b - a for a, b in runs)
    # Hand-built ChatML of the whole conversation: the tools prompt after the system text, the call as a block,
    # the result in a user turn; cut after the last learned turn (the closing "Thanks!" turn has no loss).
    expected = ("<|im_start|>system\nBe brief.\n\n" + render_tools_system_prompt([WEATHER]) + "<|im_end|>\n"
                "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
                f"<|im_start|>assistant\n{CALL}<|im_end|>\n"
                '<|im_start|>user\n<tool_response name="get_weather" tool_call_id="c1">\n18 C, sunny\n</tool_response><|im_end|>\n'
                "<|im_start|>assistant\nIt is 18 C and sunny.<|im_end|>")
    assert tokenizer.decode(example.input_ids, False) == expected
    assert example.input_ids == tokenizer.encode(expected)


def test_weight_zero_turn_is_context_only(smollm2_chat):
    tokenizer, chat_format = smollm2_chat
    full = encode_trace(_weather_trace(), tokenizer, chat_format)
    context = encode_trace(_weather_trace(first_weight=0), tokenizer, chat_format)
    assert context.input_ids == full.input_ids
    (a, b), = _label_runs(context)
    assert tokenizer.decode(context.input_ids[a:b], False) == "It is 18 C and sunny.<|im_end|>"


def test_each_turn_prompt_is_what_the_gateway_renders(smollm2_chat, engine_model, bfcl):
    """The ids before each learned turn equal the prompt ids `plan_chat` builds for the conversation so far."""
    tokenizer, chat_format = smollm2_chat
    per_category = {}
    for t in bfcl:
        per_category.setdefault(t.category, []).append(t)
    traces = [_weather_trace()] + [t for ts in per_category.values() for t in ts[:3]]
    for trace in traces:
        example = encode_trace(trace, tokenizer, chat_format)
        assistant_at = [i for i, m in enumerate(trace.messages) if m["role"] == "assistant"]
        for (start, _), i in zip(_label_runs(example), assistant_at):
            messages = [{k: v for k, v in m.items() if k != "weight"} for m in trace.messages[:i]]  # not an API field
            body = ChatCompletionRequest(model=MODEL, messages=messages, tools=trace.tools)
            plan = plan_chat(body, engine_model, 8192)
            assert plan.prompts[0] == example.input_ids[:start], trace.id


def test_bfcl_labels_decode_to_the_rendered_answer(smollm2_chat, bfcl):
    tokenizer, chat_format = smollm2_chat
    for trace in bfcl[::7]:
        example = encode_trace(trace, tokenizer, chat_format)
        (a, b), = _label_runs(example)
        assert b == example.num_tokens
        answer = harness_messages(trace)[-1]["content"]
        assert tokenizer.decode(example.input_ids[a:b], False) == answer + "<|im_end|>", trace.id


XML_CALL = "<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>"


def test_xml_harness_format_renders_as_the_gateway_does(smollm2_chat, engine_model):
    from serving.tools.formats import XML_FORMAT

    tokenizer, chat_format = smollm2_chat
    trace = _weather_trace()
    example = encode_trace(trace, tokenizer, chat_format, "xml")
    runs = _label_runs(example)
    assert [tokenizer.decode(example.input_ids[a:b], False) for a, b in runs] == [
        XML_CALL + "<|im_end|>", "It is 18 C and sunny.<|im_end|>"]
    for (start, _), i in zip(runs, (2, 4)):
        messages = [{k: v for k, v in m.items() if k != "weight"} for m in trace.messages[:i]]
        body = ChatCompletionRequest(model=MODEL, messages=messages, tools=trace.tools)
        assert plan_chat(body, engine_model, 8192, tool_format=XML_FORMAT).prompts[0] == example.input_ids[:start]
    assert encode_trace(trace, tokenizer, chat_format, {"base": "xml"}) == example


def test_schemas_the_harness_format_cannot_express_are_refused(smollm2_chat):
    tokenizer, chat_format = smollm2_chat
    spaced = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"the city": {"type": "string"}}}}}
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"the city": "Paris"}'}}
    trace = Trace("spaced", [{"role": "user", "content": "Paris?"}, {"role": "assistant", "tool_calls": [call]}],
                  [spaced], {})
    encode_trace(trace, tokenizer, chat_format)  # the JSON format carries any schema
    with pytest.raises(PosttrainDataError, match="trace spaced: the 'xml' tool format cannot carry it: .*the city"):
        TraceDataset([trace], tokenizer, chat_format, tool_format="xml")
    with pytest.raises(PosttrainDataError, match="unknown tool format 'yaml'"):
        TraceDataset([trace], tokenizer, chat_format, tool_format="yaml")


def test_dataset_drops_examples_longer_than_max_seq_length(smollm2_chat, bfcl):
    tokenizer, chat_format = smollm2_chat
    traces = bfcl[:40]
    lengths = {t.id: encode_trace(t, tokenizer, chat_format).num_tokens for t in traces}
    limit = sorted(lengths.values())[30]
    data = TraceDataset(traces, tokenizer, chat_format, max_seq_length=limit)
    assert data.dropped == [i for i, n in lengths.items() if n > limit]
    assert len(data) + data.num_dropped == 40 and all(e.num_tokens <= limit for e in data)
    assert [e.trace_id for e in data] == [i for i, n in lengths.items() if n <= limit]
    stats = data.stats()
    assert stats["max_tokens"] == max(n for n in lengths.values() if n <= limit) and stats["num_dropped"] == data.num_dropped
    with pytest.raises(PosttrainDataError, match="all 40 examples are longer than max_seq_length=10"):
        TraceDataset(traces, tokenizer, chat_format, max_seq_length=10)
    with pytest.raises(PosttrainDataError, match="the dataset is empty"):
        TraceDataset([], tokenizer, chat_format)


def test_dataset_checks_traces_and_can_skip_invalid_ones(smollm2_chat):
    tokenizer, chat_format = smollm2_chat
    good = _weather_trace()
    call = {"id": "c9", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}
    bad = Trace("bad", [good.messages[1], {"role": "assistant", "tool_calls": [call]}], [WEATHER], {})
    with pytest.raises(PosttrainDataError, match="trace bad: messages\\[1\\].tool_calls\\[0\\]: calls 'get_time'"):
        TraceDataset([good, bad], tokenizer, chat_format)
    data = TraceDataset([good, bad], tokenizer, chat_format, skip_invalid=True)
    assert [e.trace_id for e in data] == ["w1"] and [i for i, _ in data.invalid] == ["bad"]
    assert data.stats()["num_invalid"] == 1
    with pytest.raises(PosttrainDataError, match="none of the 1 traces can be trained on"):
        TraceDataset([bad], tokenizer, chat_format, skip_invalid=True)


def test_templates_that_break_the_prefix_or_never_end_a_turn_are_refused(smollm2_chat):
    tokenizer, _ = smollm2_chat
    # Writes the number of messages into the first turn: the prompt of turn k differs from the whole rendering.
    counting = TemplateChatFormat("{{ '<|im_start|>system\\n' ~ messages|length ~ '<|im_end|>\\n' }}"
                                  "{% for m in messages %}{{ '<|im_start|>' ~ m.role ~ '\\n' ~ m.content ~ '<|im_end|>\\n' }}"
                                  "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
    with pytest.raises(PosttrainDataError, match="is not a token prefix of the whole conversation"):
        encode_trace(_weather_trace(), tokenizer, counting)
    plain = TemplateChatFormat("{% for m in messages %}{{ m.role ~ ':\\n' ~ m.content ~ '\\n' }}{% endfor %}"
                               "{% if add_generation_prompt %}{{ 'assistant:\\n' }}{% endif %}")
    with pytest.raises(PosttrainDataError, match="no end-of-turn token"):
        encode_trace(_weather_trace(), tokenizer, plain)


def test_models_without_a_chat_template_are_refused():
    with pytest.raises(PosttrainDataError, match="'gemma-3-270m' uses the 'in-context' chat format"):
        load_chat_tokenizer("gemma-3-270m")


def test_split_is_deterministic_disjoint_and_stratified_on_bfcl(bfcl):
    train, val = split_traces(bfcl, val_fraction=0.3, seed=0)
    train_ids, val_ids = {t.id for t in train}, {t.id for t in val}
    assert not train_ids & val_ids and train_ids | val_ids == {t.id for t in bfcl}
    n = Counter(t.category for t in bfcl)
    assert Counter(t.category for t in val) == {c: round(k * 0.3) for c, k in n.items()}  # 120, 60, 60, 60, 72
    assert [t.id for t in train] == [t.id for t in bfcl if t.id in train_ids]  # input order kept
    shuffled = list(bfcl)
    random.Random(1).shuffle(shuffled)
    again_train, again_val = split_traces(shuffled, val_fraction=0.3, seed=0)
    assert {t.id for t in again_val} == val_ids  # independent of the input order
    other_val = {t.id for t in split_traces(bfcl, val_fraction=0.3, seed=1)[1]}
    assert other_val != val_ids and len(other_val) == len(val_ids)
    assert split_traces(bfcl, 0.0, 0) == (list(bfcl), [])


def test_split_keeps_a_conversation_together_and_checks_its_input():
    a = _weather_trace()
    traces = [a, Trace("w1", a.messages[:3], a.tools, a.meta)] + [Trace(f"x{i}", a.messages, a.tools) for i in range(9)]
    for seed in range(5):
        train, val = split_traces(traces, 0.5, seed)
        assert sum(t.id == "w1" for t in train) in (0, 2)
    with pytest.raises(PosttrainDataError, match="val_fraction must be in \\[0, 1\\)"):
        split_traces(traces, 1.0, 0)
    with pytest.raises(PosttrainDataError, match="has traces in categories"):
        split_traces([a, Trace("w1", a.messages, a.tools, {"category": "other"})], 0.5, 0)
