"""Budget reservations across a `kill -9` of a real `link serve` process, on SQLite and PostgreSQL: the killed
process's holds are released when it starts again (under the same LINK_INSTANCE_ID at once; under a fresh id
once its lease expired), so the next request that fits the unspent budget gets a 200 instead of "requests in
flight hold the rest"; a live replica's holds survive the other's start-up.

The gateway that starts again is the same app with the same settings (instance id, lease) served in this process: its
start-up (`link.state.open_gateway`, which releases the holds) is what is tested, and it starts in a fraction of a
second where a second `link serve` process would spend seconds importing.

    LINK_HOME=.link .venv/bin/python -m pytest -q tests/link/test_gateway_reservations.py
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from sqlmodel import Session

from link.config import parse_config
from link.keys import create_key, get_key
from tests.link.gateway_launch import (gateway_settings, mock_deployment, start_gateway_process, start_gateway_thread,
                                       write_config)
from tests.link.mock_launch import start_mock_thread

BODY = {"model": "priced", "messages": [{"role": "user", "content": "hello world"}], "max_tokens": 5}
# One request holds about $0.15 (its estimated prompt and 5 completion tokens at $1000 / $2000 per million), so
# a budget of $0.25 admits one at a time; the mock's answer then costs (2 * 1000 + 4 * 2000) / 1e6.
BUDGET_USD, COST_USD = 0.25, (2 * 1000 + 4 * 2000) / 1e6


@pytest.fixture(scope="module")
def mock():
    with start_mock_thread(hang_s=120) as server:
        yield server


@pytest.fixture
def live_replica(db_url, mock, tmp_path):
    """A second gateway (in this process) whose lease is short: its holds survive only while it beats."""
    config = parse_config({"models": [mock_deployment("priced", mock.api_base)]})
    with start_gateway_thread(gateway_settings(db_url, tmp_path / "live", budget_lease_s=1.0), config) as server:
        yield server


def _post(url: str, key: str, **extra) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", json={**BODY, **extra}, headers={"Authorization": f"Bearer {key}"},
                      timeout=60)


def _reserved(engine, key_id: int) -> float:
    with Session(engine) as fresh:
        return get_key(fresh, key_id).reserved_usd


def _wait_for(condition, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _kill_with_a_request_in_flight(gateway, engine, key_id: int, plaintext: str) -> None:
    """Send a request that hangs at the backend, wait until its cost is held, then SIGKILL the gateway."""
    hanging = threading.Thread(target=lambda: pytest.raises(httpx.HTTPError, _post, gateway.url, plaintext,
                                                            metadata={"mock_mode": "hang"}), daemon=True)
    hanging.start()
    assert _wait_for(lambda: _reserved(engine, key_id) > 0), "the hanging request never reserved its cost"
    gateway.process.kill()   # kill -9: no shutdown, nothing settled
    gateway.process.wait()
    hanging.join(timeout=30)


@pytest.mark.parametrize("instance_id", ["replica-a", None], ids=["same-instance-id", "fresh-id-lease-expired"])
def test_a_killed_gateways_holds_are_released_when_it_starts_again(db_url, engine, session, mock, tmp_path,
                                                                   live_replica, instance_id):
    lease_s = 30.0 if instance_id else 1.0
    env = {"LINK_BUDGET_LEASE_S": str(lease_s)}
    if instance_id:
        env["LINK_INSTANCE_ID"] = f"{instance_id}-{tmp_path.name}"   # unique to this test: the database is shared
    entries = [mock_deployment("priced", mock.api_base)]
    config = write_config(tmp_path / "link.yaml", entries)
    key, plaintext = create_key(session, f"killed-{instance_id}", budget_usd=BUDGET_USD)
    gateway = start_gateway_process(config, db_url, tmp_path / "home", **env)
    try:
        _kill_with_a_request_in_flight(gateway, engine, key.id, plaintext)
        held = _reserved(engine, key.id)
        assert 0.1 < held < BUDGET_USD        # the dead process's hold is still there ...
        # ... and the live replica holds money of another key (its heartbeat renews its 1 s lease).
        other, _ = create_key(session, f"live-{instance_id}", budget_usd=1.0)
        live_ledger = live_replica.state.accounting.ledger
        live_hold = live_ledger.reserve(other.id, 0.3)
        if instance_id:   # the bug, seen through the live replica: the dead hold blocks a request that fits
            refused = _post(live_replica.url, plaintext)
            assert refused.status_code == 429 and "requests in flight hold the rest" in refused.json()["error"]["message"]
        settings = gateway_settings(db_url, tmp_path / "home", budget_lease_s=lease_s,
                                    instance_id=env.get("LINK_INSTANCE_ID"))
        gateway = start_gateway_thread(settings, parse_config({"models": entries}))
        if instance_id:   # the same id: released by the start-up itself, before the first request
            assert _reserved(engine, key.id) == 0
        else:             # a fresh id: released once the dead lease expired, by a start-up or a heartbeat
            assert _wait_for(lambda: _reserved(engine, key.id) == 0, timeout_s=10)
        answered = _post(gateway.url, plaintext)
        assert answered.status_code == 200, answered.text
        assert _wait_for(lambda: _reserved(engine, key.id) == 0)
        session.expire_all()
        assert get_key(session, key.id).spend_usd == pytest.approx(COST_USD)
        # The live replica's hold survived the start-up (and the lease sweeps since): it settles normally.
        assert _reserved(engine, other.id) == pytest.approx(0.3)
        live_ledger.settle(live_hold, 0.1)
        session.expire_all()
        state = get_key(session, other.id)
        assert state.reserved_usd == 0 and state.spend_usd == pytest.approx(0.1)
    finally:
        gateway.stop()
