"""The console's session: who is logged in, the CSRF token, and the bridge that lets a session call the API.

An admin logs in with the master key (`LINK_MASTER_KEY`); the session lives in a signed cookie (Starlette's
`SessionMiddleware`, itsdangerous): HttpOnly, SameSite=Lax, Secure in production (served over https). Its
signing secret is derived from the master key, so every gateway replica sharing the key accepts the cookie and
changing the key logs every session out.

The cookie carries a random session id (`sid`) whose sha256 keys a `console_session` row (link/db/models.py):
the session is live while that row is neither revoked (logging out revokes it, so a copy of the cookie taken
before stops working at once) nor past its `expires_at`, `SESSION_MAX_AGE_S` after the login, which using the
session does not extend. The row also holds a one-time flash for the next page (`push_flash`, `pop_flash`).

`SessionBearer` makes a session a client of the same `/api/...` and `/v1/...` endpoints that scripts use:
a request there without an `Authorization` header but with an admin session is let through as the master
key, after its CSRF token (header `X-CSRF-Token`) is checked on every method that changes state.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import secrets
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import Engine, delete
from sqlmodel import Session
from starlette.middleware.sessions import SessionMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from link.db.models import ConsoleSession, utcnow

SESSION_COOKIE = "link_console"
SESSION_MAX_AGE_S = 12 * 3600  # a login's absolute lifetime (the row's expires_at; the cookie's max-age too)
SESSION_ID = "sid"
LAST_SEEN_EVERY_S = 60  # last_seen_at is written at most this often (not on every request)
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


def _row_id(sid: str) -> str:
    return hashlib.sha256(sid.encode()).hexdigest()


def open_session(engine: Engine) -> str:
    """Store a new console session (live for SESSION_MAX_AGE_S) and return its random id, for the cookie. Rows that
    ended over a day ago are deleted on the way."""
    sid, now = secrets.token_urlsafe(32), utcnow()
    with Session(engine) as db:
        db.exec(delete(ConsoleSession).where(ConsoleSession.expires_at < now - timedelta(days=1)))
        db.add(ConsoleSession(id=_row_id(sid), created_at=now, last_seen_at=now,
                              expires_at=now + timedelta(seconds=SESSION_MAX_AGE_S)))
        db.commit()
    return sid


def _live_row(db: Session, sid: Any) -> ConsoleSession | None:
    if not isinstance(sid, str) or not sid:
        return None
    row = db.get(ConsoleSession, _row_id(sid))
    now = utcnow()
    if row is None or row.revoked_at is not None or _aware(row.expires_at) <= now:
        return None
    return row


def _aware(value: datetime) -> datetime:
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value  # SQLite hands back naive UTC


def is_live(engine: Engine, sid: Any) -> bool:
    """True while the session `sid` is neither revoked nor expired (notes when it was last seen)."""
    with Session(engine) as db:
        row = _live_row(db, sid)
        if row is None:
            return False
        now = utcnow()
        if (now - _aware(row.last_seen_at)).total_seconds() >= LAST_SEEN_EVERY_S:
            row.last_seen_at = now
            db.add(row)
            db.commit()
        return True


def revoke_session(engine: Engine, sid: Any) -> None:
    """End the session `sid` for good (logout); its pending flash goes with it."""
    with Session(engine) as db:
        row = _live_row(db, sid)
        if row is not None:
            row.revoked_at, row.flash = utcnow(), None
            db.add(row)
            db.commit()


def push_flash(engine: Engine, sid: Any, flash: dict[str, Any]) -> None:
    """Keep `flash` for the session's next page (Post/Redirect/Get: a created key's plaintext, shown once)."""
    with Session(engine) as db:
        row = _live_row(db, sid)
        if row is not None:
            row.flash = flash
            db.add(row)
            db.commit()


def pop_flash(engine: Engine, sid: Any) -> dict[str, Any] | None:
    """The session's pending flash, removed as it is read (a reload shows nothing)."""
    with Session(engine) as db:
        row = _live_row(db, sid)
        if row is None or row.flash is None:
            return None
        flash, row.flash = row.flash, None
        db.add(row)
        db.commit()
        return flash


async def is_admin(session: dict, engine: Engine) -> bool:
    """True when the cookie's session is a live admin login (a database read, in a worker thread)."""
    sid = session.get(SESSION_ID)
    return isinstance(sid, str) and await asyncio.to_thread(is_live, engine, sid)


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
        if b"authorization" in headers or SESSION_ID not in session:
            return await self.app(scope, receive, send)
        if not await is_admin(session, scope["app"].state.gateway.db):
            return await self.app(scope, receive, send)  # a revoked or expired session: no key, as without one
        if scope["method"] not in SAFE_METHODS:
            sent = headers.get(CSRF_HEADER.encode(), b"").decode("latin-1")
            if not is_valid_csrf(session, sent):
                return await _refuse(send, "The console session's CSRF token is missing or wrong (header X-CSRF-Token).")
        scope = dict(scope, headers=[*scope["headers"], (b"authorization", f"Bearer {self.master_key}".encode())])
        await self.app(scope, receive, send)


class APISessions(SessionMiddleware):
    """Starlette's `SessionMiddleware`, stepped over for an API request (`/api`, `/v1`, `/metrics`) that carries no
    cookie: such a request has no session to load and API routes never start one, and the step saves the cookie
    parsing and the send wrapper that every chunk of a stream would pass through. Same arguments."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(API_PREFIXES) and not any(
                name == b"cookie" for name, _ in scope["headers"]):
            scope["session"] = {}
            return await self.app(scope, receive, send)
        await super().__call__(scope, receive, send)


async def _refuse(send: Send, message: str) -> None:
    body = json.dumps({"error": {"message": message, "type": "permission_error", "param": None,
                                 "code": "csrf_failed"}}).encode()
    await send({"type": "http.response.start", "status": 403,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
