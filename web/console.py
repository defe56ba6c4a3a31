"""The console under `/console`: server-rendered pages (Jinja2, autoescaped) over the management API.

    mount_console(app, settings)      # link/app.py does this; the pages live in web/pages/

This module holds the login pages and mounts every page; what the pages share (`render`, the API client
`ConsoleApi` and its dependency, the CSRF check, `path_segment`) is `web/pages/base.py`.

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
from typing import Annotated
from urllib.parse import quote

import httpx
from fastapi import APIRouter, FastAPI, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from link.keys import is_master_key
from link.settings import Settings
from web.pages import evals, keys, models, policies, traffic
from web.pages.base import PREFIX, CsrfDep, CsrfRefused, LoginRequired, api_error, db_engine, render
from web.session import (SESSION_COOKIE, APISessions, SESSION_ID, SESSION_MAX_AGE_S, SessionBearer, csrf_token, is_admin,
                         open_session, revoke_session, session_secret)

HERE = Path(__file__).parent
router = APIRouter()  # the login pages; mount_console puts every console router under PREFIX


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
    master_key = settings.master_key.get_secret_value() if settings.master_key else None
    app.add_middleware(SessionBearer, master_key=master_key)  # inner: reads the session the next one loads
    app.add_middleware(APISessions, secret_key=session_secret(master_key), session_cookie=SESSION_COOKIE,
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
