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

    assert api.patch(f"/policies/{name}", json={"options": {"note": "x"}}).json()["error"]["param"] == "options.note"
    patched = api.patch(f"/policies/{name}", json={"options": {"capture_traces": True}})
    assert patched.status_code == 200 and patched.json()["models"] == ["down", "m2"]
    assert patched.json()["options"] == {"capture_traces": True}
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
    assert api.delete("/policies/from-config").status_code == 409  # read-only: edit link.yaml
    assert api.delete("/policies/dup").status_code == 204


def test_a_model_name_is_not_a_stored_policy(api):
    for response in (api.delete("/policies/m1"), api.get("/policies/m1"), api.patch("/policies/m1", json={"options": {}})):
        assert response.status_code == 404, response.text
        assert "model names are implicit fixed policies" in response.json()["error"]["message"]


def test_bodies_that_are_not_json_or_carry_unknown_fields(api):
    bad = api.post("/policies", content=b'{"name": "p", "type": "fixed",, "models": ["m1"]}',
                   headers={"content-type": "application/json"})
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
    assert "not parse the JSON body" in bad.json()["error"]["message"] and "line 1 column 31" in bad.json()["error"]["message"]
    unknown = api.post("/policies", json={"name": "p-extra", "type": "fixed", "models": ["m1"], "weights": [1]})
    assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "weights"
    assert "weights" in unknown.json()["error"]["message"]
    assert api.get("/policies/p-extra").status_code == 404  # nothing was stored
    assert api.post("/policies", json={"name": "p-extra", "type": "fixed", "models": ["m1"]}).status_code == 201
    patched = api.patch("/policies/p-extra", json={"model": ["m2"]})
    assert patched.status_code == 400 and patched.json()["error"]["param"] == "model"
    assert api.delete("/policies/p-extra").status_code == 204


def test_patch_renames_a_policy(api, gateway):
    assert api.post("/policies", json={"name": "old-name", "type": "fixed", "models": ["m1"]}).status_code == 201
    assert api.post("/policies", json={"name": "taken", "type": "fixed", "models": ["m2"]}).status_code == 201
    for name in ("taken", "m1", "from-config"):  # a database policy, a model, a config policy
        conflict = api.patch("/policies/old-name", json={"name": name})
        assert conflict.status_code == 409 and conflict.json()["error"]["param"] == "name", conflict.text
    renamed = api.patch("/policies/old-name", json={"name": "new-name"})
    assert renamed.status_code == 200 and renamed.json()["name"] == "new-name" and renamed.json()["models"] == ["m1"]
    assert api.get("/policies/old-name").status_code == 404
    chat = httpx.post(gateway.base_url + "/chat/completions", json={"model": "new-name", "messages": MESSAGES}, headers=AUTH)
    assert chat.status_code == 200 and chat.headers["x-link-policy"] == "new-name"
    gone = httpx.post(gateway.base_url + "/chat/completions", json={"model": "old-name", "messages": MESSAGES}, headers=AUTH)
    assert gone.status_code == 404
    assert api.put("/policies/new-name", json={"name": "newer", "type": "fixed", "models": ["m2"]}).json()["name"] == "newer"
    assert api.delete("/policies/newer").status_code == 204 and api.delete("/policies/taken").status_code == 204


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
