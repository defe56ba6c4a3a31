"""The in-context chat format of base models (Gemma 3 270M): the prompt, the reply's opening space dropped from
the text (whole and streamed alike), and the turn markers that end a reply as stop strings next to the
client's own.

    LINK_HOME=.link LINK_DATASETS_DIR=../shared/data .venv/bin/python -m pytest -q tests/serving/text/test_in_context_chat.py
"""

from __future__ import annotations

import asyncio

import pytest

from serving.engine.llm_engine import EngineConfig
from serving.sampling.params import SamplingParams
from serving.text.chat_format import IN_CONTEXT_PREAMBLE, InContextChatFormat, TemplateChatFormat

FORMAT = InContextChatFormat()
MARKERS = ("\nUser:", "\nAssistant:", "\nTool result:", "\n\nUser")


def test_leading_system_text_comes_before_the_examples_and_the_prompt_ends_at_the_reply():
    prompt = FORMAT.render([{"role": "system", "content": "Reply with one word."}, {"role": "user", "content": "Sky colour?"},
                            {"role": "assistant", "content": "Blue."}, {"role": "system", "content": "Now two words."},
                            {"role": "user", "content": "Grass?"}])
    assert prompt == ("Reply with one word.\n\n" + IN_CONTEXT_PREAMBLE + "User: Sky colour?\nAssistant: Blue.\n\n"
                      "Now two words.\n\nUser: Grass?\nAssistant:")


def test_reply_params_add_the_turn_markers_after_the_clients_stops_and_drop_the_opening_space():
    params = FORMAT.reply_params(SamplingParams(stop=["END", "\nUser:"], max_tokens=8))
    assert params.stop == ("END", "\nUser:", "\nAssistant:", "\nTool result:", "\n\nUser")
    assert params.strip_leading_space and params.max_tokens == 8
    assert FORMAT.stop == MARKERS
    template = TemplateChatFormat("{{ messages[0]['content'] }}")
    plain = SamplingParams(stop=["x"])
    assert template.reply_params(plain) is plain  # a chat template adds nothing


# ---------------------------------------------------------------------------------------------
# The real Gemma 3 270M: offline, and through the gateway's local backend (the engine server's code path)
# ---------------------------------------------------------------------------------------------

MODEL = "gemma-3-270m"
QUESTIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Reply with one word."}, {"role": "user", "content": "What color is the sky?"}],
    [{"role": "user", "content": "What are three uses of a brick?"}],
]


@pytest.mark.slow
def test_real_gemma_replies_start_clean_and_end_at_the_next_turn(gemma3):
    outs = gemma3.chat(QUESTIONS, SamplingParams(temperature=0, max_tokens=60))
    tok = gemma3.tokenizer
    for out in outs:
        c = out.outputs[0]
        raw = tok.decode(c.token_ids)
        assert raw.startswith(" ") and not c.text[:1].isspace(), (raw, c.text)  # the model's space, not in the text
        assert raw[1:].startswith(c.text) and c.text
        assert c.finish_reason == "stop" and c.stop_reason in MARKERS + (None,), c  # a marker, or EOS
        assert not any(marker.strip() in c.text for marker in MARKERS), c.text
    assert "Paris" in outs[0].outputs[0].text


@pytest.mark.slow
def test_real_gemma_whole_and_streamed_agree_through_the_local_backend(gemma3):
    from link.backends.local import EnginePool, LocalBackend
    from link.config import ModelDeployment

    deployment = ModelDeployment(name=MODEL, kind="local", local=MODEL)
    # Four stop strings of the client's own: the format's markers do not count against OpenAI's limit of 4.
    # Every question greedy (each compared with the offline reply), and the first one sampled as well.
    bodies = [{"model": MODEL, "messages": q, "temperature": t, "seed": 3, "max_tokens": 48, "stop": ["@@", "##", "%%", "&&"]}
              for q, t in [*((q, 0.0) for q in QUESTIONS), (QUESTIONS[0], 0.8)]]

    async def go():
        # No stored kernel winners warmed up again for this engine: the session's are in effect process-wide.
        pool = EnginePool(engine_config=EngineConfig(tuned_kernels=False))
        pool.add_loaded(MODEL, gemma3.loaded)
        backend = LocalBackend(deployment, pool)
        try:
            return [(await backend.complete("chat", body), [c async for c in backend.stream("chat", {**body, "stream": True})])
                    for body in bodies]
        finally:
            await pool.aclose()

    offline = gemma3.chat(QUESTIONS, SamplingParams(temperature=0, max_tokens=48))
    for i, (whole, chunks) in enumerate(asyncio.run(go())):
        text = whole["choices"][0]["message"]["content"]
        streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
        assert streamed == text and text and not text[0].isspace(), (streamed, text)
        assert not any(marker.strip() in text for marker in MARKERS), text
        if bodies[i]["temperature"] == 0:
            assert text == offline[QUESTIONS.index(bodies[i]["messages"])].outputs[0].text
