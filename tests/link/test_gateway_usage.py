"""Garbage `usage` from a provider (a mock OpenAI server told what to report), whole and streamed, on SQLite and
PostgreSQL: every request still answers 200 with sane usage (a stream ends with `[DONE]`), the bad count replaced
by the gateway's estimate; each gets its request-log row, its key's spend is the sum of its rows' costs with
nothing left reserved, and no /metrics counter goes down.

The mock answers "You said: " + the message; its own counts are one token per word.
"""

from __future__ import annotations

import json
import math
import time

import httpx
import openai
import pytest
from sqlmodel import Session

from link.accounting import estimate_prompt_tokens
from link.backends.usage import MAX_USAGE_TOKENS, checked_usage, token_count
from link.config import ModelDeployment
from link.keys import create_key, get_key
from tests.link.gateway_launch import MASTER_KEY, gateway_settings, logged_request, mock_deployment, start_gateway_thread
from tests.link.mock_launch import start_mock_thread
from tests.link.sse import sse_events

AUTH = {"Authorization": f"Bearer {MASTER_KEY}"}
MESSAGES = [{"role": "user", "content": "hello world"}]
ANSWER = "You said: hello world"
OWN_PROMPT, OWN_COMPLETION = 2, 4            # the mock's counts: words of the message, of the answer
PRICE_IN, PRICE_OUT = 1000.0, 2000.0         # mock_deployment's USD per million tokens
ESTIMATED_PROMPT = estimate_prompt_tokens("chat", {"messages": MESSAGES})
ESTIMATED_COMPLETION = math.ceil(len(ANSWER) / 2)   # the answer's characters at 2 per token
# what the provider reports (merged over its own usage) -> the (prompt, completion) tokens the gateway must bill
GARBAGE = {
    "prompt 1e30": ('{"prompt_tokens": 1e30}', (ESTIMATED_PROMPT, OWN_COMPLETION)),
    "prompt above the bound": (json.dumps({"prompt_tokens": MAX_USAGE_TOKENS + 1}), (ESTIMATED_PROMPT, OWN_COMPLETION)),
    "negative completion": ('{"completion_tokens": -5}', (OWN_PROMPT, ESTIMATED_COMPLETION)),
    "string prompt": ('{"prompt_tokens": "12"}', (ESTIMATED_PROMPT, OWN_COMPLETION)),
    "object completion": ('{"completion_tokens": {"n": 3}}', (OWN_PROMPT, ESTIMATED_COMPLETION)),
    "NaN prompt": ('{"prompt_tokens": NaN}', (ESTIMATED_PROMPT, OWN_COMPLETION)),
    "infinite completion": ('{"completion_tokens": -Infinity}', (OWN_PROMPT, ESTIMATED_COMPLETION)),
    "fractional prompt": ('{"prompt_tokens": 2.5}', (ESTIMATED_PROMPT, OWN_COMPLETION)),
    "bool completion": ('{"completion_tokens": true}', (OWN_PROMPT, ESTIMATED_COMPLETION)),
    "wrong total": ('{"total_tokens": -1}', (OWN_PROMPT, OWN_COMPLETION)),
    "bad details": ('{"completion_tokens_details": {"reasoning_tokens": -1, "audio_tokens": 0, "text_tokens": null}}',
                    (OWN_PROMPT, OWN_COMPLETION)),
}


@pytest.fixture(scope="module")
def gateway(db_url, tmp_path_factory):
    from link.config import parse_config

    with start_mock_thread() as mock:
        config = parse_config({"models": [mock_deployment("m", mock.api_base)],
                               "policies": [{"name": "moa", "type": "moa", "models": ["m"], "options": {"aggregator": "m"}}]})
        with start_gateway_thread(gateway_settings(db_url, tmp_path_factory.mktemp("home")), config) as server:
            yield server


def counters(gateway) -> dict[str, float]:
    """Every counter sample of /metrics (`*_total`), by its name and labels."""
    text = httpx.get(gateway.url + "/metrics", headers=AUTH).text
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if not line.startswith("#") and line.split("{")[0].endswith("_total")}


def ask(gateway, key: str, reported: str, stream: bool, model: str = "m") -> tuple[dict, str]:
    """(the usage the client got, the request id) of one request whose provider reports `reported`."""
    body = {"model": model, "messages": MESSAGES, "metadata": {"mock_usage": reported}}
    if not stream:
        client = openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0, timeout=30)
        raw = client.chat.completions.with_raw_response.create(**body)
        answer = raw.parse()
        assert answer.choices[0].message.content == ANSWER
        return answer.usage.model_dump(exclude_unset=True), raw.headers["x-link-request-id"]
    with httpx.stream("POST", gateway.base_url + "/chat/completions", headers={"Authorization": f"Bearer {key}"},
                      timeout=30, json={**body, "stream": True, "stream_options": {"include_usage": True}}) as response:
        assert response.status_code == 200
        events = sse_events(response.read().decode())   # strict: one `data: [DONE]`, last
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"]) == ANSWER
    assert events[-1]["choices"] == [] and sum(1 for e in events if e.get("usage")) == 1
    return events[-1]["usage"], response.headers["x-link-request-id"]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_garbage_usage_is_replaced_and_every_request_accounted(gateway, engine, session, stream):
    key, plaintext = create_key(session, f"garbage-usage-{stream}", budget_usd=100.0)
    total_cost = 0.0
    for case, (reported, (prompt, completion)) in GARBAGE.items():
        before = counters(gateway)
        usage, request_id = ask(gateway, plaintext, reported, stream)
        assert (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == \
            (prompt, completion, prompt + completion), case
        cost = (prompt * PRICE_IN + completion * PRICE_OUT) / 1e6
        row = logged_request(gateway, request_id)
        assert (row["status"], row["prompt_tokens"], row["completion_tokens"]) == ("ok", prompt, completion), case
        assert row["cost_usd"] == pytest.approx(cost, rel=1e-9) and row["api_key_id"] == key.id, case
        total_cost += row["cost_usd"]
        after = counters(gateway)
        assert all(after.get(name, 0.0) >= value for name, value in before.items()), case   # nothing decreased
        labels = '{model="m",policy="m"}'
        assert after[f"link_prompt_tokens_total{labels}"] - before.get(f"link_prompt_tokens_total{labels}", 0) == prompt
        assert after[f"link_completion_tokens_total{labels}"] - before.get(f"link_completion_tokens_total{labels}", 0) \
            == completion
        if case == "bad details":
            assert usage["completion_tokens_details"] == {"audio_tokens": 0, "text_tokens": None}
    deadline = time.monotonic() + 10   # a stream settles just after its last byte
    while True:
        with Session(engine) as fresh:
            spent = get_key(fresh, key.id)
        if not spent.reserved_usd or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert spent.reserved_usd == 0 and spent.spend_usd == pytest.approx(total_cost, rel=1e-6)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_garbage_usage_in_every_call_of_a_moa(gateway, session, stream):
    """The proposer and the aggregator both report a negative prompt count: each call is charged the estimate of
    its own prompt, and the answer's usage and the bill stay consistent with the log row."""
    _, plaintext = create_key(session, f"garbage-moa-{stream}", budget_usd=100.0)
    usage, request_id = ask(gateway, plaintext, '{"prompt_tokens": -3}', stream, model="moa")
    row = logged_request(gateway, request_id)
    proposer, aggregator = row["decision"]["calls"]
    assert proposer["prompt_tokens"] == ESTIMATED_PROMPT and aggregator["prompt_tokens"] > ESTIMATED_PROMPT  # + references
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (aggregator["prompt_tokens"], OWN_COMPLETION)
    assert usage["link_billed"]["prompt_tokens"] == row["prompt_tokens"] == ESTIMATED_PROMPT + aggregator["prompt_tokens"]
    assert usage["link_billed"]["cost_usd"] == pytest.approx(row["cost_usd"], rel=1e-9)
    assert row["cost_usd"] == pytest.approx((row["prompt_tokens"] * PRICE_IN + 2 * OWN_COMPLETION * PRICE_OUT) / 1e6)


def test_checked_usage_keeps_valid_counts_and_names_the_bad_field(caplog):
    deployment = ModelDeployment(name="prov", kind="openai", api_base="http://x/v1", model="their-model")
    estimate = lambda: (7, 9)  # noqa: E731
    assert checked_usage({"prompt_tokens": 3, "completion_tokens": 4.0, "total_tokens": 99, "cost": "x"}, deployment,
                         estimate) == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7, "cost": "x"}
    assert not caplog.records
    assert checked_usage("lots", deployment, estimate) == {"prompt_tokens": 7, "completion_tokens": 9, "total_tokens": 16}
    assert checked_usage({"prompt_tokens": 3}, deployment, estimate)["completion_tokens"] == 9   # missing: estimated
    caplog.clear()
    checked_usage({"prompt_tokens": -1, "completion_tokens": 2}, deployment, estimate)
    assert len(caplog.records) == 1 and caplog.records[0].levelname == "WARNING"
    message = caplog.records[0].getMessage()
    assert "deployment prov " in message and "'their-model'" in message and "usage.prompt_tokens = -1" in message
    assert [token_count(v) for v in (0, MAX_USAGE_TOKENS, MAX_USAGE_TOKENS + 1, 3.0, 3.5, True, None, "3")] == \
        [0, MAX_USAGE_TOKENS, None, 3, None, None, None, None]
