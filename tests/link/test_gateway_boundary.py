"""The gateway's request boundary over real HTTP (protocol/boundary.py, limits from Settings): a body nested
1,000 or 100,000 levels deep is a 400 OpenAI error object on every route that reads a body, on a connection the
server keeps: before the key is checked on the management routes, and on the OpenAI routes in the order any
invalid body is refused there (after the key), with its x-link-* headers and its request-log row; a body over `max_body_bytes` is a 413; a body nested as deep as
the limit allows, or a tool schema 20 levels deep, still reaches the backend unchanged. Numbers outside what
every backend takes (`seed` beyond 64 bits, `logit_bias` token ids beyond 2**31) and /api/traffic bounds past the
years 1-9999 are 400s naming the field.
"""

from __future__ import annotations

import json

import httpx
import pytest

from tests.link.gateway_launch import MASTER_KEY, gateway_settings, logged_request, mock_deployment, start_gateway_thread
from tests.protocol.test_json_depth import ref_depth
from tests.serving.loopback import client_port

AUTH = {"Authorization": f"Bearer {MASTER_KEY}"}
CHAT = {"model": "mock-a", "messages": [{"role": "user", "content": "hello there world"}]}
MAX_BODY = 2**20      # LINK_MAX_BODY_BYTES of this gateway: 100,000 levels fit, 6 bytes each at most
MAX_DEPTH = 64        # the default LINK_MAX_JSON_DEPTH


@pytest.fixture(scope="module")
def gateway(mock, new_database_url, tmp_path_factory):
    from link.config import parse_config

    config = parse_config({"models": [mock_deployment("mock-a", mock.api_base)]})
    settings = gateway_settings(new_database_url("sqlite"), tmp_path_factory.mktemp("home"), max_body_bytes=MAX_BODY)
    assert settings.max_json_depth == MAX_DEPTH
    with start_gateway_thread(settings, config) as server:
        yield server


def error_of(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    assert set(response.json()) == {"error"} and set(response.json()["error"]) == {"message", "type", "param", "code"}
    return response.json()["error"]


def nested(depth: int, kind: str) -> bytes:
    """A JSON value `depth` levels deep: arrays [[[...]]] or objects {"a": {"a": ...}}."""
    open_, close = (b"[", b"]") if kind == "arrays" else (b'{"a":', b"}")
    return open_ * depth + b"1" + close * depth


ROUTES = [("POST", "/v1/chat/completions"), ("POST", "/v1/completions"), ("POST", "/api/policies"),
          ("PUT", "/api/policies/p"), ("PATCH", "/api/policies/p"), ("POST", "/api/keys"), ("PATCH", "/api/keys/1"),
          ("POST", "/api/route")]


@pytest.mark.parametrize("method,path", ROUTES)
@pytest.mark.parametrize("depth", [1_000, 100_000])
@pytest.mark.parametrize("kind", ["arrays", "objects"])
def test_deep_bodies_are_400s_on_every_route_and_the_connection_stays(gateway, method, path, depth, kind):
    raw = b'{"model": "mock-a", "name": ' + nested(depth, kind) + b"}"
    with httpx.Client(base_url=gateway.url, headers=AUTH, timeout=30) as client:
        refused = client.request(method, path, content=raw)
        error = error_of(refused, 400)
        assert error["code"] == "json_too_deep" and error["type"] == "invalid_request_error"
        assert f"more than {MAX_DEPTH} levels" in error["message"]
        after = client.post("/v1/chat/completions", json=CHAT)
        assert after.status_code == 200 and client_port(after) == client_port(refused)


def test_the_depth_limit_holds_before_the_key_is_checked_on_the_management_routes(gateway):
    deep = httpx.post(gateway.url + "/api/keys", content=b'{"a": ' + nested(1_000, "arrays") + b"}")
    assert error_of(deep, 400)["code"] == "json_too_deep"
    assert error_of(httpx.post(gateway.url + "/api/keys", json={"name": "k"}), 401)


@pytest.mark.parametrize("raw,status,code", [
    (b'{"model": "mock-a", "a": ' + nested(1_000, "objects") + b"}", 400, "json_too_deep"),
    (b'{"model": "mock-a", "a": "' + b"x" * MAX_BODY + b'"}', 413, "request_too_large"),
])
def test_an_openai_route_logs_a_refused_body_like_any_invalid_one(gateway, raw, status, code):
    refused = httpx.post(gateway.base_url + "/chat/completions", content=raw, headers=AUTH)
    assert error_of(refused, status)["code"] == code
    assert refused.headers["x-link-request-id"] and refused.headers["x-link-policy"] == ""
    row = logged_request(gateway, refused.headers["x-link-request-id"])
    assert (row["status"], row["http_status"], row["cost_usd"]) == ("invalid_request", status, 0.0)
    # without a key the key is refused first, as for any other invalid body
    assert error_of(httpx.post(gateway.base_url + "/chat/completions", content=raw), 401)["code"] == "invalid_api_key"


def test_bodies_up_to_the_depth_limit_reach_the_backend_unchanged(gateway, mock):
    # `prediction` is passed through untouched: the body, `prediction` and the nested value inside it
    at_limit = {**CHAT, "prediction": {"type": "content", "content": json.loads(nested(MAX_DEPTH - 2, "arrays"))}}
    assert ref_depth(at_limit) == MAX_DEPTH
    answered = httpx.post(gateway.base_url + "/chat/completions", json=at_limit, headers=AUTH)
    assert answered.status_code == 200, answered.text
    assert mock.last_body()["prediction"] == at_limit["prediction"]
    over = {**at_limit, "prediction": {"type": "content", "content": [at_limit["prediction"]["content"]]}}
    assert ref_depth(over) == MAX_DEPTH + 1
    assert error_of(httpx.post(gateway.base_url + "/chat/completions", json=over, headers=AUTH), 400)["code"] == "json_too_deep"


def test_a_tool_schema_20_levels_deep_still_works(gateway, mock):
    schema = {"type": "string"}
    for _ in range(10):  # 20 levels of JSON Schema, an object's property holding an array, ten times over
        schema = {"type": "object", "properties": {"items": {"type": "array", "items": schema}}}
    tools = [{"type": "function", "function": {"name": "deep", "parameters": schema}}]
    # 3 levels of JSON per object-and-array pair (the object, its properties, the array's schema)
    assert ref_depth(schema) == 31 and ref_depth({**CHAT, "tools": tools}) == 35
    answered = httpx.post(gateway.base_url + "/chat/completions", json={**CHAT, "tools": tools}, headers=AUTH)
    assert answered.status_code == 200, answered.text
    assert mock.last_body()["tools"] == tools


def test_a_body_over_max_body_bytes_is_a_413(gateway):
    padded = {**CHAT, "messages": [{"role": "user", "content": "x" * MAX_BODY}]}
    error = error_of(httpx.post(gateway.base_url + "/chat/completions", json=padded, headers=AUTH), 413)
    assert error["code"] == "request_too_large" and f"limit of {MAX_BODY:,} bytes" in error["message"]
    # without a Content-Length (chunked), refused once the bytes read pass the limit
    chunks = iter([b'{"model": "mock-a", "messages": [{"role": "user", "content": "'] + [b"x" * 2**16] * 17)
    chunked = httpx.post(gateway.base_url + "/chat/completions", content=chunks, headers=AUTH)
    assert error_of(chunked, 413)["code"] == "request_too_large"


def test_a_body_of_exactly_max_body_bytes_is_served(gateway):
    body = httpx.Request("POST", "/", json={**CHAT, "user": ""}).content
    filler = MAX_BODY - len(body)
    exact = httpx.Request("POST", "/", json={**CHAT, "user": "u" * filler}).content
    assert len(exact) == MAX_BODY
    answered = httpx.post(gateway.base_url + "/chat/completions", content=exact, headers=AUTH)
    assert answered.status_code == 200, answered.text


@pytest.mark.parametrize("patch,param", [
    ({"seed": 2**63}, "seed"), ({"seed": -(2**63) - 1}, "seed"),
    ({"logit_bias": {"1" * 5000: 1}}, "logit_bias"), ({"logit_bias": {str(2**31): 1}}, "logit_bias"),
])
def test_numbers_no_backend_takes_are_400s_naming_the_field(gateway, mock, patch, param):
    error = error_of(httpx.post(gateway.base_url + "/chat/completions", json={**CHAT, **patch}, headers=AUTH), 400)
    assert error["param"] == param and "1111111111111111111111111111111111" not in error["message"]


def test_numbers_at_the_bounds_pass(gateway, mock):
    for patch in ({"seed": 2**63 - 1}, {"seed": -(2**63)}, {"logit_bias": {str(2**31 - 1): 1}}):
        answered = httpx.post(gateway.base_url + "/chat/completions", json={**CHAT, **patch}, headers=AUTH)
        assert answered.status_code == 200, answered.text
        assert all(mock.last_body()[field] == value for field, value in patch.items())


@pytest.mark.parametrize("query,param", [("until=0001-01-01T00:00:01Z", "since"), ("until=9999-12-31T23:00:00-05:00", "until")])
def test_traffic_bounds_past_the_calendar_are_400s_naming_them(gateway, query, param):
    assert error_of(httpx.get(f"{gateway.url}/api/traffic?{query}", headers=AUTH), 400)["param"] == param
