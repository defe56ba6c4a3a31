"""The engine server's request boundary on loopback (`link engine serve`), the gateway's too: a body nested 1,000
or 100,000 levels deep is a 400 on a kept connection, a body over the limit a 413, a NUL or lone surrogate a
400 naming its field or parameter. All of it is refused before the model would be used: the server runs
without its lifespan (no model loaded), which also shows nothing past the boundary was needed."""

from __future__ import annotations

import httpx
import pytest

from protocol.boundary import BodyLimits
from serving.api.server import create_engine_app
from tests.serving.loopback import client_port, serve_on_loopback

MAX_BODY = 2**20  # room for 100,000 levels, 6 bytes each at most
CHAT = {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def url():
    app = create_engine_app("smollm2-135m-instruct", body_limits=BodyLimits(max_body_bytes=MAX_BODY))
    with serve_on_loopback(app, lifespan="off") as base:
        yield base


def error_of(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize("depth", [1_000, 100_000])
@pytest.mark.parametrize("open_,close", [(b"[", b"]"), (b'{"a":', b"}")])
def test_deep_bodies_are_400s_on_a_kept_connection(url, path, depth, open_, close):
    raw = b'{"model": "smollm2-135m-instruct", "prompt": ' + open_ * depth + b"1" + close * depth + b"}"
    with httpx.Client(timeout=30) as client:
        refused = client.post(url + path, content=raw, headers={"content-type": "application/json"})
        error = error_of(refused, 400)
        assert error["code"] == "json_too_deep" and "64 levels" in error["message"]
        after = client.post(url + "/v1/unknown", json={})  # a later request, answered on the same connection
        assert after.status_code == 404 and client_port(after) == client_port(refused)


def test_a_body_over_the_limit_is_a_413(url):
    body = {**CHAT, "messages": [{"role": "user", "content": "x" * MAX_BODY}]}
    error = error_of(httpx.post(url + "/v1/chat/completions", json=body), 413)
    assert error["code"] == "request_too_large" and f"{MAX_BODY:,} bytes" in error["message"]
    chunked = httpx.post(url + "/v1/chat/completions", content=iter([b"[" * 2**16] * 17))  # no Content-Length
    assert error_of(chunked, 413)["code"] == "request_too_large"


@pytest.mark.parametrize("raw,param", [
    (b'{"model": "m", "messages": [{"role": "user", "content": "a\\udfffb"}]}', "messages[0].content"),
    (b'{"model": "m", "prompt": ["ok", "\\ud800"]}', "prompt[1]"),
    (b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "user": "a\\u0000"}', "user"),
])
def test_text_that_no_tokenizer_or_store_takes_is_a_400_naming_the_field(url, raw, param):
    path = "/v1/completions" if b'"prompt"' in raw else "/v1/chat/completions"
    error = error_of(httpx.post(url + path, content=raw, headers={"content-type": "application/json"}), 400)
    assert error["param"] == param


def test_a_nul_in_a_path_parameter_is_a_400_naming_it(url):
    assert error_of(httpx.get(url + "/v1/models/a%00b"), 400)["param"] == "model_id"
