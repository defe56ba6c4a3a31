"""The redactor (link/redact.py): which secrets it collects from the settings, the config and the environment,
what it replaces (literal secrets, URL credentials, token shapes), its filter on the loggers, and a remote backend
refused at a closed port whose `api_base` holds a password (the error names the URL without it)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from link.backends import BackendError, BackendUnavailable, make_backend
from link.config import ModelDeployment, parse_config
from link.redact import REDACTED, Redactor, attach_log_filter, detach_log_filter
from link.settings import get_settings
from tests.link.mock_launch import free_port

PROVIDER_KEY = "prov-7d1c0f9e2b4a6583"
MASTER = "sk-master-0123456789abcdef"


def _redactor(tmp_path, environ: dict, **settings) -> Redactor:
    config = parse_config({"models": [
        {"name": "keyed", "kind": "openai", "api_base": "http://127.0.0.1:9/v1", "api_key_env": "KEYED_KEY"},
        {"name": "basic", "kind": "openai", "api_base": "https://bob:hunter2-hunter2@llm.example/v1"},
        {"name": "token-user", "kind": "openai", "api_base": "https://tok-0123456789abcdef@llm.example/v1"},
        {"name": "hosted", "kind": "litellm", "model": "anthropic/claude-3-haiku"},   # LiteLLM reads ANTHROPIC_API_KEY
        {"name": "short", "kind": "openai", "api_base": "http://127.0.0.1:9/v1", "api_key_env": "SHORT_KEY"}]})
    values = dict(home=tmp_path, master_key=MASTER, environment="development",
                  database_url="postgresql://link:db-pass-0123456@db.internal:5432/link",
                  redis_url="redis://:redis-pass-0123456@cache.internal:6379/0")
    return Redactor.from_config(get_settings(**{**values, **settings}), config, environ)


def test_it_collects_every_secret_the_gateway_holds(tmp_path):
    environ = {"KEYED_KEY": PROVIDER_KEY, "ANTHROPIC_API_KEY": "ant-key-abcdef123456", "SHORT_KEY": "abc",
               "HOME": "/home/someone-long-enough"}
    redactor = _redactor(tmp_path, environ)
    assert set(redactor.secrets) == {PROVIDER_KEY, "hunter2-hunter2", "tok-0123456789abcdef", "ant-key-abcdef123456",
                                     MASTER, "db-pass-0123456", "redis-pass-0123456"}
    assert PROVIDER_KEY not in repr(redactor)  # a repr in a traceback or a log shows no secret
    # a 3-character key is not replaced everywhere (it would garble every message)
    assert redactor.redact("abc and /home/someone-long-enough") == "abc and /home/someone-long-enough"


@pytest.mark.parametrize("text,expected", [
    (f"Incorrect API key provided: {PROVIDER_KEY}. You can find your API key at https://x.example/keys.",
     "Incorrect API key provided: [redacted]. You can find your API key at https://x.example/keys."),
    (f"the key {PROVIDER_KEY}{PROVIDER_KEY}", "the key [redacted][redacted]"),
    ("connection to http://user:p%40ss@10.0.0.5:8000/v1 failed", "connection to http://[redacted]@10.0.0.5:8000/v1 failed"),
    ("('https://tok@h.example/v1')", "('https://[redacted]@h.example/v1')"),
    ("Incorrect API key provided: sk-proj-********************abcd.", "Incorrect API key provided: [redacted]."),
    ("key sk-ant-api03-AbCdEf0123456789xyz rejected", "key [redacted] rejected"),
    ("headers {'Authorization': 'Bearer abc.def-ghi_jkl'}", "headers {'Authorization': 'Bearer [redacted]'}"),
    ('{"api_key": "zz-0123456789", "password":"p4ssw0rd!"}', '{"api_key": "[redacted]", "password":"[redacted]"}'),
    ("api_key=AIzaSyA0123456789abcdefghijklmnopqrstuv&x=1", "api_key=[redacted]&x=1"),
    ("hf_abcdefghijklmnopqrstuvwxyz0123 and gsk_0123456789abcdefghijklmn", "[redacted] and [redacted]"),
    (f"master {MASTER}", "master [redacted]"),
    # what must stay: ordinary errors, URLs without credentials, our own key prefixes as the console shows them
    ("password authentication failed for user \"link\"", "password authentication failed for user \"link\""),
    ("mock-a: connection to http://127.0.0.1:8001/v1 failed", "mock-a: connection to http://127.0.0.1:8001/v1 failed"),
    ("key sk-link-AbC123 was revoked", "key sk-link-AbC123 was revoked"),
])
def test_it_replaces_secrets_and_keeps_the_rest(tmp_path, text, expected):
    assert _redactor(tmp_path, {"KEYED_KEY": PROVIDER_KEY}).redact(text) == expected


def test_json_values_are_redacted_everywhere():
    redactor = Redactor((PROVIDER_KEY,))
    error = {"error": {"message": f"bad key {PROVIDER_KEY}", "param": None, "code": 401,
                       "details": [{"hint": f"Bearer {PROVIDER_KEY}"}, 3.5, True]}}
    assert redactor.redact_json(error) == {"error": {"message": f"bad key {REDACTED}", "param": None, "code": 401,
                                                     "details": [{"hint": f"Bearer {REDACTED}"}, 3.5, True]}}
    assert redactor.redact(None) is None and redactor.redact("") == ""


def test_the_log_filter_redacts_messages_and_tracebacks_until_detached(caplog):
    redactor = Redactor((PROVIDER_KEY,))
    logger = logging.getLogger("link.test_redact_probe")
    log_filter = attach_log_filter(redactor)
    try:
        with caplog.at_level(logging.INFO):
            try:
                raise RuntimeError(f"provider said: bad key {PROVIDER_KEY}")
            except RuntimeError:
                logger.exception("call to %s failed", f"http://user:{PROVIDER_KEY}@h.example/v1")
            logging.getLogger("httpx").info("HTTP Request: GET http://user:pw-0123456789@h.example/health")
    finally:
        detach_log_filter(log_filter)
    assert PROVIDER_KEY not in caplog.text and "pw-0123456789" not in caplog.text
    assert "call to http://[redacted]@h.example/v1 failed" in caplog.text
    assert "RuntimeError: provider said: bad key [redacted]" in caplog.text   # the traceback, redacted
    caplog.clear()
    with caplog.at_level(logging.INFO):
        logger.info("after: %s", PROVIDER_KEY)   # detached: the gateway's filter goes with its lifespan
    assert f"after: {PROVIDER_KEY}" in caplog.text


def test_the_log_filter_keeps_the_arguments_a_formatter_unpacks(capsys):
    # uvicorn's access-log formatter unpacks a record's five arguments: the filter once replaced them by None,
    # and every access line became a "--- Logging error ---" traceback
    from uvicorn.logging import AccessFormatter

    handler = logging.StreamHandler()
    handler.setFormatter(AccessFormatter('%(client_addr)s - "%(request_line)s" %(status_code)s', use_colors=False))
    logger = logging.getLogger("uvicorn.access")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    log_filter = attach_log_filter(Redactor((PROVIDER_KEY,)), packages=("uvicorn.access",))
    try:
        logger.info('%s - "%s %s HTTP/%s" %d', "127.0.0.1:5000", "GET", f"/v1/models?key={PROVIDER_KEY}", "1.1", 200)
    finally:
        detach_log_filter(log_filter)
        logger.removeHandler(handler)
        logger.setLevel(level)
    err = capsys.readouterr().err
    assert "Logging error" not in err and PROVIDER_KEY not in err
    # (another library's filter on these loggers may redact the query further: only the line's frame is ours to check)
    line = err.strip()
    assert line.startswith('127.0.0.1:5000 - "GET /v1/models?') and line.endswith(' HTTP/1.1" 200 OK'), line


@pytest.mark.parametrize("kind", ["openai", "litellm"])
def test_a_closed_port_behind_credentials_is_reported_without_them(kind):
    password = "pw-closed-port-0123456789"
    api_base = f"http://linkuser:{password}@127.0.0.1:{free_port()}/v1"
    model = "openai/mock-model" if kind == "litellm" else "mock-model"
    backend = make_backend(ModelDeployment(name="closed", kind=kind, model=model, api_base=api_base))
    # kind openai: refused; LiteLLM's HTTP client refuses credentials in the URL beside its own Authorization header
    with pytest.raises(BackendUnavailable if kind == "openai" else BackendError) as info:
        asyncio.run(backend.complete("chat", {"model": model, "messages": [{"role": "user", "content": "hi"}]}))
    error = info.value
    assert password not in str(error) and password not in error.message and password not in repr(error.to_openai())
    if kind == "openai":
        assert error.message.startswith("closed: connection to http://[redacted]@127.0.0.1:")
