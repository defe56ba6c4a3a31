"""`/docs` (Swagger UI) and `/redoc` (ReDoc) served from package files, so they render without a network.

    app = FastAPI(title=..., docs_url=None, redoc_url=None)   # FastAPI's own pages load their scripts from a CDN
    mount_offline_docs(app)                                    # /docs, /redoc, /docs/oauth2-redirect, /docs-static/*

The scripts, stylesheet and favicon come from the `fastapi-offline` distribution (`fastapi_offline/static/`:
swagger-ui-bundle.js, swagger-ui.css, redoc.standalone.js, favicon.png); the pages are FastAPI's own
`get_swagger_ui_html` / `get_redoc_html` pointed at them (ReDoc without Google Fonts). Both servers mount it:
the gateway (link/app.py) and the engine server (serving/api/server.py).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

DOCS_URL, REDOC_URL, STATIC_URL = "/docs", "/redoc", "/docs-static"
# The pages may load nothing from another host: ReDoc's bundle builds in a "powered by" logo from its CDN, which
# a browser would fetch when online. (Both pages start their viewer from an inline script.)
CONTENT_SECURITY_POLICY = ("default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
                           "img-src 'self' data:; font-src 'self' data:; worker-src 'self' blob:; connect-src 'self'")


def _same_host_only(page: HTMLResponse) -> HTMLResponse:
    page.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    return page
OAUTH2_REDIRECT_URL = "/docs/oauth2-redirect"


def docs_static_dir() -> Path:
    """The folder of the Swagger UI and ReDoc files (`fastapi_offline/static`), found without importing the package.

    Raises:
        RuntimeError: `fastapi-offline` is not installed (it is a dependency: `pip install -e .`).
    """
    spec = importlib.util.find_spec("fastapi_offline")
    if spec is None or spec.origin is None:
        raise RuntimeError("the API docs' files come from the package fastapi-offline; install it with "
                           "`pip install fastapi-offline` (a dependency of togetherlink)")
    return Path(spec.origin).parent / "static"


def mount_offline_docs(app: FastAPI) -> None:
    """Add /docs, /redoc and their static files to `app` (made with `docs_url=None, redoc_url=None`).

    Raises:
        RuntimeError: see `docs_static_dir`; ValueError: `app` still serves FastAPI's CDN pages.
    """
    if app.docs_url is not None or app.redoc_url is not None:
        raise ValueError("create the app with docs_url=None and redoc_url=None: mount_offline_docs serves them")
    app.mount(STATIC_URL, StaticFiles(directory=docs_static_dir()), name="docs-static")

    @app.get(DOCS_URL, include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return _same_host_only(get_swagger_ui_html(openapi_url=root + app.openapi_url, title=f"{app.title} - Swagger UI",
                                   oauth2_redirect_url=root + OAUTH2_REDIRECT_URL,
                                   swagger_js_url=f"{root}{STATIC_URL}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{root}{STATIC_URL}/swagger-ui.css",
                                   swagger_favicon_url=f"{root}{STATIC_URL}/favicon.png",
                                   swagger_ui_parameters=app.swagger_ui_parameters))

    @app.get(OAUTH2_REDIRECT_URL, include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get(REDOC_URL, include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return _same_host_only(get_redoc_html(openapi_url=root + app.openapi_url, title=f"{app.title} - ReDoc",
                              redoc_js_url=f"{root}{STATIC_URL}/redoc.standalone.js",
                              redoc_favicon_url=f"{root}{STATIC_URL}/favicon.png", with_google_fonts=False))
