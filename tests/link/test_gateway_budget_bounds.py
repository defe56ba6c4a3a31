"""Token counts and money at the gateway's boundary, on SQLite and PostgreSQL: a `max_tokens` or
`max_completion_tokens` no candidate can produce is a 400 naming the field (it used to overflow the budget
ledger into a 500), nothing is held for it, and a large but legal value reserves its full cost.

    LINK_HOME=.link .venv/bin/python -m pytest -q tests/link/test_gateway_budget_bounds.py
"""

from __future__ import annotations

import time

import openai
import pytest
from sqlmodel import Session

from link.keys import create_key, get_key
from tests.link.gateway_launch import gateway_settings, mock_deployment, start_gateway_thread
from tests.link.mock_launch import start_mock_thread

MAX_INT32 = 2**31 - 1  # the documented bound when a model's context length is unknown
SHORT_CONTEXT = 4096
MESSAGES = [{"role": "user", "content": "hi"}]
# "priced" costs $1000 / $2000 per million prompt / completion tokens (mock_deployment's prices).
OUTPUT_USD_PER_TOKEN = 2000 / 1e6


@pytest.fixture(scope="module")
def mock():
    # slow chunks: a stream holds its reservation long enough to read it from the database
    with start_mock_thread(chunk_delay_s=0.3) as server:
        yield server


@pytest.fixture(scope="module")
def gateway(db_url, mock, tmp_path_factory):
    from link.config import parse_config

    config = parse_config({"models": [mock_deployment("priced", mock.api_base),
                                      mock_deployment("short", mock.api_base, context_length=SHORT_CONTEXT)]})
    with start_gateway_thread(gateway_settings(db_url, tmp_path_factory.mktemp("home")), config) as server:
        yield server


def _client(gateway, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0, timeout=30)


def _ledger(engine, key_id: int, *, settled: bool = False) -> tuple[float, float]:
    """(spend_usd, reserved_usd) of a key, read fresh from the database; `settled`: once nothing is reserved (a
    stream settles just after its last byte), waiting at most 10 s."""
    deadline = time.monotonic() + 10
    while True:
        with Session(engine) as fresh:
            key = get_key(fresh, key_id)
        if not settled or key.reserved_usd == 0 or time.monotonic() > deadline:
            return key.spend_usd, key.reserved_usd
        time.sleep(0.05)


@pytest.mark.parametrize("budget_usd", [1.0, None], ids=["budget", "no-budget"])
@pytest.mark.parametrize("value", [10**15, 2**63, 1e30], ids=["1e15", "2^63", "1e30-float"])
@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_huge_completion_tokens_are_a_400_naming_the_field(gateway, engine, session, field, value, budget_usd):
    key, plaintext = create_key(session, f"huge-{field}", budget_usd=budget_usd)
    with pytest.raises(openai.BadRequestError) as refused:
        _client(gateway, plaintext).chat.completions.create(model="priced", messages=MESSAGES, **{field: value})
    error = refused.value.body
    assert refused.value.status_code == 400
    assert error["param"] == field and error["type"] == "invalid_request_error", error
    if isinstance(value, int):  # a float is refused by the schema already ("a valid integer")
        assert error["code"] == "invalid_value"
        assert error["message"] == (f"{field} is too large: {value}. This model supports at most {MAX_INT32} "
                                    f"completion tokens, whereas you provided {value}.")
    assert _ledger(engine, key.id) == (0.0, 0.0)   # nothing held, nothing spent


def test_the_bound_is_the_models_context_length_when_known(gateway, engine, session):
    key, plaintext = create_key(session, "short-context", budget_usd=1000.0)
    client = _client(gateway, plaintext)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="short", messages=MESSAGES, max_completion_tokens=SHORT_CONTEXT + 1)
    assert refused.value.body["param"] == "max_completion_tokens"
    assert f"supports at most {SHORT_CONTEXT} completion tokens" in refused.value.body["message"]
    assert _ledger(engine, key.id) == (0.0, 0.0)
    reply = client.chat.completions.create(model="short", messages=MESSAGES, max_completion_tokens=SHORT_CONTEXT)
    assert reply.choices[0].message.content == "You said: hi"


@pytest.mark.parametrize("budget_usd", [5e6, None], ids=["budget", "no-budget"])
def test_the_largest_legal_max_tokens_reserves_its_full_cost(gateway, engine, session, budget_usd):
    key, plaintext = create_key(session, "largest-legal", budget_usd=budget_usd)
    stream = _client(gateway, plaintext).chat.completions.create(model="priced", messages=MESSAGES,
                                                                 max_tokens=MAX_INT32, stream=True)
    first = next(iter(stream))  # the answer has started: the reservation is held until its last chunk
    assert first.choices[0].delta.role == "assistant"
    spend, reserved = _ledger(engine, key.id)
    completion_usd = MAX_INT32 * OUTPUT_USD_PER_TOKEN   # $4,294,967.29: far inside the ledger's range
    assert spend == 0.0 and completion_usd < reserved < completion_usd + 1.0   # + the estimated prompt's cost
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text == "You said: hi"
    # The mock's usage: 1 prompt and 3 completion tokens.
    assert _ledger(engine, key.id, settled=True) == (pytest.approx((1 * 1000 + 3 * 2000) / 1e6), 0.0)
