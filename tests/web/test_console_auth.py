"""The console's session and CSRF rules, over HTTP: pages need an admin session, forms need the session's
CSRF token, the session reaches the API only with it, and text from requests is escaped."""

from __future__ import annotations

import re
import time
from datetime import datetime, timedelta, timezone

import httpx
import pytest

from tests.link.gateway_launch import MASTER_KEY
from tests.web.conftest import csrf_from, login
from web.session import SESSION_MAX_AGE_S

AUTH = {"Authorization": f"Bearer {MASTER_KEY}"}
PAGES = ["/console/traffic", "/console/policies", "/console/policies/new", "/console/policies/try",
         "/console/models", "/console/evals", "/console/keys", "/console/requests/abc"]


@pytest.mark.parametrize("path", PAGES)
def test_pages_redirect_to_login_without_a_session(console_gateway, path):
    response = httpx.get(console_gateway.url + path + "?x=1")
    assert response.status_code == 303
    assert response.headers["location"] == f"/console/login?next={path}%3Fx%3D1"


def test_login_sets_a_secure_session_cookie_and_returns_to_the_page(console_gateway):
    with httpx.Client(base_url=console_gateway.url) as client:
        token = csrf_from(client.get("/console/login").text)
        response = client.post("/console/login", data={"key": MASTER_KEY, "csrf_token": token,
                                                       "next": "/console/keys"})
        assert response.status_code == 303 and response.headers["location"] == "/console/keys"
        cookie = response.headers["set-cookie"].lower()
        assert cookie.startswith("link_console=") and "httponly" in cookie and "samesite=lax" in cookie
        assert "secure" not in cookie  # development over http; production: test_production_cookie_is_secure
        assert client.get("/console/keys").status_code == 200
        # a new CSRF token after login; logging out ends the session
        token = csrf_from(client.get("/console/keys").text)
        assert client.post("/console/logout", data={"csrf_token": token}).status_code == 303
        assert client.get("/console/keys").status_code == 303


def test_login_refuses_a_wrong_key_and_an_absolute_next(console_gateway):
    with httpx.Client(base_url=console_gateway.url) as client:
        token = csrf_from(client.get("/console/login").text)
        wrong = client.post("/console/login", data={"key": MASTER_KEY + "x", "csrf_token": token})
        assert wrong.status_code == 401 and "not the master key" in wrong.text
        assert client.get("/console/keys").status_code == 303
        response = client.post("/console/login", data={"key": MASTER_KEY, "csrf_token": token,
                                                       "next": "//evil.example/console/x"})
        assert response.headers["location"] == "/console/traffic"


def test_login_form_without_csrf_token_is_refused(console_gateway):
    with httpx.Client(base_url=console_gateway.url) as client:
        assert client.post("/console/login", data={"key": MASTER_KEY}).status_code == 403
        assert client.get("/console/keys").status_code == 303  # not logged in


def test_forged_form_post_is_refused(admin):
    """A cross-site form carries the session cookie but not the page's token: nothing happens."""
    for token in (None, "forged-token"):
        data = {"name": "forged", "type": "fixed", "models": "m1", "options": ""}
        if token:
            data["csrf_token"] = token
        response = admin.post("/console/policies/new", data=data)
        assert response.status_code == 403 and "CSRF" in response.text
    assert admin.get("/api/policies/forged").status_code == 404
    token = csrf_from(admin.get("/console/policies").text)
    assert admin.post("/console/policies/new", data={**data, "csrf_token": token}).status_code == 303
    assert admin.get("/api/policies/forged").json()["models"] == ["m1"]
    assert admin.post("/console/policies/delete", data={"name": "forged", "csrf_token": token}).status_code == 303


def test_session_calls_the_api_with_the_csrf_header_only(admin, console_gateway):
    body = {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}
    assert admin.get("/api/keys").status_code == 200  # reads need no token
    refused = admin.post("/api/route", json=body)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "csrf_failed"
    token = csrf_from(admin.get("/console/traffic").text)
    assert admin.post("/api/route", json=body, headers={"X-CSRF-Token": token}).status_code == 200
    # without a session the API is as before: the bearer key decides
    assert httpx.get(console_gateway.url + "/api/keys").status_code == 401
    assert httpx.post(console_gateway.url + "/api/route", json=body, headers=AUTH).status_code == 200


def test_request_text_is_escaped(admin, console_gateway):
    """A user and metadata holding a <script> tag show as text on the request's page."""
    evil = "<script>alert('x')</script>"
    response = httpx.post(console_gateway.base_url + "/chat/completions", headers=AUTH,
                          json={"model": "m1", "user": evil, "metadata": {"note": evil},
                                "messages": [{"role": "user", "content": evil}]})
    request_id = response.headers["x-link-request-id"]
    deadline = time.monotonic() + 10
    while (page := admin.get(f"/console/requests/{request_id}")).status_code != 200 and time.monotonic() < deadline:
        console_gateway.flush_log()
    assert page.status_code == 200
    assert evil not in page.text and "&lt;script&gt;alert(" in page.text
    assert "\\u003c" not in page.text  # the JSON blocks are escaped text, not `tojson` output
    assert '&#34;note&#34;: &#34;&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&#34;' in page.text


def test_production_cookie_is_secure(tmp_path):
    """In production the session cookie is Secure (sent over https only)."""
    from fastapi.testclient import TestClient

    from link.app import create_app
    from link.config import parse_config
    from tests.link.gateway_launch import gateway_settings, mock_deployment
    from tests.link.mock_launch import refused_url

    settings = gateway_settings(f"sqlite:///{tmp_path / 'link.db'}", tmp_path, environment="production")
    app = create_app(settings, parse_config({"models": [mock_deployment("m1", refused_url())]}))
    with TestClient(app, base_url="https://testserver", follow_redirects=False) as client:
        token = csrf_from(client.get("/console/login").text)
        response = client.post("/console/login", data={"key": MASTER_KEY, "csrf_token": token})
        assert response.status_code == 303
        cookie = response.headers["set-cookie"].lower()
        assert "secure" in cookie and "httponly" in cookie


def test_traffic_range_errors_are_explained(admin):
    """A custom range that ends before it starts is explained on the page; a negative offset shows the first page."""
    response = admin.get("/console/traffic", params={"key": "7", "since": "2030-01-02T00:00", "until": "2030-01-01T00:00"})
    assert response.status_code == 400 and "start must be before its end" in response.text
    response = admin.get("/console/traffic", params={"since": "2030-01-01T00:00", "until": "2030-01-02T00:00", "offset": "-5"})
    assert response.status_code == 200  # a negative offset is clamped to the first page


def test_logout_revokes_a_copied_cookie(console_gateway):
    """A copy of the session cookie taken before logout is refused after it, for pages and for the API."""
    with httpx.Client(base_url=console_gateway.url) as client:
        assert login(client).status_code == 303
        copied = client.cookies["link_console"]
        assert client.get("/console/keys").status_code == 200
        token = csrf_from(client.get("/console/keys").text)
        assert client.post("/console/logout", data={"csrf_token": token}).status_code == 303
    with httpx.Client(base_url=console_gateway.url, cookies={"link_console": copied}) as thief:
        response = thief.get("/console/keys")
        assert response.status_code == 303 and response.headers["location"] == "/console/login?next=/console/keys"
        assert thief.get("/api/keys").status_code == 401  # the session no longer stands for the master key


def test_session_lifetime_is_absolute(console_gateway):
    """Using a session does not move its end; past `expires_at` it is over, whatever the cookie's own max-age."""
    from sqlmodel import Session, select

    from link.db.models import ConsoleSession

    db = console_gateway.state.db
    with httpx.Client(base_url=console_gateway.url) as client:
        with Session(db) as session:
            known = {row.id for row in session.exec(select(ConsoleSession))}
        assert login(client).status_code == 303
        with Session(db) as session:
            (row,) = [r for r in session.exec(select(ConsoleSession)) if r.id not in known]
            lifetime = row.expires_at - row.created_at
            first_end = row.expires_at
        assert lifetime.total_seconds() == SESSION_MAX_AGE_S
        for _ in range(3):
            assert client.get("/console/keys").status_code == 200
        with Session(db) as session:
            row = session.get(ConsoleSession, row.id)
            assert row.expires_at == first_end  # renewal of the cookie does not extend the session
            row.expires_at = datetime.now(timezone.utc) - timedelta(seconds=1)
            session.add(row)
            session.commit()
        assert client.get("/console/keys").status_code == 303


def test_creating_a_key_redirects_and_shows_it_once(admin, console_gateway):
    token = csrf_from(admin.get("/console/keys").text)
    created = admin.post("/console/keys", data={"name": "prg-key", "budget_usd": "2", "csrf_token": token})
    assert created.status_code == 303 and created.headers["location"] == "/console/keys"
    shown = admin.get("/console/keys")
    plaintext = re.search(r'<pre class="secret">(sk-link-[^<]+)</pre>', shown.text).group(1)
    again = admin.get("/console/keys")  # a reload: a GET, so nothing is created and the secret is gone
    assert plaintext not in again.text and 'id="created-key"' not in again.text
    keys = [k for k in admin.get("/api/keys").json() if k["name"] == "prg-key"]
    assert len(keys) == 1 and plaintext.startswith(keys[0]["key_prefix"]) and keys[0]["budget_usd"] == 2.0


@pytest.mark.parametrize("field,value,message", [
    ("budget_usd", "nan", "budget_usd must be a finite number, got &#39;nan&#39;"),
    ("budget_usd", "inf", "budget_usd must be a finite number, got &#39;inf&#39;"),
    ("budget_usd", "1e309", "budget_usd must be a finite number, got &#39;1e309&#39;"),
    ("budget_usd", "2e9", "budget_usd: Input should be less than or equal to 1000000000"),
    ("rpm_limit", str(10**40), "rpm_limit: Input should be less than or equal to 2147483647"),
    ("tpm_limit", "1.5", "tpm_limit must be a whole number")])
def test_key_form_numbers_give_field_errors(admin, field, value, message):
    token = csrf_from(admin.get("/console/keys").text)
    response = admin.post("/console/keys", data={"name": f"bad-{field}", field: value, "csrf_token": token})
    assert response.status_code == 400 and response.headers["content-type"].startswith("text/html")
    assert f'<p class="field-error" role="alert">{message}</p>' in response.text
    assert not [k for k in admin.get("/api/keys").json() if k["name"] == f"bad-{field}"]


@pytest.mark.parametrize("value", ["nan", "inf", "-1e309"])
def test_key_budget_form_refuses_non_finite_numbers(admin, value):
    key = admin.post("/api/keys", json={"name": "budget-form"}, headers=AUTH).json()
    token = csrf_from(admin.get("/console/keys").text)
    response = admin.post("/console/keys/budget", data={"key_id": key["id"], "budget_usd": value, "csrf_token": token})
    assert response.status_code == 400 and "must be a finite number" in response.text
    assert admin.get(f"/api/keys/{key['id']}").json()["budget_usd"] is None


def test_console_errors_are_pages_and_the_api_keeps_json(admin):
    missing = admin.get("/console/no-such-page")
    assert missing.status_code == 404 and missing.headers["content-type"].startswith("text/html")
    assert "<h1>Not found</h1>" in missing.text
    invalid = admin.get("/console/traffic", params={"offset": "99999999999999999999"})
    assert invalid.status_code == 400 and invalid.headers["content-type"].startswith("text/html")
    assert "offset: Input should be less than or equal to 2147483647" in invalid.text
    assert admin.get("/console/traffic", params={"offset": "abc"}).headers["content-type"].startswith("text/html")
    api_missing = admin.get("/api/no-such-thing", headers=AUTH)
    assert api_missing.status_code == 404 and api_missing.json()["error"]["message"] == "Invalid URL (GET /api/no-such-thing)"


def test_favicon_is_served_and_linked(admin):
    icon = admin.get("/console/static/favicon.svg")
    assert icon.status_code == 200 and icon.headers["content-type"].startswith("image/svg+xml")
    assert icon.text.startswith("<svg")
    assert '<link rel="icon" href="/console/static/favicon.svg" type="image/svg+xml">' in admin.get("/console/keys").text


def test_policy_names_with_control_characters_or_edge_spaces_are_refused(admin):
    token = csrf_from(admin.get("/console/policies/new").text)
    for name in ("line\nbreak", "tab\there", " leading", "trailing "):
        response = admin.post("/console/policies/new", data={"name": name, "type": "fallback", "models": "m1, m2",
                                                             "options": "", "csrf_token": token})
        assert response.status_code == 400 and 'id="name-error"' in response.text, name
        api = admin.post("/api/policies", json={"name": name, "type": "fallback", "models": ["m1", "m2"]}, headers=AUTH)
        assert api.status_code == 400 and api.json()["error"]["param"] == "name", name
