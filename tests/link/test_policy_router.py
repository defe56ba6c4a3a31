"""The `router` and `hybrid` policies with saved router files (routers.base.save_router) of a fixed-score test
router, behind the gateway with mock backends: the plan (argmax quality - lambda * cost, then the rest by the
objective), the decision in the log and headers, per-request metadata overrides, fallback past a dead
chosen model, validation; and `link route`, which prints the decision.
The test router (tests/link/router_fakes.py) predicts quality from a table: PLAIN rows, MATH rows for prompts
that mention "math"; its expected costs are fixed per model (COSTS).
"""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest
from typer.testing import CliRunner

from routers.base import ROUTERS
from tests.link.gateway_launch import MASTER_KEY, gateway_settings, mock_deployment, start_gateway_thread, write_config
from tests.link.mock_launch import refused_url, start_mock_thread
from tests.link.router_fakes import TableRouter, save_table_router

AUTH = {"Authorization": f"Bearer {MASTER_KEY}"}
@pytest.fixture(scope="module")
def router_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("routers")
    files = {"main": save_table_router(folder / "main.safetensors", ["small", "big"]),
             "fallback": save_table_router(folder / "fallback.safetensors", ["down", "small", "big"], cost_penalty=0.0,
                                          plain={"down": 0.95}),
             "hybrid": save_table_router(folder / "hybrid.safetensors", ["small", "big", "moa-col"])}
    yield files
    ROUTERS.pop(TableRouter.type, None)


def policies(files) -> list[dict]:
    return [
        {"name": "auto", "type": "router", "models": ["small", "big"], "options": {"path": str(files["main"])}},
        {"name": "auto-fb", "type": "router", "models": ["down", "small", "big"], "options": {"path": str(files["fallback"])}},
        {"name": "hybrid", "type": "hybrid", "models": ["small", "big"],
         "options": {"path": str(files["hybrid"]), "moa": {"models": ["small", "big"], "aggregator": "big"},
                     "moa_column": "moa-col", "cost_penalty": 0}},
        {"name": "hybrid-gain", "type": "hybrid", "models": ["small", "big"],
         "options": {"path": str(files["main"]), "moa": {"aggregator": "big"}, "moa_gain": 0.05, "cost_penalty": 0}},
        {"name": "predicted", "type": "cascade", "models": ["small", "big"],
         "options": {"scorer": "router", "path": str(files["main"]), "threshold": 0.5}},
    ]


def models(small_base: str, big_base: str) -> list[dict]:
    return [mock_deployment("small", small_base), mock_deployment("big", big_base), mock_deployment("down", refused_url())]


@pytest.fixture(scope="module")
def gateway(router_files, new_database_url, tmp_path_factory):
    from link.config import parse_config

    with start_mock_thread() as small, start_mock_thread() as big:
        config = parse_config({"models": models(small.api_base, big.api_base), "policies": policies(router_files)})
        settings = gateway_settings(new_database_url("sqlite"), tmp_path_factory.mktemp("home"))
        with start_gateway_thread(settings, config) as server:
            yield server


@pytest.fixture
def client(gateway):
    return openai.OpenAI(base_url=gateway.base_url, api_key=MASTER_KEY, max_retries=0, timeout=60)


def ask(client, model: str, text: str, **extra):
    raw = client.chat.completions.with_raw_response.create(model=model, messages=[{"role": "user", "content": text}],
                                                           max_tokens=20, **extra)
    return raw, raw.parse()


def decision_of(gateway, raw) -> dict:
    deadline = time.monotonic() + 10
    while True:  # a streamed request's row is queued just after its last byte
        gateway.flush_log()
        row = httpx.get(f"{gateway.url}/api/requests/{raw.headers['x-link-request-id']}", headers=AUTH)
        if row.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert row.status_code == 200, row.text
    return row.json()["decision"]


def test_the_objective_picks_the_model_and_orders_the_fallbacks(gateway, client):
    raw, answer = ask(client, "auto", "say hello")
    assert raw.headers["x-link-policy"] == "auto" and raw.headers["x-link-model"] == "small" and answer.model == "small"
    assert raw.headers["x-link-chosen"] == "small"
    decision = decision_of(gateway, raw)
    assert decision["type"] == "router" and decision["router"] == "table-test" and decision["rule"] == "lambda"
    assert decision["scores"] == pytest.approx({"small": 0.6, "big": 0.7})
    assert decision["expected_cost_usd"] == pytest.approx({"small": 0.001, "big": 0.01})
    assert decision["cost_penalty"] == 20.0 and decision["chosen"] == "small"
    assert decision["objective"] == pytest.approx({"small": 0.6 - 20 * 0.001, "big": 0.7 - 20 * 0.01})
    assert decision["candidates"] == ["small", "big"] and decision["routing_ms"] >= 0
    raw, _ = ask(client, "auto", "a math question")
    assert raw.headers["x-link-model"] == "big" and decision_of(gateway, raw)["candidates"] == ["big", "small"]


def test_metadata_overrides_lambda_and_the_cost_ceiling(gateway, client):
    raw, _ = ask(client, "auto", "say hello", metadata={"link_cost_penalty": "0"})
    assert raw.headers["x-link-model"] == "big" and decision_of(gateway, raw)["cost_penalty"] == 0.0
    raw, _ = ask(client, "auto", "a math question", metadata={"link_max_cost_usd": "0.005"})
    decision = decision_of(gateway, raw)
    assert raw.headers["x-link-model"] == "small" and decision["excluded"] == ["big"] and decision["max_cost_usd"] == 0.005
    assert decision["candidates"] == ["small"]
    assert decision["over_max_cost"] is False and "x-link-over-max-cost" not in raw.headers
    # a ceiling under every expected cost (small 0.001, big 0.01): the cheapest answers, and the answer says so
    raw, _ = ask(client, "auto", "a math question", metadata={"link_max_cost_usd": "0.0001"})
    decision = decision_of(gateway, raw)
    assert raw.headers["x-link-model"] == "small" and decision["excluded"] == ["big"] and decision["over_max_cost"] is True
    assert raw.headers["x-link-over-max-cost"] == "true"
    streamed = client.chat.completions.with_raw_response.create(   # a stream's headers say the same
        model="auto", messages=[{"role": "user", "content": "a math question"}], max_tokens=20, stream=True,
        metadata={"link_max_cost_usd": "0.0001"})
    assert streamed.headers["x-link-chosen"] == "small" and streamed.headers["x-link-over-max-cost"] == "true"
    assert "".join(c.choices[0].delta.content or "" for c in streamed.parse() if c.choices)
    with pytest.raises(openai.BadRequestError) as info:
        ask(client, "auto", "hi", metadata={"link_cost_penalty": "cheap"})
    assert info.value.body["param"] == "metadata.link_cost_penalty"
    with pytest.raises(openai.BadRequestError):
        ask(client, "auto", "hi", metadata={"link_max_cost_usd": "-1"})
    with pytest.raises(openai.BadRequestError) as info:
        ask(client, "auto", "hi", metadata={"link_cost_penalty": "1e300"})
    assert info.value.body["param"] == "metadata.link_cost_penalty" and "at most 1e+09" in info.value.body["message"]
    for misspelt in ("link_cost_penallty", "Link_Cost_Penalty", "link_max_cost"):   # a misspelt knob would be ignored
        with pytest.raises(openai.BadRequestError) as info:
            ask(client, "auto", "hi", metadata={misspelt: "5"})
        assert info.value.body["param"] == f"metadata.{misspelt}" and "did you mean" in info.value.body["message"]
    raw, _ = ask(client, "auto", "say hello", metadata={"link_id": "7", "team": "a"})   # the client's own tags pass
    assert raw.headers["x-link-model"] == "small"


@pytest.mark.parametrize("policy", ["auto", "hybrid", "predicted"])
def test_a_prompt_of_token_ids_is_refused_by_a_routing_policy(gateway, client, policy):
    for prompt in ([1, 2, 3], [[1, 2], [3]]):
        with pytest.raises(openai.BadRequestError) as info:
            client.completions.create(model=policy, prompt=prompt, max_tokens=5)
        assert info.value.body["param"] == "prompt" and "as text" in info.value.body["message"]
    assert client.completions.create(model=policy, prompt="say hello", max_tokens=5).choices[0].text
    assert client.completions.create(model=policy, prompt=["say hello"], max_tokens=5).choices[0].text


def test_a_dead_first_choice_falls_back_to_the_next_by_the_objective(gateway, client):
    raw, answer = ask(client, "auto-fb", "say hello")  # lambda 0: down 0.95 > big 0.7 > small 0.6; down refuses
    decision = decision_of(gateway, raw)
    assert decision["chosen"] == "down" and decision["candidates"] == ["down", "big", "small"]
    assert raw.headers["x-link-model"] == "big" and answer.model == "big"
    assert [a["model"] for a in decision["attempts"]] == ["down"]


def test_router_policy_validation(gateway, router_files, tmp_path):
    api = gateway.url + "/api/policies"
    cases = [({"name": "r1", "type": "router", "models": ["small"], "options": {}}, "options.path"),
             ({"name": "r2", "type": "router", "models": ["small"], "options": {"path": str(tmp_path / "none")}}, "options.path"),
             ({"name": "r3", "type": "router", "models": ["down", "small"], "options": {"path": str(router_files["main"])}}, "models"),
             ({"name": "r4", "type": "router", "models": ["small"], "options": {"path": str(router_files["main"]),
                                                                               "cost_penalty": -1}}, "options.cost_penalty"),
             ({"name": "r5", "type": "router", "models": ["small"], "options": {"path": str(router_files["main"]), "k": 3}}, "options.k"),
             ({"name": "h1", "type": "hybrid", "models": ["small"], "options": {"path": str(router_files["main"]),
                                                                              "moa_column": "nope"}}, "options.moa_column")]
    for body, param in cases:
        response = httpx.post(api, headers=AUTH, json=body)
        assert response.status_code == 400 and response.json()["error"]["param"] == param, (body, response.text)


def test_hybrid_plans_the_moa_when_its_column_wins(gateway, client):
    raw, answer = ask(client, "hybrid", "a math question")  # lambda 0: moa-col 0.99 beats big 0.9
    decision = decision_of(gateway, raw)
    assert decision["chosen"] == "moa" and raw.headers["x-link-model"] == "big" and answer.model == "big"
    assert raw.headers["x-link-chosen"] == "moa"
    assert decision["scores"] == pytest.approx({"small": 0.2, "big": 0.9, "moa": 0.99})
    assert decision["expected_cost_usd"]["moa"] == pytest.approx(0.02)
    assert [p["model"] for p in decision["moa"]["proposals"]] == ["small", "big"] and decision["moa"]["aggregator"] == "big"
    assert [c["model"] for c in decision["calls"]][-1] == "big" and len(decision["calls"]) == 3


def test_hybrid_without_a_column_adds_the_gain_to_the_best_proposer(gateway, client):
    raw, _ = ask(client, "hybrid-gain", "say hello")  # moa: max(0.6, 0.7) + 0.05 = 0.75 > big 0.7 at lambda 0
    decision = decision_of(gateway, raw)
    assert decision["chosen"] == "moa" and decision["scores"]["moa"] == pytest.approx(0.75)
    assert decision["expected_cost_usd"]["moa"] == pytest.approx(0.001 + 0.01 + 0.01)  # proposers + aggregator
    raw, _ = ask(client, "hybrid-gain", "say hello", metadata={"link_cost_penalty": "100"})
    decision = decision_of(gateway, raw)  # 0.75 - 2.1 < 0.6 - 0.1 = 0.5 and 0.7 - 1.0: small
    assert decision["chosen"] == "small" and raw.headers["x-link-model"] == "small" and "calls" not in decision and "moa" not in decision
    raw, _ = ask(client, "hybrid-gain", "say hello", metadata={"link_max_cost_usd": "0.0001"})
    decision = decision_of(gateway, raw)  # every option is expected over the ceiling: the cheapest, small
    assert decision["chosen"] == "small" and decision["over_max_cost"] is True and raw.headers["x-link-over-max-cost"] == "true"


def test_api_route_explains_a_cascade_scored_by_predicted_quality(gateway):
    body = {"model": "predicted", "messages": [{"role": "user", "content": "a math question"}]}
    explained = httpx.post(gateway.url + "/api/route", json=body, headers=AUTH, timeout=30).json()
    assert explained["models"] == ["big"] and explained["executed"] is True
    assert [(s["model"], s["status"]) for s in explained["steps"]] == [("small", "skipped"), ("big", "answers")]
    assert explained["steps"][0]["predicted_quality"] == pytest.approx(0.2) and explained["steps"][0]["threshold"] == 0.5


def test_link_route_prints_the_decision(router_files, tmp_path):
    from cli.app import app

    config = write_config(tmp_path / "link.yaml", models("http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1"),
                          policies(router_files))
    runner = CliRunner()
    result = runner.invoke(app, ["route", "say hello", "--policy", "auto", "--config", str(config)])
    assert result.exit_code == 0, result.output
    assert "predicted quality" in result.output and "expected cost" in result.output
    assert "0.6000" in result.output and "0.001" in result.output and "chosen" in result.output
    assert "plan: small -> big" in result.output and "lambda (cost penalty) = 20" in result.output
    result = runner.invoke(app, ["route", "a math question", "-p", "auto", "-c", str(config), "--cost-penalty", "100", "--json"])
    assert result.exit_code == 0, result.output
    explained = json.loads(result.stdout)
    assert explained["models"] == ["small", "big"] and explained["decision"]["cost_penalty"] == 100.0
    result = runner.invoke(app, ["route", "hi", "-p", "auto", "-c", str(config), "--max-cost-usd", "0"])
    assert result.exit_code == 0, result.output
    assert "every candidate is expected to cost more than the ceiling of 0 USD: the cheapest, small, answers" in \
        " ".join(result.output.split())
    # a cascade scored by predicted quality: small 0.6 >= 0.5 answers "hello"; on math small 0.2 is skipped
    result = runner.invoke(app, ["route", "say hello", "-p", "predicted", "-c", str(config)])
    assert result.exit_code == 0, result.output
    assert "cascade step small: predicted quality 0.6000, threshold 0.5: answers" in result.output
    assert "cascade step big (the last): not reached" in result.output and "models called: small\n" in result.output
    assert [s["status"] for s in json.loads(runner.invoke(app, ["route", "say hello", "-p", "predicted", "-c", str(config),
                                                                 "--json"]).stdout)["steps"]] == ["answers", "not reached"]
    result = runner.invoke(app, ["route", "a math question", "-p", "predicted", "-c", str(config), "--json"])
    explained = json.loads(result.stdout)
    assert explained["models"] == ["big"] and [s["status"] for s in explained["steps"]] == ["skipped", "answers"]
    assert explained["steps"][0]["predicted_quality"] == pytest.approx(0.2)
    result = runner.invoke(app, ["route", "hi", "-p", "hybrid-gain", "-c", str(config)])
    assert result.exit_code == 0 and "Mixture-of-Agents: proposers small, big -> aggregator big" in result.output
    for flag, value in (("--cost-penalty", "-1"), ("--cost-penalty", "1e10"), ("--max-cost-usd", "2e6")):
        result = runner.invoke(app, ["route", "hi", "-p", "auto", "-c", str(config), flag, value])
        assert result.exit_code == 2 and f"{flag} must be a number in [0, " in result.output, result.output
    result = runner.invoke(app, ["route", "hi", "-p", "nope", "-c", str(config)])
    assert result.exit_code == 2 and "no policy or model named 'nope'" in result.output
