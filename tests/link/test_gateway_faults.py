"""Fault tests with real backend processes: a refused connection, a hang past the timeout, a death mid-stream.

The fallback policy answers from the next model in the first two cases (whole and streamed) and ends a
stream that dies after its first bytes with exactly one OpenAI error event and `data: [DONE]`. Every
request has its request-log row with the right status, also when the client disconnects mid-stream.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.link.gateway_launch import MASTER_KEY, gateway_settings, mock_deployment, start_gateway_thread
from tests.link.mock_launch import refused_url, start_mock_process
from tests.link.sse import sse_payloads

AUTH = {"Authorization": f"Bearer {MASTER_KEY}"}
MESSAGES = [{"role": "user", "content": "one two three"}]


@pytest.fixture(scope="module")
def backends():
    good = start_mock_process("ok", chunk_delay_s=0.05)
    hang = start_mock_process("hang")
    die = start_mock_process("die", die_after=3)
    yield {"good": good, "hang": hang, "die": die}
    for server in (good, hang, die):
        server.kill()


@pytest.fixture(scope="module")
def gateway(backends, new_database_url, tmp_path_factory):
    from link.config import parse_config

    fast = {"timeout_s": 1.5, "first_token_timeout_s": 1.0}
    models = [mock_deployment("good", backends["good"].api_base),
              mock_deployment("refused", refused_url(), **fast),
              mock_deployment("hang", backends["hang"].api_base, **fast),
              mock_deployment("die", backends["die"].api_base, **fast)]
    policies = [{"name": f"fb-{name}", "type": "fallback", "models": [name, "good"]} for name in ("refused", "hang", "die")]
    # A replica that failed is ejected until a health probe readmits it (the hanging one answers /health).
    settings = gateway_settings(new_database_url("sqlite"), tmp_path_factory.mktemp("home"), eject_cooldown_s=0.0,
                                health_interval_s=0.1)
    with start_gateway_thread(settings, parse_config({"models": models, "policies": policies})) as server:
        yield server


def wait_in_rotation(gateway, model: str, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while gateway.state.pools[model].healthy_replicas == [] and time.monotonic() < deadline:
        time.sleep(0.05)


def post(gateway, model: str, stream: bool = False) -> tuple[httpx.Response, str]:
    body = {"model": model, "messages": MESSAGES, "stream": stream}
    with httpx.stream("POST", gateway.base_url + "/chat/completions", json=body, headers=AUTH, timeout=30) as r:
        return r, r.read().decode()


def log_row(gateway, response_or_id) -> dict:
    """The request's log row; it is written just after the response ends, so poll briefly."""
    request_id = response_or_id if isinstance(response_or_id, str) else response_or_id.headers["x-link-request-id"]
    deadline = time.monotonic() + 10
    while True:
        gateway.flush_log()
        row = httpx.get(f"{gateway.url}/api/requests/{request_id}", headers=AUTH)
        if row.status_code == 200 or time.monotonic() > deadline:
            return row.json()
        time.sleep(0.05)


@pytest.mark.parametrize("fault", ["refused", "hang"])
@pytest.mark.parametrize("stream", [False, True])
def test_fallback_answers_from_the_next_model(gateway, fault, stream):
    if fault == "hang":
        wait_in_rotation(gateway, "hang")
    started = time.monotonic()
    response, text = post(gateway, f"fb-{fault}", stream)
    assert response.status_code == 200, text
    assert response.headers["x-link-model"] == "good" and response.headers["x-link-policy"] == f"fb-{fault}"
    if stream:
        assert sse_payloads(text) and '"error"' not in text
    else:
        assert json.loads(text)["choices"][0]["message"]["content"] == "You said: one two three"
    assert time.monotonic() - started < 10
    row = log_row(gateway, response)
    assert row["status"] == "ok" and row["model"] == "good" and row["policy"] == f"fb-{fault}"
    attempt = row["decision"]["attempts"][0]
    # A refused replica may already be ejected by the startup health check: then it is skipped at once.
    expected = {"timeout"} if fault == "hang" else {"backend_unavailable", "no_healthy_deployment"}
    assert attempt["model"] == fault and attempt["code"] in expected
    assert row["completion_tokens"] == 5 and row["cost_usd"] > 0


@pytest.mark.parametrize("fault,status,http", [("refused", "error", 503), ("hang", "timeout", 504)])
def test_a_fixed_model_that_fails_is_an_error_object_and_a_log_row(gateway, fault, status, http):
    wait_in_rotation(gateway, fault)
    response, text = post(gateway, fault)
    assert response.status_code == http and json.loads(text)["error"]["message"]
    assert response.headers["x-link-model"] == fault and response.headers["x-link-policy"] == fault  # tried last
    row = log_row(gateway, response)
    assert row["status"] == status and row["http_status"] == http and row["error"]


def test_death_mid_stream_ends_with_one_error_event(gateway):
    wait_in_rotation(gateway, "die")
    response, text = post(gateway, "fb-die", stream=True)
    assert response.status_code == 200 and response.headers["x-link-model"] == "die"
    payloads = sse_payloads(text)
    errors = [json.loads(p) for p in payloads if '"error"' in p]
    assert len(errors) == 1 and payloads[-1] == json.dumps(errors[0], separators=(",", ":"))
    assert errors[0]["error"]["code"] == "backend_unavailable"
    row = log_row(gateway, response)
    assert row["status"] == "error" and row["model"] == "die" and "after the first byte" in row["error"]
    assert row["completion_tokens"] >= 1 and row["decision"]["usage"] == "estimated"


def test_death_mid_body_of_a_whole_answer_falls_back(gateway):
    wait_in_rotation(gateway, "die")
    response, text = post(gateway, "fb-die")
    assert response.status_code == 200 and response.headers["x-link-model"] == "good"
    assert log_row(gateway, response)["decision"]["attempts"][0]["model"] == "die"


def test_client_disconnect_mid_stream_is_logged(gateway):
    body = {"model": "good", "messages": [{"role": "user", "content": " ".join(["word"] * 200)}], "stream": True}
    with httpx.stream("POST", gateway.base_url + "/chat/completions", json=body, headers=AUTH, timeout=30) as r:
        request_id = r.headers["x-link-request-id"]
        lines = r.iter_lines()
        next(lines), next(lines)
    row = log_row(gateway, request_id)
    assert row["status"] == "client_disconnected" and row["http_status"] == 499 and row["model"] == "good"
    assert gateway.state.pools["good"].num_outstanding == 0
