"""NUL characters and lone UTF-16 surrogates at the gateway, on SQLite and PostgreSQL, over real HTTP against the
mock provider: anywhere in a request body (content, `user`, `model`, metadata keys and values, prompts) they are
a 400 naming the field, logged like any refused request, so a key's spend stays the sum of its request-log rows;
in the management API's bodies, path and query parameters they are 400s naming the field, never a 500 from the
database (protocol/strict_json.py, protocol/url_params.py)."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from sqlmodel import Session

from link.db import make_db_engine
from link.keys import create_key
from tests.link.conftest import DB_BACKENDS
from tests.link.gateway_launch import MASTER_KEY, gateway_settings, mock_deployment, start_gateway_thread

AUTH = {"Authorization": f"Bearer {MASTER_KEY}"}
CHAT = {"model": "mock-a", "messages": [{"role": "user", "content": "hello there world"}]}


@pytest.fixture(scope="module", params=DB_BACKENDS)
def gateway(request, mock, new_database_url, tmp_path_factory):
    from link.config import parse_config

    config = parse_config({"models": [mock_deployment("mock-a", mock.api_base)]})
    settings = gateway_settings(new_database_url(request.param), tmp_path_factory.mktemp("home"))
    with start_gateway_thread(settings, config) as server:
        yield server


@pytest.fixture
def key(gateway) -> tuple[int, dict]:
    """A new API key of this test: (its id, its Authorization header)."""
    engine = make_db_engine(gateway.state.settings.database_url)
    try:
        with Session(engine) as session:
            public, plaintext = create_key(session, "text-test")
    finally:
        engine.dispose()
    return public.id, {"Authorization": f"Bearer {plaintext}"}


def error_of(response: httpx.Response, status: int = 400) -> dict:
    assert response.status_code == status, response.text
    assert set(response.json()) == {"error"} and set(response.json()["error"]) == {"message", "type", "param", "code"}
    return response.json()["error"]


def rows_and_spend(gateway, key_id: int) -> tuple[list[dict], float]:
    gateway.flush_log()
    rows = httpx.get(f"{gateway.url}/api/requests", params={"api_key_id": key_id}, headers=AUTH).json()
    spend = httpx.get(f"{gateway.url}/api/keys/{key_id}", headers=AUTH).json()["spend_usd"]
    return rows, spend


# escaped as \u0000 / \udfff by json.dumps, as every client sends them
CASES = [
    ("chat", {"messages": [{"role": "user", "content": "a\udfffb"}]}, "messages[0].content"),
    ("chat", {"user": "\udfff"}, "user"),
    ("chat", {"user": "alice\x00"}, "user"),
    ("chat", {"model": "mock-a\x00"}, "model"),
    ("chat", {"model": "mock-a\udfff"}, "model"),
    ("chat", {"metadata": {"team\x00": "a"}}, "metadata"),
    ("chat", {"metadata": {"team": "a\x00"}}, "metadata.team"),
    ("chat", {"messages": [{"role": "user", "content": "a\x00b"}]}, "messages[0].content"),
    ("completion", {"prompt": ["fine", "bad\udfff"]}, "prompt[1]"),
]


@pytest.mark.parametrize("endpoint,patch,param", CASES)
def test_unstorable_text_is_a_logged_400_and_spend_stays_the_sum_of_rows(gateway, key, endpoint, patch, param):
    key_id, headers = key
    path, base = ("/chat/completions", CHAT) if endpoint == "chat" else ("/completions", {"model": "mock-a", "prompt": "hi"})
    served = httpx.post(gateway.base_url + path, json=base, headers=headers)
    assert served.status_code == 200, served.text
    refused = httpx.post(gateway.base_url + path, content=json.dumps({**base, **patch}).encode(), headers=headers)
    error = error_of(refused)
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert refused.headers["x-link-request-id"]
    rows, spend = rows_and_spend(gateway, key_id)
    assert sorted((r["status"], r["http_status"]) for r in rows) == [("invalid_request", 400), ("ok", 200)]
    assert spend > 0 and spend == pytest.approx(sum(r["cost_usd"] for r in rows), abs=1e-9)


def test_the_official_client_gets_the_field_of_a_nul(gateway, key):
    # (the client cannot send a lone surrogate at all: httpx encodes its JSON as UTF-8 first)
    client = openai.OpenAI(base_url=gateway.base_url, api_key=key[1]["Authorization"].removeprefix("Bearer "), max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="mock-a", messages=[{"role": "user", "content": "hi"}], user="bob\x00")
    assert info.value.param == "user" and "NUL" in info.value.message
    rows, spend = rows_and_spend(gateway, key[0])
    assert [(r["status"], r["user"]) for r in rows] == [("invalid_request", None)] and spend == 0


def test_a_surrogate_sent_as_raw_bytes_is_refused_like_an_escaped_one(gateway, key):
    raw = b'{"model": "mock-a", "messages": [{"role": "user", "content": "' + "\udfff".encode("utf-8", "surrogatepass") + b'"}]}'
    assert error_of(httpx.post(gateway.base_url + "/chat/completions", content=raw, headers=key[1]))["param"] == "messages[0].content"


def test_key_and_policy_bodies_with_a_nul_are_400s_and_store_nothing(gateway, key):
    before = httpx.get(f"{gateway.url}/api/keys", headers=AUTH).json()
    error = error_of(httpx.post(f"{gateway.url}/api/keys", json={"name": "ops\x00"}, headers=AUTH))
    assert error["param"] == "name"
    assert httpx.get(f"{gateway.url}/api/keys", headers=AUTH).json() == before
    renamed = httpx.patch(f"{gateway.url}/api/keys/{key[0]}", content=json.dumps({"name": "\udfff"}).encode(), headers=AUTH)
    assert error_of(renamed)["param"] == "name"
    policy = {"name": "p\x00", "type": "fixed", "models": ["mock-a"]}
    assert error_of(httpx.post(f"{gateway.url}/api/policies", json=policy, headers=AUTH))["param"] == "name"
    policy = {"name": "p-ok", "type": "fixed", "models": ["mock-a"], "options": {"note\x00": 1}}
    assert error_of(httpx.post(f"{gateway.url}/api/policies", json=policy, headers=AUTH))["param"] == "options"


@pytest.mark.parametrize("method,url,param", [
    ("GET", "/api/policies/a%00b", "name"), ("PUT", "/api/policies/a%00b", "name"),
    ("DELETE", "/api/policies/a%00b", "name"), ("GET", "/api/requests?model=a%00b", "model"),
    ("GET", "/api/requests?policy=%00", "policy"), ("GET", "/api/requests?status=ok%00", "status"),
    ("GET", "/api/requests/a%00b", "request_id"), ("GET", "/api/traffic?model=a%00b", "model"),
    ("GET", "/v1/models/a%00b", "model_id"),
])
def test_a_nul_in_a_path_or_query_parameter_is_a_400_naming_it(gateway, method, url, param):
    body = {"type": "fixed", "models": ["mock-a"]} if method == "PUT" else None
    error = error_of(httpx.request(method, gateway.url + url, json=body, headers=AUTH))
    assert error["param"] == param and "NUL" in error["message"]
