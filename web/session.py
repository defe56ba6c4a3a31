"""The console's session: who is logged in, the CSRF token, and the bridge that lets a session call the API.

An admin logs in with the master key (`LINK_MASTER_KEY`); the session lives in a signed cookie (Starlette's
`SessionMiddleware`, itsdangerous): HttpOnly, SameSite=Lax, Secure in production (served over https), valid
for `SESSION_MAX_AGE_S`. Its signing secret is derived from the master key, so every gateway replica sharing
the key accepts the cookie and changing the key logs every session out.

`SessionBearer` makes a session a client of the same `/api/...` and `/v1/...` endpoints that scripts use:
a request there without an `Authorization` header but with an admin session is let through as the master
key, after its CSRF token (header `X-CSRF-Token`) is checked on every method that changes state.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets

from starlette.types import ASGIApp, Receive, Scope, Send

SESSION_COOKIE = "link_console"
SESSION_MAX_AGE_S = 12 * 3600
CSRF_HEADER = "x-csrf-token"
CSRF_FIELD = "csrf_token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
API_PREFIXES = ("/api/", "/v1/", "/metrics")


def session_secret(master_key: str | None) -> str:
    """The cookie signing secret: HMAC-SHA256 of a fixed label under the master key (random without one,
    when nobody can log in anyway)."""
    if not master_key:
        return secrets.token_hex(32)
    return hmac.new(master_key.encode(), b"togetherlink console session v1", hashlib.sha256).hexdigest()


def csrf_token(session: dict) -> str:
    """The session's CSRF token, created on first use (also before login: the login form carries one)."""
    if "csrf" not in session:
        session["csrf"] = secrets.token_urlsafe(32)
    return session["csrf"]


def is_valid_csrf(session: dict, sent: str | None) -> bool:
    """Constant-time check of a form field or header against the session's token; False when either is missing."""
    expected = session.get("csrf")
    return bool(expected and sent) and hmac.compare_digest(expected.encode(), sent.encode())


def is_admin(session: dict) -> bool:
    return session.get("admin") is True


class SessionBearer:
    """ASGI middleware (inside `SessionMiddleware`): an admin session calling `/api`, `/v1` or `/metrics`
    without an Authorization header gets `Authorization: Bearer <master key>`; a state-changing method
    must carry the session's CSRF token in `X-CSRF-Token`, else it is refused with 403 (OpenAI error object).

    Args:
        app: the wrapped application. master_key: the admin key (None: sessions never authorize anything).
    """

    def __init__(self, app: ASGIApp, master_key: str | None):
        self.app, self.master_key = app, master_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.master_key or not scope["path"].startswith(API_PREFIXES):
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        session = scope.get("session") or {}
        if b"authorization" in headers or not is_admin(session):
            return await self.app(scope, receive, send)
        if scope["method"] not in SAFE_METHODS:
            sent = headers.get(CSRF_HEADER.encode(), b"").decode("latin-1")
            if not is_valid_csrf(session, sent):
                return await _refuse(send, "The console session's CSRF token is missing or wrong (header X-CSRF-Token).")
        scope = dict(scope, headers=[*scope["headers"], (b"authorization", f"Bearer {self.master_key}".encode())])
        await self.app(scope, receive, send)


async def _refuse(send: Send, message: str) -> None:
    body = json.dumps({"error": {"message": message, "type": "permission_error", "param": None,
                                 "code": "csrf_failed"}}).encode()
    await send({"type": "http.response.start", "status": 403,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
