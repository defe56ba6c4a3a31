"""`/api/policies` CRUD with validation, on SQLite and on PostgreSQL (the `db_url` fixture), and the
created policies serving requests; the request log is read back over `/api/requests` on both databases.
"""

from __future__ import annotations

import time

import httpx
import pytest

from link.keys import create_key
from tests.link.gateway_launch import MASTER_KEY, gateway_settings, mock_deployment, start_gateway_thread
from tests.link.mock_launch import refused_url, start_mock_thread

AUTH = {"Authorization": f"Bearer {MASTER_KEY}"}
MESSAGES = [{"role": "user", "content": "policy test"}]


@pytest.fixture(scope="module")
def gateway(db_url, tmp_path_factory):
    from link.config import parse_config

    with start_mock_thread() as mock:
        config = parse_config({"models": [mock_deployment("m1", mock.api_base), mock_deployment("m2", mock.api_base),
                                          mock_deployment("down", refused_url())],
                               "policies": [{"name": "from-config", "type": "fixed", "models": ["m1"]}]})
        with start_gateway_thread(gateway_settings(db_url, tmp_path_factory.mktemp("home")), config) as server:
            yield server


@pytest.fixture
def api(gateway):
    with httpx.Client(base_url=gateway.url + "/api", headers=AUTH) as client:
        yield client


def test_crud_roundtrip(api, gateway, db_url):
    name = f"crud-{db_url[:6]}"
    created = api.post("/policies", json={"name": name, "type": "fallback", "models": ["down", "m2"]})
    assert created.status_code == 201, created.text
    assert created.json()["models"] == ["down", "m2"] and created.json()["id"] >= 1
    assert api.get(f"/policies/{name}").json()["type"] == "fallback"
    listed = {p["name"]: p["source"] for p in api.get("/policies").json()["data"]}
    assert listed[name] == "database" and listed["from-config"] == "config"

    chat = httpx.post(gateway.base_url + "/chat/completions", json={"model": name, "messages": MESSAGES}, headers=AUTH)
    assert chat.status_code == 200 and chat.headers["x-link-policy"] == name and chat.headers["x-link-model"] == "m2"
    assert name in {m["id"] for m in httpx.get(gateway.base_url + "/models", headers=AUTH).json()["data"]}

    patched = api.patch(f"/policies/{name}", json={"options": {"note": "x"}})
    assert patched.status_code == 200 and patched.json()["models"] == ["down", "m2"] and patched.json()["options"] == {"note": "x"}
    replaced = api.put(f"/policies/{name}", json={"type": "fixed", "models": ["m1"]})
    assert replaced.status_code == 200 and replaced.json()["options"] == {}
    chat = httpx.post(gateway.base_url + "/chat/completions", json={"model": name, "messages": MESSAGES}, headers=AUTH)
    assert chat.headers["x-link-model"] == "m1"

    assert api.delete(f"/policies/{name}").status_code == 204
    assert api.get(f"/policies/{name}").status_code == 404
    gone = httpx.post(gateway.base_url + "/chat/completions", json={"model": name, "messages": MESSAGES}, headers=AUTH)
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "model_not_found"

    deadline = time.monotonic() + 10
    while True:  # the request log, read back over the API (rows are written just after each response)
        gateway.flush_log()
        rows = httpx.get(gateway.url + "/api/requests", params={"policy": name}, headers=AUTH).json()
        if len(rows) == 3 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert sorted(r["status"] for r in rows) == ["invalid_request", "ok", "ok"]
    assert {r["model"] for r in rows if r["status"] == "ok"} == {"m1", "m2"}


@pytest.mark.parametrize("body,status,param", [
    ({"name": "p", "type": "fallback", "models": ["m1", "nope"]}, 400, "models"),
    ({"name": "p", "type": "fixed", "models": ["m1", "m2"]}, 400, "models"),
    ({"name": "p", "type": "fallback", "models": ["m1"]}, 400, "models"),
    ({"name": "p", "type": "fallback", "models": ["m1", "m1"]}, 400, "models"),
    ({"name": "p", "type": "mystery", "models": ["m1"]}, 400, "type"),
    ({"name": "p", "models": ["m1"]}, 400, "type"),
    ({"name": "", "type": "fixed", "models": ["m1"]}, 400, "name"),
    ({"name": "m1", "type": "fixed", "models": ["m2"]}, 409, "name"),
    ({"name": "from-config", "type": "fixed", "models": ["m2"]}, 409, "name"),
])
def test_create_validation(api, body, status, param):
    response = api.post("/policies", json=body)
    assert response.status_code == status, response.text
    assert response.json()["error"]["param"] == param and response.json()["error"]["message"]


def test_duplicate_update_and_delete_errors(api):
    assert api.post("/policies", json={"name": "dup", "type": "fixed", "models": ["m1"]}).status_code == 201
    assert api.post("/policies", json={"name": "dup", "type": "fixed", "models": ["m2"]}).status_code == 409
    assert api.put("/policies/dup", json={"models": ["m2"]}).json()["error"]["param"] == "type"
    assert api.patch("/policies/dup", json={"models": ["m1", "m2"]}).json()["error"]["param"] == "models"
    assert api.patch("/policies/dup", json={"models": "m1"}).status_code == 400
    assert api.patch("/policies/missing", json={"models": ["m1"]}).status_code == 404
    assert api.delete("/policies/missing").status_code == 404
    assert api.delete("/policies/from-config").status_code == 409
    assert api.delete("/policies/dup").status_code == 204


def test_management_needs_the_master_key(gateway, session):
    _, plaintext = create_key(session, "not-admin")
    url = gateway.url + "/api/policies"
    assert httpx.get(url).status_code == 401
    forbidden = httpx.get(url, headers={"Authorization": f"Bearer {plaintext}"})
    assert forbidden.status_code == 403 and forbidden.json()["error"]["type"] == "permission_error"
    assert httpx.get(gateway.url + "/api/requests", headers={"Authorization": f"Bearer {plaintext}"}).status_code == 403
    # the same key may call the models
    ok = httpx.post(gateway.base_url + "/chat/completions", json={"model": "m1", "messages": MESSAGES},
                    headers={"Authorization": f"Bearer {plaintext}"})
    assert ok.status_code == 200
