"""Open mode (development, no master key, no stored key: link/auth.py) lets anyone in as the admin, by design for a
local trial: `/api/requests` (the request log) answers a caller with no key at all. The start-up log
says so once; with a master key there is no warning and the request log needs the key. Through the real gateway and
a mock provider, on SQLite.

    .venv/bin/python -m pytest -q tests/link/test_open_mode_warning.py
"""

from __future__ import annotations

import logging

import httpx
import pytest

from link.config import parse_config
from tests.link.gateway_launch import MASTER_KEY, gateway_settings, mock_deployment, start_gateway_thread
from tests.link.mock_launch import start_mock_thread


@pytest.fixture(scope="module")
def mock():
    with start_mock_thread() as server:
        yield server


def _start(mock, new_database_url, tmp_path, caplog, master_key):
    """(/api/requests without a key, with the master key) and the link.auth WARNING lines of one start."""
    settings = gateway_settings(new_database_url("sqlite"), tmp_path, master_key=master_key)
    config = parse_config({"models": [mock_deployment("m", mock.api_base)]})
    with caplog.at_level(logging.WARNING, logger="link.auth"), start_gateway_thread(settings, config) as gateway:
        anonymous = httpx.get(gateway.url + "/api/requests")
        admin = httpx.get(gateway.url + "/api/requests", headers={"Authorization": f"Bearer {MASTER_KEY}"})
    return anonymous, admin, [r.getMessage() for r in caplog.records if r.name == "link.auth"]


def test_open_mode_is_logged_once_at_start(mock, new_database_url, tmp_path, caplog):
    anonymous, _, lines = _start(mock, new_database_url, tmp_path, caplog, master_key=None)
    assert anonymous.status_code == 200  # by design: the request log answers anyone in open mode
    (line,) = lines  # once, not per request
    assert line.startswith("open mode: no master key (LINK_MASTER_KEY) and no API key stored")
    assert "/api/requests" in line and "127.0.0.1:" in line and "link keys create" in line


def test_with_a_master_key_there_is_no_warning_and_the_log_needs_it(mock, new_database_url, tmp_path, caplog):
    anonymous, admin, lines = _start(mock, new_database_url, tmp_path, caplog, master_key=MASTER_KEY)
    assert lines == []
    assert anonymous.status_code == 401 and admin.status_code == 200
