"""Qwen2.5-Coder-0.5B-Instruct behind the engine server: the file's ChatML template (system, multi-turn), a
tool-call round trip in Qwen's `<tool_call>` format (the default harness format) parsed back to OpenAI
`tool_calls`, forced `tool_choice` by constrained decoding, and the context cap `/v1/models` reports.

    LINK_HOME=.link LINK_DATASETS_DIR=../shared/data .venv/bin/python -m pytest -q tests/serving/test_qwen_chat.py
"""

from __future__ import annotations

import json

import openai
import pytest

from serving import LLM
from serving.api.server import create_engine_app
from serving.engine.engine_config import EngineConfig
from tests.serving.loopback import serve_on_loopback

pytestmark = pytest.mark.slow

MODEL = "qwen2.5-coder-0.5b-instruct"
KV_CACHE_BYTES = 64 * 2**20  # 64 MiB: 2,730 float32 tokens of this model (24 layers x 2 x 2 heads x 64 x 4 B)
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


@pytest.fixture(scope="module")
def qwen():
    return LLM(MODEL, dtype="float32", engine_config=EngineConfig(kv_cache_bytes=KV_CACHE_BYTES))


@pytest.fixture(scope="module")
def client(qwen):
    app = create_engine_app(MODEL, loaded=qwen.loaded, engine_config=EngineConfig(kv_cache_bytes=KV_CACHE_BYTES))
    with serve_on_loopback(app) as url:
        yield openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600)


def test_the_files_chatml_template_renders_system_and_turns(qwen):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "2+2?"}]
    assert qwen.loaded.chat_format.render(messages) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n")
    # Without a system turn the file's template writes Qwen's own.
    assert qwen.loaded.chat_format.render(messages[1:2]).startswith(
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n")


def test_models_reports_the_kv_cache_cap(client):
    (card,) = client.models.list().data
    # min(the file's 32,768, the blocks of a 64 MiB cache): 2,730 tokens rounded down to 16-token blocks.
    assert card.id == MODEL and card.model_extra["max_model_len"] == (KV_CACHE_BYTES // (24 * 2 * 2 * 64 * 4)) // 16 * 16


def test_a_prompt_over_the_cap_is_a_context_length_400(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hello " * 3000}], max_tokens=4)
    assert info.value.code == "context_length_exceeded"


def test_a_tool_call_round_trip(client):
    question = [{"role": "user", "content": "What is the weather in Paris right now?"}]
    first = client.chat.completions.create(model=MODEL, messages=question, tools=[WEATHER], max_tokens=64, temperature=0,
                                           tool_choice={"type": "function", "function": {"name": "get_weather"}})
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"].lower() == "paris"
    history = [*question, choice.message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": '{"temperature_c": 18, "sky": "sunny"}'}]
    second = client.chat.completions.create(model=MODEL, messages=history, tools=[WEATHER], max_tokens=48, temperature=0)
    answer = second.choices[0].message
    assert not answer.tool_calls and "18" in answer.content  # the model read the result back



def test_tools_go_through_the_files_template(qwen):
    """The file's template reads `tools`: it writes its own `# Tools` section, not the harness's text."""
    fmt = qwen.loaded.chat_format
    assert fmt.renders_tools
    prompt = fmt.render([{"role": "user", "content": "Hi"}], tools=[WEATHER])
    assert prompt.startswith("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
                             "\n\n# Tools\n\nYou may call one or more functions")
    assert f"<tools>\n{json.dumps(WEATHER)}\n</tools>" in prompt  # keys in the client's order, as Hugging Face writes them
    assert "\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n" in prompt


def test_tool_choice_auto_calls_the_tool(client):
    """Unforced, greedy: the 0.5B answers the weather question with a get_weather call (it wrote plain text when the
    harness's own tools text replaced the template's)."""
    reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "What's the weather in Tokyo?"}],
                                           tools=[WEATHER], tool_choice="auto", max_tokens=40, temperature=0)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message.content
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Tokyo"}
