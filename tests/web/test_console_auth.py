"""The console's session and CSRF rules, over HTTP: pages need an admin session, forms need the session's
CSRF token, the session reaches the API only with it, and text from requests is escaped."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.link.gateway_launch import MASTER_KEY
from tests.web.conftest import csrf_from

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
