"""An 8,000-token prompt answered by each Qwen2.5-Coder model (a fact buried mid-document), and a prompt over the
KV cache's cap refused with the usual context-length 400. Prints the prefill time (time to the first token).

    LINK_HOME=.link LINK_DATASETS_DIR=../shared/data .venv/bin/python -m pytest -q -s tests/serving/test_qwen_long_prompt.py
"""

from __future__ import annotations

import time

import openai
import pytest

from serving import LLM
from serving.api.server import create_engine_app
from serving.engine.engine_config import EngineConfig
from tests.serving.loopback import serve_on_loopback

pytestmark = pytest.mark.slow

# KV bytes per float32 token: layers x (K, V) x KV heads x head size x 4 B.
MODELS = {"qwen2.5-coder-0.5b-instruct": 24 * 2 * 2 * 64 * 4, "qwen2.5-coder-1.5b-instruct": 28 * 2 * 2 * 128 * 4}
CAP = 8448  # tokens the KV cache holds (528 blocks of 16)
TARGET = 8000
NEEDLE = "The access code for the archive room is 7391."
QUESTION = "What is the access code for the archive room? Answer with the number only."


def _document(tokenizer, target: int) -> str:
    """Numbered log lines with the needle in the middle: the fewest lines of at least `target` tokens."""
    line = "Entry {i}: the shipment of crates was checked, counted and stored on shelf {s} without remark.\n"

    def build(n: int) -> str:
        lines = [line.format(i=i, s=i % 40) for i in range(n)]
        lines.insert(n // 2, NEEDLE + "\n")
        return "".join(lines)

    n = 1
    while (count := len(tokenizer.encode(build(n), add_special_tokens=False))) < target:
        n += max(1, (target - count) // 30)  # a line is over 20 tokens: this never overshoots by more than a line
    return build(n)


@pytest.fixture(scope="module", params=list(MODELS))
def served(request):
    name = request.param
    config = EngineConfig(kv_cache_bytes=CAP * MODELS[name], stall_timeout_s=3600, sample_timeout_s=60)
    llm = LLM(name, dtype="float32", engine_config=config)
    app = create_engine_app(name, loaded=llm.loaded, engine_config=config)
    with serve_on_loopback(app) as url:
        yield name, llm, openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=3600)


def test_an_8000_token_prompt_is_answered(served):
    name, llm, client = served
    assert client.models.list().data[0].model_extra["max_model_len"] == CAP
    messages = [{"role": "user", "content": _document(llm.loaded.tokenizer, TARGET) + "\n" + QUESTION}]
    fmt = llm.loaded.chat_format
    n_prompt = len(llm.loaded.tokenizer.encode(fmt.render(messages), add_special_tokens=fmt.add_special_tokens))
    assert TARGET <= n_prompt < CAP - 8
    start = time.monotonic()
    first, pieces, usage = None, [], None
    for chunk in client.chat.completions.create(model=name, messages=messages, max_tokens=8, temperature=0, stream=True,
                                                stream_options={"include_usage": True}):
        if chunk.usage is not None:
            usage = chunk.usage
        if chunk.choices and chunk.choices[0].delta.content:
            first = first if first is not None else time.monotonic() - start
            pieces.append(chunk.choices[0].delta.content)
    total = time.monotonic() - start
    print(f"\n{name}: prompt {usage.prompt_tokens} tokens, prefill (time to first token) {first:.1f} s, "
          f"{usage.completion_tokens} tokens in {total:.1f} s: {''.join(pieces)!r}")
    assert usage.prompt_tokens == n_prompt
    assert "7391" in "".join(pieces)


def test_a_prompt_over_the_cap_is_a_context_length_400(served):
    name, llm, client = served
    messages = [{"role": "user", "content": _document(llm.loaded.tokenizer, CAP + 200)}]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=name, messages=messages, max_tokens=4)
    assert info.value.code == "context_length_exceeded" and f"maximum context length is {CAP} tokens" in info.value.message
