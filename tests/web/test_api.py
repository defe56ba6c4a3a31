"""The management endpoints the console is built on (each usable by scripts with the master key):
/api/keys, /api/route, /api/traffic, /api/models, /api/evals."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

import httpx
import pytest

from tests.link.gateway_launch import MASTER_KEY
from tests.web.conftest import LOCAL_MODEL, MOCK_PRICES

AUTH = {"Authorization": f"Bearer {MASTER_KEY}"}


@pytest.fixture
def api(console_gateway):
    with httpx.Client(base_url=console_gateway.url, headers=AUTH, timeout=30) as client:
        yield client


def mock_cost(prompt_tokens: int, completion_tokens: int) -> float:
    return (prompt_tokens * MOCK_PRICES["input_cost_per_million"]
            + completion_tokens * MOCK_PRICES["output_cost_per_million"]) / 1e6


def test_keys_create_list_revoke(api, console_gateway):
    created = api.post("/api/keys", json={"name": "script", "budget_usd": 25.0, "rpm_limit": 100})
    assert created.status_code == 201, created.text
    key = created.json()
    assert key["key"].startswith("sk-link-") and key["key"].startswith(key["key_prefix"]) and key["budget_usd"] == 25.0
    listed = {k["id"]: k for k in api.get("/api/keys").json()}
    assert "key" not in listed[key["id"]] and listed[key["id"]]["rpm_limit"] == 100

    chat = httpx.post(console_gateway.base_url + "/chat/completions", headers={"Authorization": f"Bearer {key['key']}"},
                      json={"model": "m1", "messages": [{"role": "user", "content": "count my spend"}]})
    assert chat.status_code == 200, chat.text
    usage = chat.json()["usage"]
    spend = api.get(f"/api/keys/{key['id']}").json()["spend_usd"]
    assert math.isclose(spend, mock_cost(usage["prompt_tokens"], usage["completion_tokens"]), rel_tol=1e-9)

    revoked = api.delete(f"/api/keys/{key['id']}")
    assert revoked.status_code == 200 and revoked.json()["revoked_at"] is not None
    assert api.get("/api/keys", params={"include_revoked": "false"}).json() == [
        k for k in api.get("/api/keys").json() if k["revoked_at"] is None]
    assert api.delete("/api/keys/999999").json()["error"]["code"] == "key_not_found"


def test_keys_budget_update_applies_to_the_next_request(api, console_gateway):
    key = api.post("/api/keys", json={"name": "budgeted", "budget_usd": 100.0}).json()
    body = {"model": "m1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10}
    # a request reserves its worst cost first: prompt + max_tokens at the mock prices, well above 1e-6 USD
    changed = api.patch(f"/api/keys/{key['id']}", json={"budget_usd": 1e-6})
    assert changed.status_code == 200 and changed.json()["budget_usd"] == 1e-6 and changed.json()["name"] == "budgeted"
    chat = lambda: httpx.post(console_gateway.base_url + "/chat/completions", json=body,  # noqa: E731
                              headers={"Authorization": f"Bearer {key['key']}"})
    refused = chat()
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "insufficient_quota"
    unlimited = api.patch(f"/api/keys/{key['id']}", json={"budget_usd": None, "rpm_limit": 50})
    assert unlimited.json()["budget_usd"] is None and unlimited.json()["rpm_limit"] == 50
    assert chat().status_code == 200
    assert api.patch(f"/api/keys/{key['id']}", json={"name": None}).status_code == 400
    assert api.patch(f"/api/keys/{key['id']}", json={"budget_usd": -1}).json()["error"]["param"] == "budget_usd"
    assert api.patch("/api/keys/999999", json={"rpm_limit": 5}).status_code == 404


@pytest.mark.parametrize("body,param", [({"name": ""}, "name"), ({"name": "x", "budget_usd": -1}, "budget_usd"),
                                        ({"name": "x", "rpm_limit": 0}, "rpm_limit"), ({"name": "x", "foo": 1}, "foo")])
def test_keys_invalid_bodies_name_the_field(api, body, param):
    response = api.post("/api/keys", json=body)
    assert response.status_code == 400 and response.json()["error"]["param"] == param


def test_keys_need_the_master_key(console_gateway, api):
    plaintext = api.post("/api/keys", json={"name": "not-admin"}).json()["key"]
    response = httpx.get(console_gateway.url + "/api/keys", headers={"Authorization": f"Bearer {plaintext}"})
    assert response.status_code == 403


def test_route_explains_without_calling_a_model(api):
    body = {"model": "from-config", "messages": [{"role": "user", "content": "hi"}]}
    result = api.post("/api/route", json=body).json()
    assert result == {"policy": "from-config", "type": "fallback", "models": ["m1", "m2"],
                      "decision": {"type": "fallback"}, "executed": False}
    assert api.post("/api/route", json={**body, "model": "nope"}).status_code == 404
    bad = api.post("/api/route", json={"model": "m1", "messages": "x"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "messages"


def test_route_gives_the_routers_scores_and_costs(api):
    body = {"model": "routed", "messages": [{"role": "user", "content": "a plain question"}]}
    decision = api.post("/api/route", json=body).json()["decision"]
    # router_fakes' PLAIN row and COSTS: at lambda 20, small's 0.6 - 0.02 beats big's 0.7 - 0.2
    assert decision["scores"] == {"small": 0.6, "big": 0.7} and decision["chosen"] == "small"
    assert decision["expected_cost_usd"] == {"small": 0.001, "big": 0.01}


def test_traffic_totals_match_the_requests(api, console_gateway):
    key = api.post("/api/keys", json={"name": "traffic-api"}).json()
    start = datetime.now(timezone.utc)
    usages = []
    for i in range(5):
        model = "m1" if i % 2 else "m2"
        response = httpx.post(console_gateway.base_url + "/chat/completions",
                              headers={"Authorization": f"Bearer {key['key']}"},
                              json={"model": model, "messages": [{"role": "user", "content": "word " * (i + 1)}]})
        usages.append((model, response.json()["usage"]))
    console_gateway.flush_log()
    stats = api.get("/api/traffic", params={"api_key_id": key["id"], "since": (start - timedelta(minutes=1)).isoformat(),
                                            "buckets": 6}).json()
    totals = stats["totals"]
    assert totals["requests"] == 5 and totals["errors"] == 0
    assert totals["prompt_tokens"] == sum(u["prompt_tokens"] for _, u in usages)
    assert totals["completion_tokens"] == sum(u["completion_tokens"] for _, u in usages)
    assert math.isclose(totals["cost_usd"], sum(mock_cost(u["prompt_tokens"], u["completion_tokens"]) for _, u in usages))
    assert stats["by_model"]["m1"]["requests"] == 2 and stats["by_model"]["m2"]["requests"] == 3
    assert sum(b["requests"] for b in stats["series"]) == 5 and len(stats["series"]) == 6
    assert api.get("/api/traffic", params={"buckets": 0}).status_code == 400
    assert api.get("/api/traffic", params={"since": "2030-01-01T00:00:00Z", "until": "2029-01-01T00:00:00Z"}).status_code == 400


def test_models_registry(api):
    models = {m["name"]: m for m in api.get("/api/models").json()["data"]}
    assert set(models) == {"m1", "m2", "small", "big", "down", LOCAL_MODEL}
    assert models["down"]["status"] == "error" and models["down"]["deployments"][0]["healthy"] is False
    assert models["down"]["errors"][0].startswith("down#0 is out of rotation") and models["m1"]["errors"] == []
    assert models["m1"]["status"] == "healthy" and models["m1"]["input_cost_per_million"] == 1000.0
    assert models["m1"]["deployments"][0]["deployment_id"] == "m1#0" and models["m1"]["engine"] is None
    assert models[LOCAL_MODEL]["kind"] == "local" and models[LOCAL_MODEL]["context_length"] > 0


def test_evals_runs_and_reports(api, console_gateway, tmp_path):
    from evals.cache import EvalStore

    store = EvalStore(console_gateway.state.settings.database_url)
    try:
        store.save_run({"id": "api-run", "suite": "gsm8k", "targets": ["m1"], "status": "finished",
                        "totals": {"m1": {"n": 3, "score": 0.5}}})
        report_id = store.save_report(title="api report", run_ids=["api-run"], markdown="# r", data={"summaries": []},
                                      png=b"\x89PNG\r\n\x1a\nfake")
        bare_id = store.save_report(title="no plot", run_ids=[], markdown="", data={})
    finally:
        store.close()
    assert api.get("/api/evals/runs/api-run").json()["totals"] == {"m1": {"n": 3, "score": 0.5}}
    assert "api-run" in [r["id"] for r in api.get("/api/evals/runs").json()]
    listed = {r["id"]: r for r in api.get("/api/evals/reports").json()}
    assert listed[report_id]["has_plot"] is True and listed[bare_id]["has_plot"] is False
    report = api.get(f"/api/evals/reports/{report_id}").json()
    assert report["plot_url"] == f"/api/evals/reports/{report_id}/plot.png" and report["markdown"] == "# r"
    plot = api.get(report["plot_url"])
    assert plot.headers["content-type"] == "image/png" and plot.content == b"\x89PNG\r\n\x1a\nfake"
    assert api.get(f"/api/evals/reports/{bare_id}/plot.png").status_code == 404
    assert api.get("/api/evals/runs/nope").status_code == 404


def test_openapi_documents_the_console_endpoints(api):
    paths = api.get("/openapi.json").json()["paths"]
    for path in ("/api/keys", "/api/keys/{key_id}", "/api/route", "/api/traffic", "/api/models", "/api/evals/runs",
                 "/api/evals/reports/{report_id}/plot.png", "/api/policies", "/api/requests"):
        assert path in paths, path
    assert not any(p.startswith("/console") for p in paths)
    create = paths["/api/keys"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert set(create["properties"]) == {"name", "budget_usd", "rpm_limit", "tpm_limit", "capture_traces"}
    assert create["required"] == ["name"] and create["properties"]["rpm_limit"]["anyOf"][0]["maximum"] == 2**31 - 1
    assert "budget_usd" in paths["/api/keys/{key_id}"]["patch"]["requestBody"]["content"]["application/json"]["schema"]["properties"]


@pytest.mark.parametrize("raw,param", [
    (b'{"name": "x", "budget_usd": 1e309}', "budget_usd"),          # json.loads reads inf: refused
    (b'{"name": "x", "budget_usd": NaN}', "budget_usd"),
    (b'{"name": "x", "budget_usd": 1e10}', "budget_usd"),           # finite but beyond MAX_BUDGET_USD
    (b'{"name": "x", "rpm_limit": 10000000000000000000000000000000000000000}', "rpm_limit"),
    (b'{"name": "x", "tpm_limit": 2147483648}', "tpm_limit")])
def test_key_numbers_out_of_range_name_the_field(api, raw, param):
    response = api.post("/api/keys", content=raw, headers={"Content-Type": "application/json"})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param and response.json()["error"]["type"] == "invalid_request_error"


def test_key_budget_update_out_of_range_names_the_field(api):
    key = api.post("/api/keys", json={"name": "patch-range"}).json()
    response = api.patch(f"/api/keys/{key['id']}", content=b'{"budget_usd": Infinity}',
                         headers={"Content-Type": "application/json"})
    assert response.status_code == 400 and response.json()["error"]["param"] == "budget_usd"
    assert api.get(f"/api/keys/{2**64}").status_code == 400  # beyond any id: refused, not a database overflow


@pytest.mark.parametrize("params,param", [({"offset": "99999999999999999999"}, "offset"),
                                          ({"api_key_id": "99999999999999999999"}, "api_key_id")])
def test_request_log_bounds_its_query(api, params, param):
    response = api.get("/api/requests", params=params)
    assert response.status_code == 400 and response.json()["error"]["param"] == param, response.text
    assert api.get("/api/requests", params={"offset": 2**31 - 1}).json() == []
    assert api.get("/api/traffic", params={"api_key_id": "99999999999999999999"}).status_code == 400


@pytest.mark.parametrize("options,param,message", [
    ({"layers": 1e308}, "options.layers", "options.layers must be a whole number in [1, 4], got 1e+308"),
    ({"layers": 10**30}, "options.layers", f"options.layers must be a whole number in [1, 4], got {10**30}"),
    ({"layers": 5}, "options.layers", "options.layers must be a whole number in [1, 4], got 5"),
    ({"layers": True}, "options.layers", "options.layers must be a whole number in [1, 4], got True"),
    ({"deadline_s": 0}, "options.deadline_s", "options.deadline_s must be a number in (0, 3600], got 0"),
    ({"temperatures": [0.5, 3]}, "options.temperatures[1]", "options.temperatures[1] must be a number in [0, 2], got 3"),
    ({"proposers": [{"model": "m1", "temp": 1}]}, "options.proposers[0].temp",
     "unknown field 'temp' of options.proposers[0]; its fields: model, temperature"),
    ({"min_proposals": 3}, "options.min_proposals", "options.min_proposals must be a whole number in [1, 2], got 3"),
    ({"colour": 1}, "options.colour", "unknown option 'colour' of a 'moa' policy; its options: aggregator, temperatures, "
     "proposers, layers, deadline_s, proposer_max_tokens, min_proposals, capture_traces, cache")])
def test_moa_options_are_checked_strictly(api, options, param, message):
    body = {"name": "strict-moa", "type": "moa", "models": ["m1", "m2"], "options": options}
    response = api.post("/api/policies", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param and response.json()["error"]["message"] == message
    assert api.get("/v1/models").status_code == 200


def test_policy_options_refuse_nan_in_the_body(api):
    raw = b'{"name": "nan-moa", "type": "moa", "models": ["m1"], "options": {"deadline_s": NaN}}'
    response = api.post("/api/policies", content=raw, headers={"Content-Type": "application/json"})
    assert response.status_code == 400 and response.json()["error"]["param"] == "options.deadline_s"
    assert api.get("/api/policies/nan-moa").status_code == 404


def test_a_bad_stored_policy_breaks_no_page(api, admin, console_gateway):
    """Rows stored before options were checked (an absurd `layers`, a NaN) are logged and left out of /v1/models,
    listed as not served by /api/policies and the console, and can still be deleted."""
    from sqlmodel import Session

    from link.db.models import PolicyRow

    bad = {"old-huge-moa": {"layers": 1e308}, "old-nan-moa": {"aggregator": "m1", "deadline_s": float("nan")}}
    with Session(console_gateway.state.db) as session:
        session.add_all([PolicyRow(name=name, type="moa", models=["m1", "m2"], options=options) for name, options in bad.items()])
        session.commit()
    try:
        console_gateway.state.policies.reload()
        assert set(console_gateway.state.policies.invalid) >= set(bad)
        models = api.get("/v1/models")
        assert models.status_code == 200 and not set(bad) & {m["id"] for m in models.json()["data"]}
        listed = api.get("/api/policies")
        assert listed.status_code == 200
        rows = {p["name"]: p for p in listed.json()["data"]}
        assert rows["old-huge-moa"]["invalid"].startswith("options.layers must be a whole number in [1, 4]")
        assert rows["old-nan-moa"]["options"]["deadline_s"] == "NaN" and "options.deadline_s" in rows["old-nan-moa"]["invalid"]
        assert "invalid" not in rows["from-config"]
        for path in ("/console/policies", "/console/traffic", "/console/policies/new", "/console/policies/try",
                     "/console/policies/edit?name=old-nan-moa"):
            assert admin.get(path).status_code == 200, path
        assert admin.get("/console/policies").text.count(">not served</span>") == 2
    finally:
        for name in bad:
            assert api.delete(f"/api/policies/{name}").status_code == 204
