"""Post-training renders what the engine serves for a template that renders tools itself: Qwen2.5-Coder-0.5B's
own template (read from its GGUF, no weights loaded) gets the tools and "tool" results, so a BFCL prompt from
`posttrain` equals, byte for byte, the prompt the gateway's chat path (`serving.frontend.responses.plan_chat`)
builds; SmolLM2's template, which does not read `tools`, keeps the harness's system text.

    LINK_HOME=.link LINK_DATASETS_DIR=../shared/data .venv/bin/python -m pytest -q tests/posttrain/test_dataset_qwen.py
"""

from __future__ import annotations

import json

import pytest
import torch

from posttrain.dataset import IGNORE_INDEX, encode_trace, load_chat_tokenizer, serving_tool_format, template_tools
from posttrain.scorer import prompt_messages
from posttrain.traces import Trace
from posttrain.traces_bfcl import read_bfcl
from protocol.openai import ChatCompletionRequest
from serving.frontend.responses import plan_chat
from serving.model_loader import LoadedModel
from serving.registry import default_registry
from serving.tools.formats import DEFAULT_FORMAT
from serving.tools.harness import render_tools_system_prompt

# The Qwen GGUF may be joined from its chunk packages on first use (hundreds of MB written): not a quick test.
pytestmark = pytest.mark.slow

QWEN = "qwen2.5-coder-0.5b-instruct"
SMOLLM2 = "smollm2-135m-instruct"
QWEN_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
WEATHER_TRACE = Trace("w1", [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "18 C, sunny"},
    {"role": "assistant", "content": "It is 18 C and sunny."},
], [WEATHER], {"source": "test"})


def _label_runs(example) -> list[tuple[int, int]]:
    """(start, end) of each maximal run of labelled positions."""
    labelled = [label != IGNORE_INDEX for label in example.labels] + [False]
    starts = [i for i, x in enumerate(labelled) if x and (i == 0 or not labelled[i - 1])]
    return [(a, next(i for i in range(a, len(labelled)) if not labelled[i])) for a in starts]


def _engine_model(name: str, tokenizer, chat_format) -> LoadedModel:
    """The parts of a loaded model the chat path reads (tokenizer, chat format); the weights are not needed."""
    return LoadedModel(spec=default_registry().get(name), config=None, model=None, tokenizer=tokenizer,
                       chat_format=chat_format, dtype=torch.float32, context_length=32768, load_seconds=0.0)


@pytest.fixture(scope="module")
def qwen_chat():
    return load_chat_tokenizer(QWEN)


@pytest.fixture(scope="module")
def bfcl_sample(data_dir):
    """Two BFCL traces of each category (simple, multiple, parallel, parallel_multiple, irrelevance)."""
    per_category: dict[str, list[Trace]] = {}
    for trace in read_bfcl(data_dir):
        per_category.setdefault(trace.category, []).append(trace)
    return [t for ts in per_category.values() for t in ts[:2]]


def _request(trace: Trace, end: int, model: str, **fields) -> ChatCompletionRequest:
    messages = [{k: v for k, v in m.items() if k != "weight"} for m in trace.messages[:end]]  # not an API field
    return ChatCompletionRequest(model=model, messages=messages, tools=trace.tools, **fields)


def test_qwen_renders_tools_natively_with_the_default_format(qwen_chat):
    _, chat_format = qwen_chat
    fmt, native = serving_tool_format(chat_format)
    assert native and chat_format.renders_tools
    assert fmt.name == DEFAULT_FORMAT.name and fmt.fenced_calls == "call"  # as the gateway parses Qwen's replies
    xml, native = serving_tool_format(chat_format, "xml")  # not the template's call syntax: the harness renders
    assert xml.name == "xml" and not native


def test_bfcl_prompts_equal_the_served_prompt_byte_for_byte(qwen_chat, bfcl_sample):
    tokenizer, chat_format = qwen_chat
    engine_model = _engine_model(QWEN, tokenizer, chat_format)
    fmt, native = serving_tool_format(chat_format)
    assert len({t.category for t in bfcl_sample}) == 5
    for trace in bfcl_sample:
        text = chat_format.render(prompt_messages(trace, fmt, native), tools=template_tools(trace, native))
        plan = plan_chat(_request(trace, -1, QWEN), engine_model, 32768)
        assert text == plan.prompt_texts[0], trace.id
        # Qwen's own tools section, one tool per line as Hugging Face's tojson writes it, no harness text
        assert text.startswith(f"<|im_start|>system\n{QWEN_SYSTEM}\n\n# Tools\n\nYou may call one or more functions")
        assert "".join(f"\n{json.dumps(tool)}" for tool in trace.tools) + "\n</tools>" in text
        assert render_tools_system_prompt(trace.tools) not in text
        assert text.endswith(f"<|im_start|>user\n{trace.messages[-2]['content']}<|im_end|>\n<|im_start|>assistant\n")
        # the training example's prompt ids are the served prompt's ids
        example = encode_trace(trace, tokenizer, chat_format)
        ((start, end),) = _label_runs(example)
        assert example.input_ids[:start] == plan.prompts[0], trace.id
        assert tokenizer.decode(example.input_ids[start:end], False).endswith("<|im_end|>")


def test_a_tool_result_turn_is_wrapped_by_qwens_template(qwen_chat):
    """Each learned turn's prompt is the served prompt; the result is Qwen's `<tool_response>` user turn."""
    tokenizer, chat_format = qwen_chat
    engine_model = _engine_model(QWEN, tokenizer, chat_format)
    trace = WEATHER_TRACE
    example = encode_trace(trace, tokenizer, chat_format)
    runs = _label_runs(example)
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert [tokenizer.decode(example.input_ids[a:b], False) for a, b in runs] == [
        call + "<|im_end|>", "It is 18 C and sunny.<|im_end|>"]
    for (start, _), i in zip(runs, (2, 4)):
        plan = plan_chat(_request(trace, i, QWEN), engine_model, 32768)
        assert plan.prompts[0] == example.input_ids[:start]
    prompt = plan.prompt_texts[0]
    assert prompt.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n\n")
    assert prompt.endswith(f"<|im_start|>assistant\n{call}<|im_end|>\n"
                           "<|im_start|>user\n<tool_response>\n18 C, sunny\n</tool_response><|im_end|>\n"
                           "<|im_start|>assistant\n")


def test_tool_choice_none_gives_the_template_no_tools(qwen_chat):
    tokenizer, chat_format = qwen_chat
    question = [{"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", "content": "I cannot tell."}]
    trace = Trace("n1", question, [WEATHER], {"tool_choice": "none"})
    fmt, native = serving_tool_format(chat_format)
    assert template_tools(trace, native) is None
    text = chat_format.render(prompt_messages(trace, fmt, native), tools=template_tools(trace, native))
    plan = plan_chat(_request(trace, -1, QWEN, tool_choice="none"), _engine_model(QWEN, tokenizer, chat_format), 32768)
    assert text == plan.prompt_texts[0] == (f"<|im_start|>system\n{QWEN_SYSTEM}<|im_end|>\n"
                                            "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n")


def test_smollm2_keeps_the_harness_rendering(bfcl_sample):
    tokenizer, chat_format = load_chat_tokenizer(SMOLLM2)
    fmt, native = serving_tool_format(chat_format)
    assert (fmt, native) == (DEFAULT_FORMAT, False) and not chat_format.renders_tools
    trace = bfcl_sample[0]
    assert template_tools(trace, native) is None
    text = chat_format.render(prompt_messages(trace, fmt, native))
    assert text.startswith(f"<|im_start|>system\n{render_tools_system_prompt(trace.tools)}<|im_end|>\n<|im_start|>user\n")
    assert "You may call one or more functions" not in text  # none of Qwen's own tools text
    plan = plan_chat(_request(trace, -1, SMOLLM2), _engine_model(SMOLLM2, tokenizer, chat_format), 8192)
    assert text == plan.prompt_texts[0]
