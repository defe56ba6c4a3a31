"""The `moa` policy through the gateway, with mock OpenAI servers as proposers and aggregator: whole and
streamed answers, keep-alive comments before the first content chunk, dropped proposers (refused, past the
deadline), every proposer's output in the request log; `usage` is the aggregator's own call (within
`max_tokens`), `usage.link_billed`, the log row and `x-link-cost-usd` the sums over every call.

The mock answers "You said: " + the last message's words and counts one token per whitespace-separated
word, so every call's usage (and the expected cost) is computed here from the texts alone.
"""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from routers.moa import SYNTHESIS_PROMPT
from tests.link.gateway_launch import MASTER_KEY, gateway_settings, logged_request, mock_deployment, start_gateway_thread
from tests.link.mock_launch import refused_url, start_mock_thread

AUTH = {"Authorization": f"Bearer {MASTER_KEY}"}
QUESTION = "what is two plus three"
MESSAGES = [{"role": "user", "content": QUESTION}]
PRICE_IN, PRICE_OUT = 1000.0, 2000.0  # mock_deployment's USD per million tokens


@pytest.fixture(scope="module")
def gateway(new_database_url, tmp_path_factory):
    from link.config import parse_config

    with start_mock_thread() as fast, start_mock_thread() as agg, start_mock_thread(mode="hang", hang_s=1.0) as slow, \
            start_mock_thread(mode="hang") as stuck:
        models = [mock_deployment("p-fast", fast.api_base), mock_deployment("agg", agg.api_base),
                  mock_deployment("p-slow", slow.api_base), mock_deployment("p-stuck", stuck.api_base),
                  mock_deployment("p-down", refused_url())]
        policies = [
            {"name": "moa-slow", "type": "moa", "models": ["p-fast", "p-slow"], "options": {"aggregator": "agg"}},
            {"name": "moa-down", "type": "moa", "models": ["p-fast", "p-down"], "options": {"aggregator": "agg"}},
            {"name": "moa-late", "type": "moa", "models": ["p-fast", "p-stuck"], "options": {"aggregator": "agg", "deadline_s": 0.5}},
            {"name": "moa-none", "type": "moa", "models": ["p-down"], "options": {"aggregator": "agg"}},
            {"name": "moa-temps", "type": "moa", "models": ["p-fast"], "options": {"aggregator": "agg", "temperatures": [0.2, 0.9]}},
        ]
        config = parse_config({"models": models, "policies": policies})
        settings = gateway_settings(new_database_url("sqlite"), tmp_path_factory.mktemp("home"))
        with start_gateway_thread(settings, config) as server:
            server.agg = agg
            yield server


@pytest.fixture
def client(gateway):
    return openai.OpenAI(base_url=gateway.base_url, api_key=MASTER_KEY, max_retries=0, timeout=60)


@pytest.fixture
def fast_keepalive(monkeypatch):
    monkeypatch.setattr("link.executor.KEEPALIVE_S", 0.25)


def words(text: str) -> int:
    return len(text.split())


def aggregator_usage(proposals: list[str], reply: str = f"You said: {QUESTION}") -> tuple[int, int]:
    """(prompt, completion) tokens of the aggregator's call: the synthesis instruction with the proposals, QUESTION."""
    system = SYNTHESIS_PROMPT + "".join(f"\n\nAnswer {i}:\n{text}" for i, text in enumerate(proposals, 1))
    return words(system) + words(QUESTION), words(reply)


def expected_usage(proposals: list[str], reply: str = f"You said: {QUESTION}") -> tuple[int, int]:
    """(prompt, completion) tokens summed over the proposers (each read QUESTION, wrote its proposal) and the aggregator."""
    prompt, completion = aggregator_usage(proposals, reply)
    return len(proposals) * words(QUESTION) + prompt, sum(words(p) for p in proposals) + completion


def billed(prompt: int, completion: int, calls: int) -> dict:
    """The `usage.link_billed` of a request whose calls add up to these tokens at the mock deployments' prices."""
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "cost_usd": pytest.approx((prompt * PRICE_IN + completion * PRICE_OUT) / 1e6, rel=1e-9), "calls": calls}




def test_whole_answer_reports_the_aggregators_usage_bills_every_call_and_logs_every_proposal(gateway, client):
    raw = client.chat.completions.with_raw_response.create(model="moa-down", messages=MESSAGES, max_tokens=50)
    answer = raw.parse()
    assert answer.choices[0].message.content == f"You said: {QUESTION}" and answer.model == "agg"
    assert raw.headers["x-link-policy"] == "moa-down" and raw.headers["x-link-model"] == "agg"
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == aggregator_usage([f"You said: {QUESTION}"])
    prompt, completion = expected_usage([f"You said: {QUESTION}"])  # p-down was dropped
    assert answer.usage.link_billed == billed(prompt, completion, calls=2)
    cost = (prompt * PRICE_IN + completion * PRICE_OUT) / 1e6
    assert float(raw.headers["x-link-cost-usd"]) == pytest.approx(cost, rel=1e-6)
    system = gateway.agg.last_body()["messages"][0]["content"]
    assert system == f"{SYNTHESIS_PROMPT}\n\nAnswer 1:\nYou said: {QUESTION}"

    row = logged_request(gateway, raw.headers["x-link-request-id"])
    assert row["status"] == "ok" and row["model"] == "agg" and row["cost_usd"] == pytest.approx(cost, rel=1e-6)
    assert (row["prompt_tokens"], row["completion_tokens"]) == (prompt, completion)
    moa = row["decision"]["moa"]
    assert moa["aggregator"] == "agg" and moa["num_dropped"] == 1
    by_model = {p["model"]: p for p in moa["proposals"]}
    assert by_model["p-fast"]["ok"] and by_model["p-fast"]["text"] == f"You said: {QUESTION}"
    assert not by_model["p-down"]["ok"] and "BackendUnavailable" in by_model["p-down"]["error"]
    assert [c["model"] for c in row["decision"]["calls"]] == ["p-fast", "agg"]
    assert sum(c["cost_usd"] for c in row["decision"]["calls"]) == pytest.approx(cost, rel=1e-6)
    assert row["decision"]["type"] == "moa" and set(row["decision"]["candidates"]) == {"agg", "p-fast", "p-down"}


def test_stream_sends_keepalives_before_the_first_content_chunk(gateway, client, fast_keepalive):
    with client.chat.completions.with_streaming_response.create(
            model="moa-slow", messages=MESSAGES, max_tokens=50, stream=True, stream_options={"include_usage": True}) as raw:
        assert raw.headers["x-link-model"] == "agg" and raw.headers["x-link-policy"] == "moa-slow"
        lines = [line for line in raw.iter_lines() if line]
    first_data = next(i for i, line in enumerate(lines) if line.startswith("data: "))
    assert first_data > 0 and all(line == ": keep-alive" for line in lines[:first_data])  # p-slow takes 1 s
    events = [json.loads(line[6:]) for line in lines if line.startswith("data: ") and line != "data: [DONE]"]
    assert lines[-1] == "data: [DONE]"
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
    assert text == f"You said: {QUESTION}" and all(e["model"] == "agg" for e in events)
    usage = events[-1]["usage"]
    assert events[-1]["choices"] == [] and (usage["prompt_tokens"], usage["completion_tokens"]) == \
        aggregator_usage([f"You said: {QUESTION}"] * 2)
    assert usage["link_billed"] == billed(*expected_usage([f"You said: {QUESTION}"] * 2), calls=3)
    assert sum(1 for e in events if e.get("usage")) == 1  # the aggregator's usage comes once, at the end


def test_whole_and_streamed_answers_agree_through_the_openai_client(gateway, client):
    whole = client.chat.completions.create(model="moa-temps", messages=MESSAGES, max_tokens=50)
    chunks = list(client.chat.completions.create(model="moa-temps", messages=MESSAGES, max_tokens=50, stream=True,
                                                 stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens == words(f"You said: {QUESTION}")
    assert chunks[-1].usage.link_billed["completion_tokens"] == whole.usage.link_billed["completion_tokens"] \
        == 3 * words(f"You said: {QUESTION}")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_usage_is_the_answers_own_within_max_tokens_and_the_bill_is_every_call(gateway, client, stream):
    """Every call is cut at max_tokens = 4 ("You said: what is"): the answer's usage is the aggregator's 4
    completion tokens, `link_billed` the 3 calls' 12; log row, `link_billed` and (whole) the cost header agree."""
    reply = "You said: what is"
    request = dict(model="moa-temps", messages=MESSAGES, max_tokens=4)
    if stream:
        with client.chat.completions.with_streaming_response.create(
                **request, stream=True, stream_options={"include_usage": True}) as raw:
            chunks = list(raw.parse())
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == reply
        usage = chunks[-1].usage
    else:
        raw = client.chat.completions.with_raw_response.create(**request)
        answer = raw.parse()
        assert answer.choices[0].message.content == reply
        usage = answer.usage
    assert usage.completion_tokens == 4 <= request["max_tokens"]
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == \
        (*aggregator_usage([reply] * 2, reply), sum(aggregator_usage([reply] * 2, reply)))
    prompt, completion = expected_usage([reply] * 2, reply)
    assert completion == 12 and usage.link_billed == billed(prompt, completion, calls=3)
    row = logged_request(gateway, raw.headers["x-link-request-id"])
    assert (row["prompt_tokens"], row["completion_tokens"]) == (prompt, completion)
    assert row["cost_usd"] == pytest.approx(usage.link_billed["cost_usd"], rel=1e-9)
    assert row["cost_usd"] == pytest.approx(sum(c["cost_usd"] for c in row["decision"]["calls"]), rel=1e-9)
    if not stream:
        assert float(raw.headers["x-link-cost-usd"]) == pytest.approx(row["cost_usd"], abs=1e-9)


def test_a_proposer_past_its_deadline_is_dropped(gateway, client):
    raw = client.chat.completions.with_raw_response.create(model="moa-late", messages=MESSAGES, max_tokens=50)
    assert raw.parse().choices[0].message.content == f"You said: {QUESTION}"
    proposals = {p["model"]: p for p in logged_request(gateway, raw.headers["x-link-request-id"])["decision"]["moa"]["proposals"]}
    assert proposals["p-stuck"]["error"] == "missed its deadline of 0.5 s" and proposals["p-fast"]["ok"]


def test_no_proposal_is_an_error_whole_and_streamed(gateway, client, fast_keepalive):
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(model="moa-none", messages=MESSAGES, max_tokens=50)
    assert info.value.status_code == 503 and info.value.body["code"] == "no_proposals"
    assert "0 of 1 proposers answered" in info.value.body["message"]
    with httpx.stream("POST", gateway.base_url + "/chat/completions", headers=AUTH,
                      json={"model": "moa-none", "messages": MESSAGES, "stream": True}) as response:
        assert response.status_code == 200  # a MoA stream starts at once (keep-alives while proposers work)
        body = response.read().decode()
    error = json.loads(body.split("data: ")[1].split("\n\n")[0])
    assert error["error"]["code"] == "no_proposals" and body.endswith("data: [DONE]\n\n")
    row = logged_request(gateway, response.headers["x-link-request-id"])
    assert row["status"] == "error" and row["decision"]["moa"]["num_dropped"] == 1


def test_moa_policies_are_listed_and_validated(gateway):
    cards = {m["id"]: m for m in httpx.get(gateway.base_url + "/models", headers=AUTH).json()["data"]}
    assert cards["moa-down"]["link"]["type"] == "moa" and cards["moa-down"]["link"]["options"]["aggregator"] == "agg"
    api = gateway.url + "/api/policies"
    bad = [({"aggregator": "nope"}, "options.aggregator"), ({"layers": 0}, "options.layers"), ({"colour": 1}, "options.colour"),
           ({"temperatures": "hot"}, "options.temperatures")]
    for options, param in bad:
        response = httpx.post(api, headers=AUTH, json={"name": "m-bad", "type": "moa", "models": ["p-fast"], "options": options})
        assert response.status_code == 400 and response.json()["error"]["param"] == param, response.text
    created = httpx.post(api, headers=AUTH, json={"name": "m-db", "type": "moa", "models": ["p-fast", "p-slow"],
                                                  "options": {"aggregator": "agg", "deadline_s": 0.3}})
    assert created.status_code == 201, created.text
    answer = httpx.post(gateway.base_url + "/chat/completions", headers=AUTH,
                        json={"model": "m-db", "messages": MESSAGES, "max_tokens": 50}, timeout=30)
    assert answer.status_code == 200 and answer.headers["x-link-policy"] == "m-db"


def test_completion_requests_get_the_references_before_the_prompt(gateway):
    response = httpx.post(gateway.base_url + "/completions", headers=AUTH, timeout=30,
                          json={"model": "moa-down", "prompt": QUESTION, "max_tokens": 50})
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["text"].startswith("You said: " + SYNTHESIS_PROMPT.split()[0])
    assert gateway.agg.last_body()["prompt"] == f"{SYNTHESIS_PROMPT}\n\nAnswer 1:\nYou said: {QUESTION}\n\n{QUESTION}"


def test_a_client_leaving_mid_stream_cancels_the_proposers(gateway, fast_keepalive):
    with httpx.stream("POST", gateway.base_url + "/chat/completions", headers=AUTH, timeout=30,
                      json={"model": "moa-late", "messages": MESSAGES, "stream": True,
                            "metadata": {"note": "leaves"}}) as response:
        request_id = response.headers["x-link-request-id"]
        assert next(response.iter_lines()) == ": keep-alive"
    deadline = time.monotonic() + 10
    while True:
        gateway.flush_log()
        row = httpx.get(f"{gateway.url}/api/requests/{request_id}", headers=AUTH)
        if row.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert row.json()["status"] == "client_disconnected" and row.json()["http_status"] == 499


def test_the_budget_reservation_covers_every_call():
    from link.accounting import estimate_prompt_tokens
    from link.config import ModelDeployment
    from link.policies.moa import MoAExecutor, build_moa

    def deployments(name):  # 1 USD per prompt token, 2 per completion token
        return [ModelDeployment(name=name, kind="openai", api_base="http://x/v1", input_cost_per_million=1e6,
                                output_cost_per_million=2e6)]

    body = {"messages": MESSAGES, "max_tokens": 10}
    prompt = estimate_prompt_tokens("chat", body)
    moa = build_moa({"aggregator": "agg", "proposer_max_tokens": 8}, ["a", "b"])
    proposers = 2 * (prompt + 2 * 8)
    aggregator = (prompt + 2 * 8 + 256) + 2 * 10  # reads both answers in full, plus the synthesis instruction
    assert MoAExecutor(moa).max_cost_usd("chat", body, deployments) == pytest.approx(proposers + aggregator)
    two_layers = build_moa({"aggregator": "agg", "proposer_max_tokens": 8, "layers": 2}, ["a", "b"])
    layer2 = 2 * (prompt + 2 * 8 + 256 + 2 * 8)
    assert MoAExecutor(two_layers).max_cost_usd("chat", body, deployments) == pytest.approx(proposers + layer2 + aggregator)
