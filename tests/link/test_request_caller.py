"""Who a request-log row says sent the request (`RequestLog.caller`, link/auth.py `caller_of`): a stored key
(its api_key_id), the master key, open mode (development, no master key, no stored key: anonymous), or nobody
for a 401 refusal. Both a refusal and an open-mode request have no api_key_id, like the master key's rows; the
caller tells them apart for an audit. Through the real gateway and a mock provider, on SQLite."""

from __future__ import annotations

import httpx
import pytest
from sqlmodel import Session

from link.config import parse_config
from link.db import make_db_engine
from link.keys import create_key
from tests.link.gateway_launch import MASTER_KEY, gateway_settings, logged_request, mock_deployment, start_gateway_thread
from tests.link.mock_launch import start_mock_thread
from web.formatting import caller_label

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.fixture(scope="module")
def mock():
    with start_mock_thread() as server:
        yield server


def _row(gateway, key: str) -> tuple[int, dict]:
    answer = httpx.post(gateway.base_url + "/chat/completions", json=BODY, headers={"Authorization": f"Bearer {key}"})
    return answer.status_code, logged_request(gateway, answer.headers["x-link-request-id"])


def test_rows_name_the_master_key_a_stored_key_and_no_key_for_a_401(mock, new_database_url, tmp_path):
    url = new_database_url("sqlite")
    config = parse_config({"models": [mock_deployment("m", mock.api_base)]})
    with start_gateway_thread(gateway_settings(url, tmp_path), config) as gateway:
        engine = make_db_engine(url, pool_size=1)
        with Session(engine) as session:
            key, plaintext = create_key(session, "alice")
        engine.dispose()

        status, master = _row(gateway, MASTER_KEY)
        assert status == 200 and (master["api_key_id"], master["caller"]) == (None, "master")
        status, stored = _row(gateway, plaintext)
        assert status == 200 and (stored["api_key_id"], stored["caller"]) == (key.id, "key")
        status, refused = _row(gateway, "sk-link-not-a-key")
        assert status == 401 and refused["status"] == "unauthorized"
        assert (refused["api_key_id"], refused["caller"]) == (None, None)

        listed = {r["id"]: r for r in httpx.get(gateway.url + "/api/requests", headers={"Authorization": f"Bearer {MASTER_KEY}"}).json()}
        assert [caller_label(listed[r["id"]]) for r in (master, stored, refused)] == ["master", str(key.id), "none (refused)"]


def test_an_open_mode_row_is_anonymous_not_the_master_key(mock, new_database_url, tmp_path):
    settings = gateway_settings(new_database_url("sqlite"), tmp_path, master_key=None)  # development, no key stored
    config = parse_config({"models": [mock_deployment("m", mock.api_base)]})
    with start_gateway_thread(settings, config) as gateway:
        status, row = _row(gateway, "anything")
        assert status == 200 and (row["api_key_id"], row["caller"]) == (None, "open")
        assert caller_label(row) == "open (anonymous)"


@pytest.mark.parametrize("row, label", [
    ({"api_key_id": 7, "caller": "key"}, "7"), ({"api_key_id": None, "caller": "key"}, "deleted key"),
    ({"api_key_id": None, "caller": "master"}, "master"), ({"api_key_id": None, "caller": "open"}, "open (anonymous)"),
    ({"api_key_id": None, "caller": None, "http_status": 401}, "none (refused)"),
    ({"api_key_id": None, "caller": None, "http_status": 200}, "–")])  # a row from before the caller was recorded
def test_the_console_names_each_caller(row, label):
    assert caller_label(row) == label
