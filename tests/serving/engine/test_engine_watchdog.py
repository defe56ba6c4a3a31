"""No single request can hold the engine, and /health says when it is held: on the toy chat model (toy_model.py),
the real engine, and the engine server over loopback HTTP with the official `openai` client.

- A `$ref` cycle or a 300-deep schema (refused by the request boundary) is a 400 at once, and the engine answers the
  next request.
- Guided decoding made slow on purpose (every automaton step sleeps) stops its own request within
  `EngineConfig.sample_timeout_s`, while a request in the same steps completes; slow plain sampling is
  caught once it returns.
- A step loop that makes no progress turns /health into a 503 naming the model, and back once it moves.

    LINK_HOME=.link LINK_DATASETS_DIR=../shared/data .venv/bin/python -m pytest -q tests/serving/engine/test_engine_watchdog.py
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import types

import httpx
import openai
import pytest
import torch

from serving.api.server import create_engine_app
from serving.engine.llm_engine import LLMEngine
from serving.engine.sample_budget import choose_token
from serving.engine.sequence import Sequence
from serving.errors import SamplingTimeoutError
from serving.guided import automaton
from serving.sampling.params import SamplingParams
from tests.serving.guided_cases import INDIRECT, SELF, nested, slowed
from tests.serving.loopback import serve_on_loopback
from tests.serving.toy_model import TOY_ENGINE, toy_chat_model

NAME = "toy-chat"
BUDGET = 0.2  # seconds per token
CONFIG = dataclasses.replace(TOY_ENGINE, sample_timeout_s=BUDGET, stall_timeout_s=0.5)
ASK = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def toy():
    return toy_chat_model(NAME)


@pytest.fixture(scope="module")
def server(toy):
    app = create_engine_app(NAME, loaded=toy, engine_config=CONFIG)
    with serve_on_loopback(app) as url:
        yield url, openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=20)


@pytest.fixture
def slow_guided_steps(monkeypatch):
    """Each character the JSON automaton steps costs BUDGET / 4: one guided token takes seconds to choose."""
    monkeypatch.setattr(automaton, "step", slowed(automaton.step, BUDGET / 4))


def _json_schema(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


# a schema 300 deep is a body nested deeper than the request boundary allows (64 levels): refused before the
# schema is read; a deep schema within the body limit is refused by the schema's own depth check (test_guided_checks)
@pytest.mark.parametrize("schema,param,code", [
    (SELF, "response_format.json_schema.schema", None), (INDIRECT, "response_format.json_schema.schema", None),
    (nested(300), None, "json_too_deep")], ids=["self", "indirect", "depth300"])
def test_bad_schemas_are_400s_at_once_and_the_engine_answers_afterwards(server, schema, param, code):
    url, client = server
    start = time.monotonic()
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=NAME, messages=ASK, max_tokens=8, response_format=_json_schema(schema))
    assert time.monotonic() - start < 1.0
    assert info.value.body["param"] == param and info.value.body["type"] == "invalid_request_error"
    assert code is None or info.value.body["code"] == code
    answer = client.chat.completions.create(model=NAME, messages=ASK, max_tokens=8, temperature=0)
    assert answer.choices[0].finish_reason == "length" and answer.usage.completion_tokens == 8
    assert httpx.get(url + "/health").json() == {"status": "ok"}


def test_a_slow_guided_step_stops_its_request_within_the_budget_and_the_other_completes(toy, slow_guided_steps):
    engine = LLMEngine(toy, CONFIG)
    prompt = toy.tokenizer.encode("user: hi\nassistant:")
    engine.add_request("guided", prompt, SamplingParams(max_tokens=2, n=2, temperature=0.8, seed=1, guided_json='{"type": "object"}'))
    engine.add_request("plain", prompt, SamplingParams(max_tokens=8, temperature=0))
    final, slowest = {}, 0.0
    while engine.has_unfinished_requests:
        start = time.monotonic()
        final.update((out.request_id, out) for out in engine.step() if out.finished)
        slowest = max(slowest, time.monotonic() - start)
    assert slowest < BUDGET + 0.5  # one automaton step past the deadline at most, and the toy model's step
    stopped = final["guided"]
    assert isinstance(stopped.error, SamplingTimeoutError) and stopped.error.param == "response_format"
    assert [c.finish_reason for c in stopped.outputs] == ["abort", "abort"] and "sample_timeout_s" in str(stopped.error)
    plain = final["plain"].outputs[0]
    assert plain.finish_reason == "length" and len(plain.token_ids) == 8 and final["plain"].error is None
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_over_http_a_stopped_request_is_a_400_or_an_error_event(server, slow_guided_steps):
    url, client = server
    plain = {}
    thread = threading.Thread(target=lambda: plain.update(answer=client.chat.completions.create(
        model=NAME, messages=ASK, max_tokens=24, temperature=0)))
    thread.start()
    start = time.monotonic()
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=NAME, messages=ASK, max_tokens=24, response_format={"type": "json_object"})
    assert time.monotonic() - start < BUDGET + 1.0
    assert info.value.body["code"] == "sampling_timeout" and info.value.body["param"] == "response_format"
    thread.join(20)
    assert plain["answer"].choices[0].finish_reason == "length" and plain["answer"].usage.completion_tokens == 24
    body = {"model": NAME, "messages": ASK, "max_tokens": 24, "stream": True, "response_format": {"type": "json_object"}}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=20) as response:
        events = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert response.status_code == 200 and events[-1] == "data: [DONE]"
    assert json.loads(events[-2][len("data: "):])["error"]["code"] == "sampling_timeout"


def test_slow_plain_sampling_is_measured_once_it_returns():
    def sample(logits, prompt_ids, output_ids):
        time.sleep(2 * BUDGET)  # a logits processor far slower than the budget
        return 3

    state = types.SimpleNamespace(guide=None, sampler=types.SimpleNamespace(params=SamplingParams(), sample=sample))
    seq = Sequence(0, [1, 2, 3])
    with pytest.raises(SamplingTimeoutError, match=f"budget of {BUDGET:g} s per token") as info:
        choose_token(state, seq, torch.zeros(8), BUDGET)
    assert info.value.param is None
    assert choose_token(state, seq, torch.zeros(8), 4 * BUDGET) == 3


def _health_until(url: str, status_code: int, timeout_s: float = 10.0) -> httpx.Response:
    deadline = time.monotonic() + timeout_s
    while (response := httpx.get(url + "/health", timeout=5)).status_code != status_code and time.monotonic() < deadline:
        time.sleep(0.05)
    return response


def test_health_is_503_naming_the_model_while_the_step_loop_is_stuck_and_recovers(toy):
    app = create_engine_app(NAME, loaded=toy, engine_config=CONFIG, step_in_thread=True)
    release = threading.Event()
    with serve_on_loopback(app) as url:
        engine = app.state.engine_state.engine.engine
        step = engine.step

        def stuck_step():  # the first step hangs until the test lets it go
            release.wait(30)
            return step()

        engine.step = stuck_step
        answer = {}
        body = {"model": NAME, "messages": ASK, "max_tokens": 4}
        thread = threading.Thread(target=lambda: answer.update(r=httpx.post(url + "/v1/chat/completions", json=body, timeout=30)))
        try:
            assert httpx.get(url + "/health").json() == {"status": "ok"}
            thread.start()
            stalled = _health_until(url, 503)
            assert stalled.status_code == 503, stalled.text
            assert stalled.json()["status"] == "degraded" and stalled.json()["model"] == NAME
            assert "stalled" in stalled.json()["detail"]
        finally:
            release.set()
        thread.join(30)
        assert answer["r"].status_code == 200
        assert _health_until(url, 200).json() == {"status": "ok"}
