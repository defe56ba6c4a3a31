"""What every console page shares: the templates and `render`, the in-process API client, the CSRF check.

    @router.get("/models", response_class=HTMLResponse)
    async def models_page(request: Request, api: ApiDep) -> Response:
        return render(request, "models.html", section="models", models=await api.get_json("/api/models"))

`web/console.py` mounts the pages (each module of `web/pages/` has a `router`) and imports this module; the
pages import this module and never `web/console.py`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

import httpx
from fastapi import Depends, Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates

from web.formatting import caller_label, compact_json, format_usd, format_usd_input, pretty_json
from web.session import CSRF_FIELD, CSRF_HEADER, csrf_token, is_admin, is_valid_csrf

PREFIX = "/console"
templates = Jinja2Templates(directory=Path(__file__).parent.parent / "templates")  # autoescape is on for .html


def path_segment(value: str | int) -> str:
    """`value` as one URL path segment: percent-encoded with nothing kept ("/" -> %2F, "?" -> %3F, "#" -> %23,
    "%" -> %25), and a value of only dots ("." or "..") spelled with %2E, which clients otherwise resolve as
    "this folder" or "the parent folder" (RFC 3986 section 5.2.4) before the request leaves. So
    "/api/policies/" + path_segment("../keys/9") is "/api/policies/..%2Fkeys%2F9", which the server routes to
    the policy named "../keys/9" (it decodes the segment and does not resolve dots: link/routes/policies.py)."""
    quoted = quote(str(value), safe="")
    return quoted.replace(".", "%2E") if quoted in (".", "..") else quoted


templates.env.filters.update(usd=format_usd, usd_input=format_usd_input, caller=caller_label, pretty_json=pretty_json,
                             compact_json=compact_json, segment=path_segment)


class LoginRequired(Exception):
    """A page asked for without an admin session: answered with a redirect to the login page."""


class CsrfRefused(Exception):
    """A POST form without the session's CSRF token: answered with 403."""


class ConsoleApi:
    """The management API, called in-process as a script would call it over HTTP (with the master key).

    Args:
        request: the page's request (its app is the gateway). master_key: the admin key.
    """

    def __init__(self, request: Request, master_key: str):
        self.request = request
        self._client = httpx.AsyncClient(transport=httpx.ASGITransport(app=request.app), base_url="http://console",
                                         headers={"Authorization": f"Bearer {master_key}"}, timeout=60)

    async def call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One API call (`kwargs` as for httpx: json, params); the response whatever its status."""
        return await self._client.request(method, path, **kwargs)

    async def get_json(self, path: str, **params: Any) -> Any:
        """GET a JSON resource, None-valued query parameters left out. Raises httpx.HTTPStatusError on 4xx/5xx."""
        response = await self.call("GET", path, params={k: v for k, v in params.items() if v not in (None, "")})
        response.raise_for_status()
        return response.json()

    async def aclose(self) -> None:
        await self._client.aclose()


def db_engine(request: Request):
    """The gateway's database (console sessions live there)."""
    return request.app.state.gateway.db


async def console_api(request: Request):
    """The API client of an admin page; raises LoginRequired without a live admin session."""
    if not await is_admin(request.session, db_engine(request)):
        raise LoginRequired()
    api = ConsoleApi(request, request.app.state.gateway.settings.master_key.get_secret_value())
    try:
        yield api
    finally:
        await api.aclose()


ApiDep = Annotated[ConsoleApi, Depends(console_api)]


async def check_csrf(request: Request) -> None:
    """Every POST form (field `csrf_token`) or htmx request (header X-CSRF-Token) carries the session's token."""
    sent = request.headers.get(CSRF_HEADER)
    if sent is None:
        sent = (await request.form()).get(CSRF_FIELD)
    if not is_valid_csrf(request.session, sent if isinstance(sent, str) else None):
        raise CsrfRefused()


CsrfDep = Depends(check_csrf)


def render(request: Request, template: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    """A page with the shared context: the CSRF token, the active section, the console prefix."""
    return templates.TemplateResponse(request, template, {"csrf_token": csrf_token(request.session), "prefix": PREFIX,
                                                          **context}, status_code=status_code)


def api_error(response: httpx.Response) -> dict:
    """An API error response -> {"message", "param"} for the form (OpenAI error objects name the field)."""
    try:
        error = response.json()["error"]
        return {"message": error.get("message") or response.reason_phrase, "param": error.get("param")}
    except (ValueError, KeyError, TypeError):
        return {"message": f"{response.status_code} {response.reason_phrase}", "param": None}
