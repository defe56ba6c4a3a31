"""Names that look like paths address their own objects: a policy named "../keys/<id>" (or holding "?", "#",
"%2F", or just "..") is edited and deleted through the console's forms, in Chromium too (skipped without it, as in
tests/web/test_browser.py), without touching key <id>, whose route it would resolve to if its name were put into
the API path unquoted (clients resolve "..": RFC 3986 section 5.2.4); the other pages that put an id from the URL
into an API path (eval reports and runs, request-log rows) look up exactly that id; and the API itself, reached
with a raw, unresolved "..", does not resolve it.
"""

from __future__ import annotations

import http.client

import httpx
import pytest

from tests.link.gateway_launch import MASTER_KEY
from tests.web.conftest import browser_login, csrf_from
from web.pages.base import path_segment

AUTH = {"Authorization": f"Bearer {MASTER_KEY}"}
# "{key}" is the id of a live key, created per test
TRICKY_NAMES = ["../keys/{key}", "../../api/keys/{key}", "../keys/{key}?x=1#top", "team/../keys/{key}", "p%2Fq",
                "what?now", "a#b", "..", "team/a"]


@pytest.fixture
def api(console_gateway):
    with httpx.Client(base_url=console_gateway.url, headers=AUTH, timeout=30) as client:
        yield client


@pytest.fixture
def live_key(api) -> int:
    created = api.post("/api/keys", json={"name": "must-survive"})
    assert created.status_code == 201, created.text
    yield created.json()["id"]
    api.delete(f"/api/keys/{created.json()['id']}")


@pytest.fixture
def create_policy(api):
    """create_policy(name): a fallback policy over m1, m2 through the API, deleted after the test if still there."""
    names = []

    def create(name: str) -> None:
        created = api.post("/api/policies", json={"name": name, "type": "fallback", "models": ["m1", "m2"]})
        assert created.status_code == 201, created.text
        assert created.json()["name"] == name
        names.append(name)

    yield create
    for name in names:
        api.delete(f"/api/policies/{path_segment(name)}")


def _policy_names(api) -> set[str]:
    return {p["name"] for p in api.get("/api/policies").json()["data"]}


def _is_live(api, key_id: int) -> bool:
    return api.get(f"/api/keys/{key_id}").json()["revoked_at"] is None


@pytest.mark.parametrize("template", TRICKY_NAMES)
def test_the_console_deletes_the_policy_of_that_name_and_nothing_else(admin, api, live_key, create_policy, template):
    name = template.format(key=live_key)
    create_policy(name)
    page = admin.get("/console/policies").text
    assert f'<input type="hidden" name="name" value="{name}">' in page  # the delete form of its row

    response = admin.post("/console/policies/delete", data={"name": name, "csrf_token": csrf_from(page)})
    assert api.get(f"/api/keys/{live_key}").json()["revoked_at"] is None  # the key survives
    assert name not in _policy_names(api)  # and the policy is gone
    assert response.status_code == 303


@pytest.mark.browser
def test_chromium_deletes_the_policy_named_like_the_keys_route(page, api, live_key, create_policy):
    name = f"../keys/{live_key}"
    create_policy(name)
    browser_login(page)
    page.goto("/console/policies")
    page.locator(f"tr[data-policy='{name}']").locator("button:has-text('Delete')").click()
    page.wait_for_load_state()
    assert page.locator(f"tr[data-policy='{name}']").count() == 0
    assert name not in _policy_names(api) and _is_live(api, live_key)


@pytest.mark.parametrize("template", TRICKY_NAMES)
def test_the_console_edits_the_policy_of_that_name(admin, api, live_key, create_policy, template):
    name = template.format(key=live_key)
    create_policy(name)
    form = admin.get("/console/policies/edit", params={"name": name})
    assert form.status_code == 200, form.text
    assert 'value="m1, m2"' in form.text  # the form shows this policy's models
    saved = admin.post("/console/policies/edit", data={"original": name, "name": name, "type": "fallback",
                                                       "models": "m2, m1", "options": "", "csrf_token": csrf_from(form.text)})
    assert saved.status_code == 303, saved.text
    assert api.get(f"/api/policies/{path_segment(name)}").json()["models"] == ["m2", "m1"]
    assert _is_live(api, live_key)


def test_a_session_calling_the_api_with_a_quoted_name_reaches_that_policy(admin, api, live_key, create_policy):
    """The browser's path into the API (the session bridge, web/session.py) with the name quoted as one segment."""
    name = f"../keys/{live_key}"
    create_policy(name)
    token = csrf_from(admin.get("/console/policies").text)
    deleted = admin.delete(f"/api/policies/{path_segment(name)}", headers={"X-CSRF-Token": token})
    assert deleted.status_code == 204, deleted.text
    assert name not in _policy_names(api) and _is_live(api, live_key)


def test_the_api_does_not_resolve_dot_segments(console_gateway, api, live_key, create_policy):
    """A client that sends ".." unresolved (curl --path-as-is; http.client never resolves) reaches the policy route
    with the name as written: the server routes the path it is given and never climbs to /api/keys."""
    name = f"../keys/{live_key}"
    create_policy(name)
    connection = http.client.HTTPConnection("127.0.0.1", console_gateway.port, timeout=30)
    try:
        connection.request("DELETE", f"/api/policies/{name}", headers=AUTH)
        assert connection.getresponse().status == 204
    finally:
        connection.close()
    assert name not in _policy_names(api) and _is_live(api, live_key)


@pytest.mark.parametrize("path,message", [
    # a run id holding "/" is no run id: the API answers for the runs route, it does not climb to /api/keys
    ("/console/evals/compare?a=../../keys&b=../../keys", "Invalid URL (GET /api/evals/runs/../../keys)"),
    ("/console/evals/compare?a=..&b=..", "no eval run '..'"),
    ("/console/evals/reports/%2E%2E", "no eval report '..'"),
    ("/console/requests/%2E%2E", "no request '..' in the log"),
])
def test_pages_look_up_the_id_they_were_given(admin, path, message):
    response = admin.get(path)
    assert response.status_code == 404, response.text
    assert message in response.text.replace("&#39;", "'")


@pytest.mark.parametrize("value,segment", [
    ("../keys/9", "..%2Fkeys%2F9"), ("..", "%2E%2E"), (".", "%2E"), ("a.b", "a.b"), ("what?now#x", "what%3Fnow%23x"),
    ("p%2Fq", "p%252Fq"), ("link/auto", "link%2Fauto"), (9, "9"), ("路由", "%E8%B7%AF%E7%94%B1"),
])
def test_path_segment(value, segment):
    assert path_segment(value) == segment
