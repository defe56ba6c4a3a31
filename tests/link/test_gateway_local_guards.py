"""The gateway's local backend against requests that used to wedge its engine, over real HTTP with the official
`openai` client: a gateway in a thread whose local model is the toy chat model (tests/serving/toy_model.py),
so each test runs in seconds on CPU.

- A `response_format` whose `$ref` cycles without writing anything, or a schema 300 levels deep, is a 400
  naming `response_format.json_schema.schema` (a forced tool's: `tools[i].function.parameters`), and the
  next request is answered.
- Guided decoding made slow on purpose stops its own request within `sample_timeout_s` (a 400, or an error
  event once streaming), while a concurrent request completes and the replica stays in rotation.
- /health is a 503 naming the local model while its engine's step loop is stuck, and 200 once it moves.

    LINK_HOME=.link LINK_DATASETS_DIR=../shared/data .venv/bin/python -m pytest -q tests/link/test_gateway_local_guards.py
"""

from __future__ import annotations

import dataclasses
import threading
import time

import httpx
import openai
import pytest

from serving.guided import automaton
from tests.link.gateway_launch import MASTER_KEY, gateway_settings, start_gateway_thread
from tests.serving.guided_cases import INDIRECT, SELF, nested, slowed
from tests.serving.toy_model import TOY_ENGINE, toy_chat_model

LOCAL = "smollm2-135m-instruct"  # the deployment's registry name; the toy model is served under it
ASK = [{"role": "user", "content": "Say something."}]
BUDGET = 0.2  # EngineConfig.sample_timeout_s, seconds per token


@pytest.fixture(scope="module")
def gateway(new_database_url, tmp_path_factory):
    from link.config import parse_config

    config = parse_config({"models": [{"name": LOCAL, "kind": "local", "local": LOCAL}]})
    settings = gateway_settings(new_database_url("sqlite"), tmp_path_factory.mktemp("home"))
    server = start_gateway_thread(settings, config)
    try:
        pool = server.state.engine_pool
        pool.engine_config = dataclasses.replace(TOY_ENGINE, sample_timeout_s=BUDGET, stall_timeout_s=0.5)
        pool.add_loaded(LOCAL, toy_chat_model(LOCAL))  # before any request, so the real model never loads
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def client(gateway):
    return openai.OpenAI(base_url=gateway.base_url, api_key=MASTER_KEY, max_retries=0, timeout=20)


# a schema 300 deep is a body nested deeper than the request boundary allows (64 levels): refused before the
# schema is read; a deep schema within the body limit is refused by the schema's own depth check (test_guided_checks)
@pytest.mark.parametrize("schema,param,code", [
    (SELF, "response_format.json_schema.schema", None), (INDIRECT, "response_format.json_schema.schema", None),
    (nested(300), None, "json_too_deep")], ids=["self", "indirect", "depth300"])
def test_bad_schemas_are_400s_at_once_and_the_model_answers_afterwards(client, schema, param, code):
    start = time.monotonic()
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=LOCAL, messages=ASK, max_tokens=8,
                                       response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    assert time.monotonic() - start < 1.0
    assert info.value.body["param"] == param and (code is None or info.value.body["code"] == code)
    answer = client.chat.completions.create(model=LOCAL, messages=ASK, max_tokens=8, temperature=0)
    assert answer.choices[0].finish_reason == "length" and answer.usage.completion_tokens == 8


def test_a_forced_tool_with_a_ref_cycle_is_a_400_naming_its_parameters(client):
    tools = [{"type": "function", "function": {"name": "ok", "parameters": {"type": "object"}}},
             {"type": "function", "function": {"name": "loop", "parameters": {
                 "type": "object", "properties": {"x": {"$ref": "#/$defs/a"}}, "$defs": SELF["$defs"]}}}]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=LOCAL, messages=ASK, max_tokens=8, tools=tools, tool_choice="required")
    assert info.value.body["param"] == "tools[1].function.parameters" and "#/$defs/a" in info.value.body["message"]


def test_a_slow_guided_request_is_stopped_and_a_concurrent_one_completes(gateway, client, monkeypatch):
    monkeypatch.setattr(automaton, "step", slowed(automaton.step, BUDGET / 4))
    plain = {}
    thread = threading.Thread(target=lambda: plain.update(answer=client.chat.completions.create(
        model=LOCAL, messages=ASK, max_tokens=24, temperature=0)))
    thread.start()
    start = time.monotonic()
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=LOCAL, messages=ASK, max_tokens=24, response_format={"type": "json_object"})
    assert time.monotonic() - start < BUDGET + 1.0
    assert info.value.body["code"] == "sampling_timeout" and info.value.body["param"] == "response_format"
    thread.join(20)
    assert plain["answer"].usage.completion_tokens == 24
    chunks = client.chat.completions.create(model=LOCAL, messages=ASK, max_tokens=24, stream=True,
                                            response_format={"type": "json_object"})
    with pytest.raises(openai.APIError, match="sample_timeout_s"):
        list(chunks)
    assert httpx.get(gateway.url + "/health").json()["status"] == "ok"  # the request's fault, not the replica's


def _health_until(gateway, status_code: int, timeout_s: float = 10.0) -> httpx.Response:
    deadline = time.monotonic() + timeout_s
    while (response := httpx.get(gateway.url + "/health", timeout=5)).status_code != status_code and time.monotonic() < deadline:
        time.sleep(0.05)
    return response


def test_health_names_the_local_model_while_its_step_loop_is_stuck_and_recovers(gateway, client):
    engine = gateway.state.engine_pool._states[LOCAL].engine.engine  # the LLMEngine behind the deployment
    step, release = engine.step, threading.Event()

    def stuck_step():  # the next step hangs until the test lets it go
        release.wait(30)
        return step()

    assert _health_until(gateway, 200).status_code == 200
    engine.step = stuck_step
    answer = {}
    thread = threading.Thread(target=lambda: answer.update(r=client.chat.completions.create(model=LOCAL, messages=ASK, max_tokens=4)))
    try:
        thread.start()
        stalled = _health_until(gateway, 503)
        assert stalled.status_code == 503, stalled.text
        assert stalled.json()["status"] == "degraded" and stalled.json()["unavailable_models"] == [LOCAL]
    finally:
        release.set()
        engine.step = step
    thread.join(30)
    assert answer["r"].usage.completion_tokens == 4
    assert _health_until(gateway, 200).json()["status"] == "ok"
