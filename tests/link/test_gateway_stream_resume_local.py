"""Streams that survive, on the real local engine: a backend dies after 20 words, and SmolLM2 or Qwen2.5-Coder 0.5B
continues the answer; the streamed text equals the prefix followed by the model's own greedy continuation of it,
computed independently as a completion of the rendered prompt and the prefix.

It holds Qwen 0.5B in the gateway's engine pool, so `make test` runs it in its second pytest process with the other
Qwen tests (Makefile `QWEN_TESTS`), away from what the long first run holds.

    .venv/bin/python -m pytest -q tests/link/test_gateway_stream_resume_local.py
"""

from __future__ import annotations

import httpx
import pytest

from tests.link.gateway_launch import gateway_settings, logged_request, mock_deployment, start_gateway_thread
from tests.link.test_gateway_stream_resume import AUTH, PREFIX, dying_backend, stream, wait_in_rotation

LOCAL_MODELS = ["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct"]


@pytest.fixture(scope="module")
def local_gateway(new_database_url, tmp_path_factory):
    from link.config import parse_config

    dying = dying_backend()
    models = [mock_deployment("dying", dying.api_base, input_cost_per_million=0.0, output_cost_per_million=0.0),
              *({"name": name, "kind": "local", "local": name} for name in LOCAL_MODELS)]
    policies = [{"name": f"survive-{name}", "type": "fallback", "models": ["dying", name],
                 "options": {"continue_on_failure": True}} for name in LOCAL_MODELS]
    settings = gateway_settings(new_database_url("sqlite"), tmp_path_factory.mktemp("home"), eject_cooldown_s=0.0,
                                health_interval_s=0.1)
    try:
        with start_gateway_thread(settings, parse_config({"models": models, "policies": policies})) as server:
            yield server
    finally:
        dying.stop()


@pytest.mark.slow
@pytest.mark.parametrize("model", LOCAL_MODELS)
def test_a_local_model_continues_with_its_greedy_continuation(local_gateway, model):
    wait_in_rotation(local_gateway, "dying")
    messages = [{"role": "user", "content": "Tell me about Paris."}]
    response, events = stream(local_gateway, "/chat/completions", {"model": f"survive-{model}", "messages": messages,
                                                                   "max_tokens": 40, "temperature": 0,
                                                                   "stream_options": {"include_usage": True}},
                               timeout_s=600)  # Qwen's GGUF is assembled on first use (about 45 s)
    assert response.status_code == 200 and not any("error" in e for e in events), events[-3:]
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
    assert text.startswith(PREFIX) and len(text) > len(PREFIX)

    # Independently: the model's greedy continuation of the prefix, as a completion of the prompt's tokens (the chat
    # template's usual rendering, a new assistant turn, followed by the prefix).
    loaded = local_gateway.state.engine_pool._states[model].loaded
    fmt = loaded.chat_format
    ids = loaded.tokenizer.encode(fmt.render(messages) + PREFIX, add_special_tokens=fmt.add_special_tokens)
    whole = httpx.post(local_gateway.base_url + "/completions", headers=AUTH, timeout=600,
                       json={"model": model, "prompt": ids, "max_tokens": 20, "temperature": 0}).json()
    assert text == PREFIX + whole["choices"][0]["text"]
    usage = events[-1]["usage"]  # the dead call's 20 chunks, then the engine's own count of the same greedy run
    assert usage["link_billed"]["calls"] == 2 and usage["completion_tokens"] == 20 + whole["usage"]["completion_tokens"]
    row = logged_request(local_gateway, response.headers["x-link-request-id"])
    assert row["status"] == "ok" and row["model"] == model and [c["model"] for c in row["decision"]["calls"]] == ["dying", model]
