"""The console under `/console`: server-rendered pages (Jinja2, autoescaped) over the management API.

    mount_console(app, settings)      # link/app.py does this; the pages live in web/pages/

Every page reads and writes through the same `/api/...` endpoints scripts use (`ConsoleApi`: an in-process
HTTP client of the app carrying the master key), so nothing is possible only in the browser. A name or id
placed in an API path goes through `path_segment` (the `segment` filter in templates): a policy named
"../keys/9" must address that policy, never resolve to /api/keys/9; the browser's
own calls (the "try it" stream, the report plot) reach `/api` and `/v1` with the session cookie (see
web/session.py). Pages need a live admin session (else a redirect to the login page; logging out revokes the
session server-side); every POST form carries the session's CSRF token (else 403). Errors under /console
(an unknown page, an invalid parameter) are HTML pages; the API keeps its JSON errors.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

import httpx
from fastapi import APIRouter, Depends, FastAPI, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from starlette.middleware.sessions import SessionMiddleware

from link.keys import is_master_key
from link.settings import Settings
from web.formatting import caller_label, compact_json, format_usd, format_usd_input, pretty_json
from web.session import (CSRF_FIELD, CSRF_HEADER, SESSION_COOKIE, SESSION_ID, SESSION_MAX_AGE_S, SessionBearer,
                         csrf_token, is_admin, is_valid_csrf, open_session, revoke_session, session_secret)

HERE = Path(__file__).parent
PREFIX = "/console"
templates = Jinja2Templates(directory=HERE / "templates")  # autoescape is on for .html
router = APIRouter()  # the login pages; mount_console puts every console router under PREFIX


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


@router.get("/", response_class=HTMLResponse)
async def home(request: Request) -> Response:
    admin = await is_admin(request.session, db_engine(request))
    return RedirectResponse(f"{PREFIX}/traffic" if admin else f"{PREFIX}/login", status_code=303)


@router.get("/login", response_class=HTMLResponse)
async def login_page(request: Request, next: str = "") -> Response:
    settings: Settings = request.app.state.gateway.settings
    return render(request, "login.html", next=next, error=None if settings.master_key else
                  "The console needs a master key: start the gateway with LINK_MASTER_KEY set.")


def _safe_next(next_path: str) -> str:
    # Only a console path: never an absolute URL or "//host" (an open redirect).
    return next_path if next_path.startswith(PREFIX + "/") and not next_path.startswith("//") else f"{PREFIX}/traffic"


@router.post("/login", response_class=HTMLResponse, dependencies=[CsrfDep])
async def login(request: Request, key: Annotated[str, Form()] = "", next: Annotated[str, Form()] = "") -> Response:
    settings: Settings = request.app.state.gateway.settings
    if not is_master_key(key.strip(), settings.master_key):
        return render(request, "login.html", status_code=401, next=next, error="That is not the master key.")
    await asyncio.to_thread(revoke_session, db_engine(request), request.session.get(SESSION_ID))
    request.session.clear()  # a new session (and CSRF token) at each login
    request.session[SESSION_ID] = await asyncio.to_thread(open_session, db_engine(request))
    csrf_token(request.session)
    return RedirectResponse(_safe_next(next), status_code=303)


@router.post("/logout", dependencies=[CsrfDep])
async def logout(request: Request) -> Response:
    # revoked server-side: a copy of the cookie taken before no longer logs anyone in
    await asyncio.to_thread(revoke_session, db_engine(request), request.session.get(SESSION_ID))
    request.session.clear()
    return RedirectResponse(f"{PREFIX}/login", status_code=303)


TITLES = {400: "Invalid request", 404: "Not found", 405: "Not allowed"}


def _error_page(request: Request, status_code: int, message: str) -> HTMLResponse:
    """A console path's error as a page (link/app.py calls it for 404s and invalid parameters under /console)."""
    if status_code == 404:
        message = f"There is no console page at {request.url.path}."
    return render(request, "error.html", status_code=status_code, section="",
                  title=TITLES.get(status_code, f"Error {status_code}"), message=message)


def mount_console(app: FastAPI, settings: Settings) -> None:
    """Serve the console under /console on `app`: pages, static files, the session cookie and the
    session-to-API bridge (web/session.py). Called once by `create_app`, through the entry point `console` of
    the group `togetherlink.apps` (pyproject.toml)."""
    from web.pages import evals, keys, models, policies, traffic

    master_key = settings.master_key.get_secret_value() if settings.master_key else None
    app.add_middleware(SessionBearer, master_key=master_key)  # inner: reads the session the next one loads
    app.add_middleware(SessionMiddleware, secret_key=session_secret(master_key), session_cookie=SESSION_COOKIE,
                       max_age=SESSION_MAX_AGE_S, same_site="lax", https_only=settings.is_production, path="/")
    app.mount(f"{PREFIX}/static", StaticFiles(directory=HERE / "static"), name="console-static")
    console = APIRouter(prefix=PREFIX, include_in_schema=False)
    for module_router in (router, policies.router, models.router, traffic.router, evals.router, keys.router):
        console.include_router(module_router)
    app.include_router(console)
    app.add_api_route(PREFIX, home, methods=["GET"], include_in_schema=False)
    app.state.error_pages[PREFIX] = _error_page  # 404s and invalid parameters under /console: HTML, not JSON

    @app.exception_handler(LoginRequired)
    async def _login(request: Request, exc: LoginRequired):
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse(f"{PREFIX}/login?next={quote(target)}", status_code=303)

    @app.exception_handler(httpx.HTTPStatusError)
    async def _api_failed(request: Request, exc: httpx.HTTPStatusError):
        # A page's read through the API failed (e.g. a filter the API refuses): say why, with the API's status.
        return render(request, "error.html", status_code=exc.response.status_code, title="The API refused",
                      message=api_error(exc.response)["message"])

    @app.exception_handler(CsrfRefused)
    async def _csrf(request: Request, exc: CsrfRefused):
        return render(request, "error.html", status_code=403, title="Refused",
                      message="This form did not carry the session's CSRF token; reload the page and try again.")
