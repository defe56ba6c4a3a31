"""The `cascade` policy through the gateway with mock backends: a judge that rejects (the mock echoes, so
it never says yes) escalates, one that approves (a mock with the fixed reply "yes") accepts the cheap answer;
the router's predicted quality accepts or skips the cheap step; only the final answer is streamed; a failing
cheap step escalates; every call is accounted and logged. `usage` is the answering step's own call (within
`max_tokens`); `usage.link_billed`, the log row and `x-link-cost-usd` are the sums over every call.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from routers.base import ROUTERS
from tests.link.gateway_launch import MASTER_KEY, gateway_settings, logged_request, mock_deployment, start_gateway_thread
from tests.link.mock_launch import refused_url, start_mock_thread
from tests.link.router_fakes import TableRouter, save_table_router

AUTH = {"Authorization": f"Bearer {MASTER_KEY}"}


@pytest.fixture(scope="module")
def gateway(new_database_url, tmp_path_factory):
    from link.config import parse_config

    path = save_table_router(tmp_path_factory.mktemp("routers") / "r.safetensors", ["small", "big"])
    checker = save_echo_checker(tmp_path_factory.mktemp("checkers") / "c.safetensors")
    with start_mock_thread() as small, start_mock_thread() as big, start_mock_thread(reply="yes") as yes:
        models = [mock_deployment("small", small.api_base), mock_deployment("big", big.api_base),
                  mock_deployment("down", refused_url()), mock_deployment("yes-judge", yes.api_base)]
        policies = [
            {"name": "judged", "type": "cascade", "models": ["small", "big"], "options": {"judge": "small", "threshold": 0.5}},
            {"name": "approved", "type": "cascade", "models": ["small", "big"],
             "options": {"judge": "yes-judge", "judge_logprobs": False}},
            {"name": "predicted", "type": "cascade", "models": ["small", "big"],
             "options": {"scorer": "router", "path": str(path), "threshold": 0.5}},
            {"name": "answered", "type": "cascade", "models": ["small", "big"],
             "options": {"scorer": "answer", "checker": str(checker), "threshold": 0.5}},
            {"name": "cheap-down", "type": "cascade", "models": ["down", "big"], "options": {"judge": "big"}},
            {"name": "last-down", "type": "cascade", "models": ["small", "down"], "options": {"judge": "small"}},
        ]
        config = parse_config({"models": models, "policies": policies})
        settings = gateway_settings(new_database_url("sqlite"), tmp_path_factory.mktemp("home"))
        with start_gateway_thread(settings, config) as server:
            yield server
    ROUTERS.pop(TableRouter.type, None)


def save_echo_checker(path):
    """An answer checker fitted on the mock's echoes of sums, right exactly when the sum is."""
    import numpy as np

    from routers.answer_check import AnswerChecker, save_answer_checker

    rng = np.random.default_rng(0)
    prompts, answers, correct = [], [], []
    for _ in range(300):
        a, b = (int(v) for v in rng.integers(2, 90, size=2))
        ok = bool(rng.random() > 0.3)
        prompts.append(f"{a} + {b} = {a + b if ok else a + b + 3}")
        answers.append(f"You said: {prompts[-1]}")
        correct.append(float(ok))
    return save_answer_checker(AnswerChecker(num_components=0, num_rounds=60).fit(prompts, answers, correct), path)


@pytest.fixture
def client(gateway):
    return openai.OpenAI(base_url=gateway.base_url, api_key=MASTER_KEY, max_retries=0, timeout=60)


def ask(client, model: str, text: str, max_tokens: int = 20):
    raw = client.chat.completions.with_raw_response.create(model=model, messages=[{"role": "user", "content": text}],
                                                           max_tokens=max_tokens)
    return raw, raw.parse()


def billed(calls: list[dict]) -> dict:
    """The `usage.link_billed` of a request that made `calls` (its log row's decision["calls"])."""
    prompt, completion = sum(c["prompt_tokens"] for c in calls), sum(c["completion_tokens"] for c in calls)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "cost_usd": pytest.approx(sum(c["cost_usd"] for c in calls), rel=1e-9), "calls": len(calls)}




def test_a_rejecting_judge_escalates_and_every_call_is_charged(gateway, client):
    raw, answer = ask(client, "judged", "two plus three")
    assert raw.headers["x-link-policy"] == "judged" and raw.headers["x-link-model"] == "big" and answer.model == "big"
    assert answer.choices[0].message.content == "You said: two plus three"
    row = logged_request(gateway, raw.headers["x-link-request-id"])
    steps = row["decision"]["cascade"]["steps"]
    assert [(s["model"], s["score"], s["accepted"]) for s in steps] == [("small", 0.0, False), ("big", None, True)]
    calls = row["decision"]["calls"]
    assert [c["model"] for c in calls] == ["small", "small", "big"]  # step, judge verdict, final step
    assert row["cost_usd"] == pytest.approx(sum(c["cost_usd"] for c in calls)) and row["model"] == "big"
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (3, 5)   # big's: its message, its answer
    assert answer.usage.link_billed == billed(calls)
    assert float(raw.headers["x-link-cost-usd"]) == pytest.approx(row["cost_usd"])


def test_predicted_quality_accepts_or_skips_the_cheap_step(gateway, client):
    raw, answer = ask(client, "predicted", "say hello")  # small predicted 0.6 >= 0.5: it answers
    assert raw.headers["x-link-model"] == "small" and answer.model == "small"
    row = logged_request(gateway, raw.headers["x-link-request-id"])
    assert row["decision"]["cascade"]["answered_by"] == "small" and [c["model"] for c in row["decision"]["calls"]] == ["small"]
    raw, answer = ask(client, "predicted", "a math question")  # small predicted 0.2: skipped, never called
    row = logged_request(gateway, raw.headers["x-link-request-id"])
    assert raw.headers["x-link-model"] == "big" and [c["model"] for c in row["decision"]["calls"]] == ["big"]
    assert row["decision"]["cascade"]["steps"][0]["skipped"] is True


def test_an_answer_checker_accepts_right_sums_and_escalates_wrong_ones(gateway, client):
    raw, answer = ask(client, "answered", "17 + 25 = 42")
    assert raw.headers["x-link-model"] == "small" and answer.choices[0].message.content == "You said: 17 + 25 = 42"
    row = logged_request(gateway, raw.headers["x-link-request-id"])
    cascade = row["decision"]["cascade"]
    assert cascade["scorer"] == "answer" and cascade["answered_by"] == "small" and cascade["steps"][0]["score"] > 0.5
    assert [c["model"] for c in row["decision"]["calls"]] == ["small"]
    raw, answer = ask(client, "answered", "17 + 25 = 45")  # the cheap answer's sum is wrong: escalated, both paid
    row = logged_request(gateway, raw.headers["x-link-request-id"])
    assert raw.headers["x-link-model"] == "big" and row["decision"]["cascade"]["steps"][0]["score"] < 0.5
    assert [c["model"] for c in row["decision"]["calls"]] == ["small", "big"]


def test_only_the_final_answer_is_streamed(gateway, client):
    for policy, text, final in (("predicted", "say hello", "small"), ("judged", "say hello", "big")):
        with client.chat.completions.with_streaming_response.create(
                model=policy, messages=[{"role": "user", "content": text}], max_tokens=20, stream=True,
                stream_options={"include_usage": True}) as raw:
            assert raw.headers["x-link-model"] == final  # a cascade stream starts once its final model answers
            lines = [line for line in raw.iter_lines() if line.startswith("data: ") and line != "data: [DONE]"]
        events = [json.loads(line[6:]) for line in lines]
        assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"]) == f"You said: {text}"
        assert {e["model"] for e in events} == {final}
        row = logged_request(gateway, raw.headers["x-link-request-id"])
        calls = row["decision"]["calls"]
        assert calls[-1]["model"] == final and events[-1]["usage"]["completion_tokens"] == calls[-1]["completion_tokens"]
        assert events[-1]["usage"]["link_billed"] == billed(calls)
        assert row["status"] == "ok" and row["stream"] is True


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_usage_is_the_answering_steps_own_within_max_tokens(gateway, client, stream):
    """max_tokens = 3 cuts every answer at "You said: two": a rejected cheap step, its judge's verdict and the final
    step are billed (link_billed, the row, the cost header), the answer's usage is the final step's alone; and an
    approved cheap step's answer reports its own call, not the judge's that came after it."""
    request = dict(messages=[{"role": "user", "content": "two plus three"}], max_tokens=3)
    for policy, steps, answering in (("judged", ["small", "small", "big"], 2), ("approved", ["small", "yes-judge"], 0)):
        if stream:
            with client.chat.completions.with_streaming_response.create(
                    model=policy, **request, stream=True, stream_options={"include_usage": True}) as raw:
                chunks = list(raw.parse())
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            usage = chunks[-1].usage
        else:
            raw, answer = ask(client, policy, request["messages"][0]["content"], max_tokens=3)
            text, usage = answer.choices[0].message.content, answer.usage
        assert text == "You said: two" and raw.headers["x-link-model"] == steps[answering]
        row = logged_request(gateway, raw.headers["x-link-request-id"])
        calls = row["decision"]["calls"]
        assert [c["model"] for c in calls] == steps
        assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (3, 3, 6) == \
            (calls[answering]["prompt_tokens"], calls[answering]["completion_tokens"], 6)
        assert usage.completion_tokens <= request["max_tokens"] < usage.link_billed["completion_tokens"]
        assert usage.link_billed == billed(calls)
        assert row["cost_usd"] == pytest.approx(usage.link_billed["cost_usd"], rel=1e-9)
        if not stream:
            assert float(raw.headers["x-link-cost-usd"]) == pytest.approx(row["cost_usd"], abs=1e-9)


def test_a_failing_cheap_step_escalates_and_a_failing_last_step_is_an_error(gateway, client):
    raw, answer = ask(client, "cheap-down", "hello")
    assert raw.headers["x-link-model"] == "big"
    step = logged_request(gateway, raw.headers["x-link-request-id"])["decision"]["cascade"]["steps"][0]
    assert step["model"] == "down" and "BackendUnavailable" in step["error"]
    with pytest.raises(openai.APIStatusError) as info:
        ask(client, "last-down", "hello")
    assert info.value.status_code == 503
    response = httpx.post(gateway.base_url + "/chat/completions", headers=AUTH, timeout=30,
                          json={"model": "last-down", "messages": [{"role": "user", "content": "hi"}], "stream": True})
    assert response.status_code == 503 and response.json()["error"]["code"] in ("backend_unavailable", "no_healthy_deployment")


def test_cascade_validation(gateway):
    api = gateway.url + "/api/policies"
    for options, models, param in (({"threshold": 2}, ["small", "big"], "options.threshold"),
                                   ({"scorer": "vibes"}, ["small", "big"], "options.scorer"),
                                   ({"judge": "nope"}, ["small", "big"], "options.judge"),
                                   ({"scorer": "router"}, ["small", "big"], "options.path"),
                                   ({"scorer": "answer"}, ["small", "big"], "options.checker"),
                                   ({"scorer": "answer", "checker": "/no/such.safetensors"}, ["small", "big"],
                                    "options.checker"),
                                   ({"checker": "x.safetensors"}, ["small", "big"], "options.checker"),   # judge's
                                   ({"scorer": "answer", "checker": "x", "judge": "small"}, ["small", "big"],
                                    "options.judge"),
                                   ({"scorer": "router", "checker": "x"}, ["small", "big"], "options.checker"),
                                   ({"encoder": "auto"}, ["small", "big"], "options.encoder"),
                                   ({}, ["small"], "models")):
        response = httpx.post(api, headers=AUTH, json={"name": "c-bad", "type": "cascade", "models": models, "options": options})
        assert response.status_code == 400 and response.json()["error"]["param"] == param, response.text


def test_a_router_scored_cascade_takes_the_threshold_calibrated_in_the_file(tmp_path):
    """Without options.threshold, the threshold `link router calibrate --rule cascade` stored for the same steps."""
    import numpy as np

    from link.config import PolicyConfig
    from link.policies.cascade import build_cascade
    from routers.base import save_router
    from routers.decision import CostModel
    from tests.link.router_fakes import COSTS, TableRouter

    nan = np.full(2, np.nan)
    costs = CostModel(["small", "big"], nan, nan, nan, np.array([COSTS["small"], COSTS["big"]]))
    path = save_router(TableRouter(["small", "big"]), tmp_path / "calibrated.safetensors", costs=costs,
                       decision={"rule": "lambda", "cost_penalty": 1.0,
                                 "cascade": {"models": ["small", "big"], "threshold": 0.37, "target": "cost=0.002"}})

    def thresholds(models, **options):
        config = PolicyConfig(name="c", type="cascade", models=models, options={"scorer": "router", "path": str(path), **options})
        return build_cascade(config)[0].thresholds

    assert thresholds(["small", "big"]) == [0.37]
    assert thresholds(["small", "big"], threshold=0.8) == [0.8]   # the option wins
    assert thresholds(["big", "small"]) == [0.5]                   # calibrated for other steps: the default
    ROUTERS.pop(TableRouter.type, None)
