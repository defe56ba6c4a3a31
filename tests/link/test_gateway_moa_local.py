"""`link/moa` of the embedded default with the real local models (smollm2-135m-instruct and the two
Qwen2.5-Coder models proposing, the 0.5B aggregating), through the official `openai` client, whole and streamed; `link/auto` with
the shipped router file (routers/trained/link-auto.safetensors) on a GSM8K test question; and a MoA that
also has a slow proposer (a mock answering after 3 s) and a broken one (a refused port): keep-alive
comments arrive before the first content chunk, the broken proposer is dropped, the answer still comes,
and the request log holds every proposer's output and the cost of every call at the nominal local prices.

Answers are short (MAX_TOKENS: each proposer and the aggregator write at most that many tokens): what is tested is
the MoA's plumbing and accounting, not the answers' quality. The module's gateway loads the three local models before
the first test (`warm_up`), so no proposer's deadline includes a model load. The engines read kernel winners from a
table of this module's own (LINK_COMPILE_DB, empty) and tune nothing in the background (`local_auto_tune` off), so a
test does not pay for torch.compile warm-ups of winners that other tests stored in the shared $LINK_HOME.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
import yaml

from tests.link.gateway_launch import MASTER_KEY, gateway_settings, logged_request, mock_deployment, start_gateway_thread
from tests.link.mock_launch import refused_url, start_mock_thread

pytestmark = pytest.mark.slow
QUESTION = [{"role": "user", "content": "Natalia sold clips to 48 of her friends in April, and then she sold half as "
                                        "many clips in May. How many clips did Natalia sell altogether in April and May?"}]
LOCAL = ("smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct")  # link/moa's proposers
AGGREGATOR = "qwen2.5-coder-0.5b-instruct"
AUTO = ("smollm2-135m-instruct",)  # link/auto's router file knows smollm2 and gemma; smollm2 is served
FAULTS = ("smollm2-135m-instruct",)  # moa-faults' local proposer (the slow and broken ones are the point)
MAX_TOKENS = 8  # of the default MoA's answers: the proposers' cap too (the request's max_tokens, when smaller)


@pytest.fixture(scope="module")
def gateway(new_database_url, tmp_path_factory):
    from link.config import DEFAULT_CONFIG_YAML, default_router_path, parse_config

    home = tmp_path_factory.mktemp("home")
    with pytest.MonkeyPatch.context() as patch, start_mock_thread(mode="hang", hang_s=3.0) as slow:
        patch.setenv("LINK_COMPILE_DB", str(home / "winners.sqlite"))  # no stored winners, none written
        data = yaml.safe_load(DEFAULT_CONFIG_YAML)
        data["models"] += [mock_deployment("slow", slow.api_base, timeout_s=60.0, first_token_timeout_s=30.0),
                           mock_deployment("broken", refused_url())]
        assert default_router_path().is_file(), "routers/trained/link-auto.safetensors is shipped (make link-auto)"
        data["policies"].append({"name": "link/auto", "type": "router", "models": list(AUTO),
                                 "options": {"path": str(default_router_path())}})
        data["policies"].append({"name": "moa-faults", "type": "moa", "models": [*FAULTS, "slow", "broken"],
                                 "options": {"aggregator": "smollm2-135m-instruct", "proposer_max_tokens": 16}})
        settings = gateway_settings(new_database_url("sqlite"), home, local_auto_tune=False)
        with start_gateway_thread(settings, parse_config(data, "test")) as server:
            warm_up(server, LOCAL)
            yield server


def warm_up(gateway, models: tuple[str, ...]) -> None:
    """One token from each model, side by side: the models load here, not inside the MoA proposers' deadline (the
    embedded default's 120 s, which three models loading at once on a busy 2-core machine have missed)."""
    client = openai.OpenAI(base_url=gateway.base_url, api_key=MASTER_KEY, max_retries=0, timeout=600)
    with ThreadPoolExecutor(len(models)) as pool:
        list(pool.map(lambda model: client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=1), models))


@pytest.fixture(scope="module")
def client(gateway):
    return openai.OpenAI(base_url=gateway.base_url, api_key=MASTER_KEY, max_retries=0, timeout=600)


def nominal_cost(calls: list[dict]) -> float:
    """USD of the calls at the embedded default's nominal prices (per million tokens, input = output)."""
    price = {"smollm2-135m-instruct": 0.02, "qwen2.5-coder-0.5b-instruct": 0.08, "qwen2.5-coder-1.5b-instruct": 0.24, "slow": None}
    total = 0.0
    for call in calls:
        if call["model"] == "slow":  # a mock deployment: 1000 / 2000 USD per million
            total += (call["prompt_tokens"] * 1000 + call["completion_tokens"] * 2000) / 1e6
        else:
            total += (call["prompt_tokens"] + call["completion_tokens"]) * price[call["model"]] / 1e6
    return total


def test_default_moa_answers_whole_with_the_local_models(gateway, client):
    raw = client.chat.completions.with_raw_response.create(model="link/moa", messages=QUESTION, max_tokens=MAX_TOKENS,
                                                           temperature=0)
    answer = raw.parse()
    assert raw.headers["x-link-policy"] == "link/moa" and raw.headers["x-link-model"] == AGGREGATOR
    assert answer.model == AGGREGATOR and answer.choices[0].message.content
    row = logged_request(gateway, raw.headers["x-link-request-id"])
    proposals = row["decision"]["moa"]["proposals"]
    assert [p["model"] for p in proposals] == list(LOCAL) and all(p["ok"] and p["text"] for p in proposals)
    calls = row["decision"]["calls"]
    assert sorted(c["model"] for c in calls) == sorted([*LOCAL, AGGREGATOR])
    aggregator = calls[-1]   # accounted last: it starts once every proposer is done
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == \
        (aggregator["prompt_tokens"], aggregator["completion_tokens"]) and answer.usage.completion_tokens <= MAX_TOKENS
    assert answer.usage.link_billed["completion_tokens"] == sum(c["completion_tokens"] for c in calls)
    assert answer.usage.link_billed["cost_usd"] == pytest.approx(row["cost_usd"]) and answer.usage.link_billed["calls"] == 4
    assert row["cost_usd"] == pytest.approx(nominal_cost(calls)) and row["cost_usd"] > 0
    assert float(raw.headers["x-link-cost-usd"]) == pytest.approx(row["cost_usd"], abs=1e-9)


def test_streamed_moa_keeps_alive_drops_the_broken_proposer_and_logs_every_output(gateway, client):
    with client.chat.completions.with_streaming_response.create(
            model="moa-faults", messages=QUESTION, max_tokens=24, temperature=0, stream=True,
            stream_options={"include_usage": True}) as raw:
        assert raw.headers["x-link-model"] == "smollm2-135m-instruct"
        request_id = raw.headers["x-link-request-id"]
        lines = [line for line in raw.iter_lines() if line]
    first_data = next(i for i, line in enumerate(lines) if line.startswith("data: "))
    assert first_data >= 1 and set(lines[:first_data]) == {": keep-alive"}  # the slow proposer alone takes 3 s
    assert lines[-1] == "data: [DONE]"
    row = logged_request(gateway, request_id)
    assert row["status"] == "ok" and row["ttft_ms"] > 3000
    proposals = {p["model"]: p for p in row["decision"]["moa"]["proposals"]}
    assert set(proposals) == {*FAULTS, "slow", "broken"} and row["decision"]["moa"]["num_dropped"] == 1
    assert not proposals["broken"]["ok"] and "BackendUnavailable" in proposals["broken"]["error"]
    for name in (*FAULTS, "slow"):
        assert proposals[name]["ok"] and proposals[name]["text"]
    assert row["cost_usd"] == pytest.approx(nominal_cost(row["decision"]["calls"]))


def test_streamed_and_whole_default_moa_through_the_openai_client(gateway, client):
    chunks = list(client.chat.completions.create(model="link/moa", messages=QUESTION, max_tokens=MAX_TOKENS,
                                                 temperature=0, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and {c.model for c in chunks} == {AGGREGATOR}
    assert chunks[-1].usage.completion_tokens > 0 and chunks[-1].usage.prompt_tokens > 0


def test_link_auto_routes_a_gsm8k_question_whole_and_streamed_with_the_decision_logged(gateway, client):
    raw = client.chat.completions.with_raw_response.create(model="link/auto", messages=QUESTION, max_tokens=16, temperature=0)
    answer = raw.parse()
    chosen = raw.headers["x-link-model"]
    assert raw.headers["x-link-policy"] == "link/auto" and chosen in AUTO and answer.model == chosen
    decision = logged_request(gateway, raw.headers["x-link-request-id"])["decision"]
    # the router scores every model it was trained on (smollm2 and gemma); only the served ones are candidates
    assert decision["type"] == "router" and decision["chosen"] == chosen and set(decision["scores"]) >= set(AUTO)
    # the rule: argmax over the candidates of predicted quality - lambda * expected cost, lambda the file's own
    objective = {m: decision["scores"][m] - decision["cost_penalty"] * decision["expected_cost_usd"][m] for m in AUTO}
    assert {m: decision["objective"][m] for m in AUTO} == pytest.approx(objective)
    assert chosen == max(objective, key=objective.get)
    assert decision["cost_penalty"] > 0 and all(0 <= q <= 1 for q in decision["scores"].values())
    with client.chat.completions.with_streaming_response.create(
            model="link/auto", messages=QUESTION, max_tokens=16, temperature=0, stream=True) as streamed:
        assert streamed.headers["x-link-model"] == chosen  # the same prompt, the same decision
        lines = [line for line in streamed.iter_lines() if line.startswith("data: ")]
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert lines[-1] == "data: [DONE]" and text == answer.choices[0].message.content
