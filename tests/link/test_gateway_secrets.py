"""Provider secrets never leave the gateway: a provider error that echoes the key the gateway sent, and a
connection error to an `api_base` holding `user:password@`, reach the client, the request log and our logs
with the secret replaced by "[redacted]" (link/redact.py), through kind openai and kind litellm.

The providers are real loopback servers (tests/link/mock_openai.py): mode "401" answers OpenAI's
"Incorrect API key provided: KEY" with the key it received, mode "error-event" fails a stream midway with an
error event echoing it (and a whole answer with a 500 echoing it); the credentials point at a closed port.
Every leaking request is made once per database (SQLite, PostgreSQL) by the module's `exchanges` fixture; the
tests then look for the key and the password in the bodies, the headers, the SSE streams, `/api/models`, every
column of every `request_log` row and every log record (any logger, any level) written while the requests ran.
"""

from __future__ import annotations

import json
import logging
import secrets
from dataclasses import dataclass, field

import httpx
import pytest
from sqlalchemy import text

from tests.link.conftest import DB_BACKENDS
from tests.link.gateway_launch import MASTER_KEY, gateway_settings, mock_deployment, start_gateway_thread
from tests.link.mock_launch import start_mock_thread

KEY_ENV = "LINK_TEST_LEAKY_PROVIDER_KEY"
# Not shaped like any known token ("sk-..."): only the configured key itself can be redacted.
PROVIDER_KEY = "prov-" + secrets.token_hex(16)
PASSWORD = "pw-" + secrets.token_hex(12)
SECRETS = (PROVIDER_KEY, PASSWORD)
KINDS = ("openai", "litellm")
AUTH = {"Authorization": f"Bearer {MASTER_KEY}"}
OUR_PACKAGES = ("link", "web", "routers", "serving")


@dataclass
class Exchanges:
    """What the leaking requests gave back: (label, status, headers, body text) per answer, the log records
    written meanwhile, and the request-log table dumped as text."""

    answers: list[tuple[str, int, dict, str]] = field(default_factory=list)
    log_records: list[logging.LogRecord] = field(default_factory=list)
    log_text: list[str] = field(default_factory=list)
    table_dump: str = ""
    num_rows: int = 0
    models_listing: str = ""  # GET /api/models, which shows each deployment's api_base


class _Collect(logging.Handler):
    def __init__(self, exchanges: Exchanges):
        super().__init__(logging.DEBUG)
        self.exchanges = exchanges
        self.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.exchanges.log_records.append(record)
        self.exchanges.log_text.append(self.format(record))


# (model name suffix, the mock serving it); every request has its own model, so that a replica ejected by one
# failure cannot turn the next request's error into "no healthy deployment".
CASES = (("401", "rejecting"), ("event", "failing"), ("creds", "dropping"))
CHAT = {"messages": [{"role": "user", "content": "one two three four"}]}


def _model(kind: str, case: str, stream: bool) -> str:
    return f"{kind}-{case}-{'stream' if stream else 'whole'}"


@pytest.fixture(scope="module", params=DB_BACKENDS)
def exchanges(request, new_database_url, tmp_path_factory):
    from link.config import parse_config

    with pytest.MonkeyPatch.context() as env, start_mock_thread("401") as rejecting, \
            start_mock_thread("error-event", die_after=2) as failing, start_mock_thread("die", die_after=0) as dropping:
        env.setenv(KEY_ENV, PROVIDER_KEY)
        # the dropping server answers health checks (so its replica stays in rotation) but drops every request's
        # connection: the error names the api_base, password included
        bases = {"rejecting": rejecting.api_base, "failing": failing.api_base,
                 "dropping": dropping.api_base.replace("://", f"://linkuser:{PASSWORD}@")}
        models = [mock_deployment(_model(kind, case, stream), bases[mock], kind, api_key_env=KEY_ENV)
                  for kind in KINDS for case, mock in CASES for stream in (False, True)]
        config = parse_config({"models": models})
        url = new_database_url(request.param)
        settings = gateway_settings(url, tmp_path_factory.mktemp("home"))
        result = Exchanges()
        collect = _Collect(result)
        root = logging.getLogger()
        old_level = root.level
        root.addHandler(collect)
        root.setLevel(logging.DEBUG)
        try:
            with start_gateway_thread(settings, config) as gateway:
                for model in (m["name"] for m in models):
                    body = {"model": model, **CHAT, "stream": model.endswith("stream")}
                    answer = httpx.post(gateway.base_url + "/chat/completions", json=body, headers=AUTH, timeout=30)
                    result.answers.append((model, answer.status_code, dict(answer.headers), answer.text))
                result.models_listing = httpx.get(gateway.url + "/api/models", headers=AUTH, timeout=30).text
                gateway.flush_log()
                with gateway.state.db.connect() as connection:
                    rows = connection.execute(text("SELECT * FROM request_log")).all()
        finally:
            root.removeHandler(collect)
            root.setLevel(old_level)
        result.table_dump, result.num_rows = "\n".join(repr(tuple(row)) for row in rows), len(rows)
        yield result


def _answer(exchanges: Exchanges, model: str) -> tuple[int, dict, str]:
    (found,) = [a[1:] for a in exchanges.answers if a[0] == model]
    return found


def _leaks(text: str) -> list[str]:
    return [s for s in SECRETS if s in text]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("stream", [False, True])
def test_a_key_the_provider_echoes_is_redacted_in_the_answer(exchanges, kind, stream):
    status, headers, body = _answer(exchanges, _model(kind, "401", stream))
    assert status == 401  # the provider's status is kept, only the key goes
    error = _error_object(body)
    assert "Incorrect API key provided: [redacted]." in error["message"]
    assert not _leaks(body) and not _leaks(repr(headers))


@pytest.mark.parametrize("kind", KINDS)
def test_a_key_in_a_mid_stream_error_event_is_redacted(exchanges, kind):
    status, headers, body = _answer(exchanges, _model(kind, "event", True))
    assert status == 200
    events = [e for e in body.split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    error = _error_object(events[-2].removeprefix("data: "))
    assert "upstream failure serving key [redacted]" in error["message"]
    assert not _leaks(body) and not _leaks(repr(headers))


@pytest.mark.parametrize("kind", KINDS)
def test_a_key_in_a_provider_5xx_is_redacted(exchanges, kind):
    status, headers, body = _answer(exchanges, _model(kind, "event", False))
    assert status == 500
    assert _error_object(body)["message"] == f"{_model(kind, 'event', False)}: upstream failure serving key [redacted]"
    assert not _leaks(body) and not _leaks(repr(headers))


@pytest.mark.parametrize("stream", [False, True])
def test_api_base_credentials_are_redacted_in_a_connection_error(exchanges, stream):
    model = _model("openai", "creds", stream)
    status, headers, body = _answer(exchanges, model)
    assert status == 503
    message = _error_object(body)["message"]
    assert message.startswith(f"{model}: connection to http://[redacted]@127.0.0.1:"), message
    assert not _leaks(body) and not _leaks(repr(headers))


@pytest.mark.parametrize("stream", [False, True])
def test_litellm_errors_about_api_base_credentials_hold_none(exchanges, stream):
    # LiteLLM's HTTP client refuses credentials in the URL beside its Authorization header: its error is passed on
    status, headers, body = _answer(exchanges, _model("litellm", "creds", stream))
    assert status >= 500 and _error_object(body)["message"]
    assert not _leaks(body) and not _leaks(repr(headers))


def test_api_models_shows_the_api_base_without_credentials(exchanges):
    assert "http://[redacted]@127.0.0.1:" in exchanges.models_listing
    assert not _leaks(exchanges.models_listing)


def test_the_request_log_holds_no_secret(exchanges):
    assert exchanges.num_rows == len(exchanges.answers)
    assert exchanges.table_dump.count("[redacted]") >= 10  # the errors are stored, their secrets are not
    assert not _leaks(exchanges.table_dump)


def test_the_logs_hold_no_secret(exchanges):
    assert exchanges.log_text  # the health checks and provider calls logged (httpx logs each URL)
    leaking = [t for t in exchanges.log_text if _leaks(t)]
    assert not leaking, leaking[:3]


def _error_object(text: str) -> dict:
    payload = json.loads(text)
    assert set(payload) == {"error"} and set(payload["error"]) >= {"message", "type", "param", "code"}, payload
    return payload["error"]
