"""A request-log audit on SQLite and PostgreSQL: 500 requests through the gateway, good ones mixed with every bad
input the gateway has been attacked with, then the books are checked against what was sent.

The bad inputs: JSON nested 1,000 and 100,000 deep, not JSON at all, a lone surrogate in a message and in `user`,
NUL in `user` and in the model name, `max_tokens` of 10^15 and `max_completion_tokens` of 2^63, a
`response_format` schema that refers to itself and one nested 300 deep, a provider's garbage `usage` (1e30,
negative, a string, an object), made-up model names, a provider error that echoes its key, a provider that dies
mid-stream, a wrong API key, a key over its budget and one over its rate limit; the good ones: whole and
streamed chat, completions and Mixture-of-Agents answers.

Every request must get an answer that is not a 5xx (the provider's own failures are reported as 502/503 by
design and are allowed), the request log must hold exactly one row per request, each key's spend must equal the
sum of its rows' costs, and no money may stay reserved.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable

import httpx
import pytest
from sqlalchemy import func
from sqlmodel import Session, select

from link.db import make_db_engine
from link.db.models import ApiKey, RequestLog
from link.keys import create_key
from tests.link.conftest import DB_BACKENDS
from tests.link.gateway_launch import gateway_settings, mock_deployment, start_gateway_thread
from tests.link.mock_launch import start_mock_thread

NUM_REQUESTS = 500
MESSAGES = [{"role": "user", "content": "audit me please"}]
CHAT = {"model": "m", "messages": MESSAGES, "max_tokens": 8}
SELF_REF = {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}


def _nested(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


def _json_schema(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "audit", "schema": schema}}


def _raw(text: str) -> Callable:
    return lambda client, key: client.post("/v1/chat/completions", content=text.encode("utf-8", "surrogatepass"),
                                           headers=_auth(key, {"Content-Type": "application/json"}))


def _chat(body: dict, path: str = "/v1/chat/completions") -> Callable:
    return lambda client, key: client.post(path, json=body, headers=_auth(key))


def _auth(key: str, extra: dict | None = None) -> dict:
    return {"Authorization": f"Bearer {key}", **(extra or {})}


def _stream(body: dict) -> Callable:
    def send(client: httpx.Client, key: str) -> httpx.Response:
        with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True,
                                                                  "stream_options": {"include_usage": True}},
                           headers=_auth(key)) as response:
            response.read()
        return response
    return send


def _garbage(usage: str, stream: bool) -> Callable:
    body = {**CHAT, "metadata": {"mock_usage": usage}}
    return _stream(body) if stream else _chat(body)


# name -> (send(client, key) -> response, which key sends it)
CASES: dict[str, tuple[Callable, str]] = {
    "chat": (_chat(CHAT), "main"),
    "chat streamed": (_stream(CHAT), "main"),
    "completion": (_chat({"model": "m", "prompt": "audit", "max_tokens": 4}, "/v1/completions"), "main"),
    "moa": (_chat({**CHAT, "model": "moa"}), "main"),
    "nested 1,000 deep": (_raw('{"model": "m", "messages": ' + "[" * 1000 + "]" * 1000 + "}"), "main"),
    "nested 100,000 deep": (_raw('{"model": "m", "x": ' + '{"a": ' * 100_000 + "1" + "}" * 100_000 + "}"), "main"),
    "not JSON": (_raw('{"model": "m", "messages": ['), "main"),
    "lone surrogate in content": (_raw('{"model": "m", "messages": [{"role": "user", "content": "a\\udfff"}]}'),
                                  "main"),
    "lone surrogate in user": (_raw('{"model": "m", "user": "\\ud800", "messages": '
                                    '[{"role": "user", "content": "hi"}]}'), "main"),
    "NUL in user": (_chat({**CHAT, "user": "a\u0000b"}), "main"),
    "NUL in model": (_chat({**CHAT, "model": "m\u0000"}), "main"),
    "max_tokens 10^15": (_chat({**CHAT, "max_tokens": 10**15}), "main"),
    "max_completion_tokens 2^63": (_chat({"model": "m", "messages": MESSAGES, "max_completion_tokens": 2**63}),
                                   "main"),
    "self-referencing schema": (_chat({**CHAT, "response_format": _json_schema(SELF_REF)}), "main"),
    "schema 300 deep": (_chat({**CHAT, "response_format": _json_schema(_nested(300))}), "main"),
    "usage 1e30": (_garbage('{"prompt_tokens": 1e30}', stream=False), "main"),
    "usage negative, streamed": (_garbage('{"completion_tokens": -5}', stream=True), "main"),
    "usage a string": (_garbage('{"prompt_tokens": "12"}', stream=False), "main"),
    "usage an object, streamed": (_garbage('{"completion_tokens": {"n": 3}}', stream=True), "main"),
    "made-up model": (_chat({**CHAT, "model": "no-such-model-" + "x" * 200}), "main"),
    # on their own deployment "f" of the same provider: a failing one is ejected for a while, and "m" must not be
    "provider echoes its key": (_chat({**CHAT, "model": "f", "metadata": {"mock_mode": "401"}}), "main"),
    "provider dies mid-stream": (_stream({**CHAT, "model": "f", "metadata": {"mock_mode": "die"}}), "main"),
    "wrong API key": (_chat(CHAT), "wrong"),
    "over budget": (_chat(CHAT), "poor"),
    "over rate limit": (_chat(CHAT), "limited"),
}
# answers a provider's failure may get (the gateway's 502/503 after trying every candidate), never a gateway 500
PROVIDER_FAILURES = {"provider echoes its key": {502, 503}, "provider dies mid-stream": {200, 502, 503}}


@pytest.fixture(params=DB_BACKENDS)
def audited(request, new_database_url, tmp_path_factory, monkeypatch):
    from link.config import parse_config

    monkeypatch.setenv("AUDIT_PROVIDER_KEY", "prov-audit-secret-0123456789")

    url = new_database_url(request.param)
    with start_mock_thread() as mock:
        config = parse_config({"models": [mock_deployment("m", mock.api_base, api_key_env="AUDIT_PROVIDER_KEY"),
                                          mock_deployment("f", mock.api_base, api_key_env="AUDIT_PROVIDER_KEY")],
                               "policies": [{"name": "moa", "type": "moa", "models": ["m"],
                                             "options": {"aggregator": "m"}}]})
        with start_gateway_thread(gateway_settings(url, tmp_path_factory.mktemp("home")), config) as gateway:
            engine = make_db_engine(url)
            with Session(engine) as session:
                keys = {"main": create_key(session, "audit-main", budget_usd=100.0)[1],
                        "poor": create_key(session, "audit-poor", budget_usd=1e-9)[1],
                        "limited": create_key(session, "audit-limited", budget_usd=100.0, rpm_limit=3)[1],
                        "wrong": "sk-not-a-key-0123456789abcdef"}
            yield gateway, engine, keys
            engine.dispose()


def test_every_request_has_one_row_and_every_key_spends_the_sum_of_its_rows(audited):
    gateway, engine, keys = audited
    names = list(CASES)
    statuses: Counter = Counter()
    with httpx.Client(base_url=gateway.url, timeout=60) as client:
        for i in range(NUM_REQUESTS):
            name = names[i % len(names)]
            send, key = CASES[name]
            response = send(client, keys[key])
            statuses[(name, response.status_code)] += 1
            allowed = PROVIDER_FAILURES.get(name, set())
            assert response.status_code < 500 or response.status_code in allowed, (name, response.text[:300])
    print("\n".join(f"{name}: {status} x{n}" for (name, status), n in sorted(statuses.items())))
    gateway.flush_log()
    with Session(engine) as session:
        assert session.exec(select(func.count()).select_from(RequestLog)).one() == NUM_REQUESTS, sorted(statuses.items())
        for key in session.exec(select(ApiKey)).all():
            costs = session.exec(select(RequestLog.cost_usd).where(RequestLog.api_key_id == key.id)).all()
            assert key.spend_nusd == pytest.approx(sum(costs) * 1e9, abs=len(costs) + 1), key.name
            assert key.reserved_nusd == 0, key.name
    # the mix reached what it was meant to: answers, refusals of each kind, and the budget and rate limits
    by_status = Counter()
    for (name, status), n in statuses.items():
        by_status[status] += n
    assert by_status[200] > 0 and by_status[400] > 0 and by_status[401] > 0 and by_status[429] > 0
