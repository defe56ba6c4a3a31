"""Who is calling: `Authorization: Bearer <key>` checked against the master key and the stored API keys.

The master key (`LINK_MASTER_KEY`) always works and is the admin (management API). Stored keys
(`link keys create`) are checked by their sha256; a verified key is remembered for `ttl_s` seconds
(so a revocation takes effect within that time in every gateway). While the database does not answer, a key this
process verified in the last `stale_s` seconds keeps its identity (the gateway keeps serving keys without a budget
through a database restart); any other stored key is refused with a 503 that names the cause.

Open mode, for trying the gateway out: when `LINK_ENVIRONMENT=development` (the default), no master key
is set and the database holds no API key at all, every request is let in as the anonymous admin,
whatever key it sends (the `openai` client insists on one). Creating the first key, or setting a master
key, ends open mode; in production it never applies. That is by design for a local trial, and also means that
the management API (`/api/*`: keys, policies, the request log `/api/requests`, tool-call traces `/api/traces`)
and the console answer anyone who can reach the gateway: `warn_if_open` logs it once at start.
"""

from __future__ import annotations

import asyncio
import logging
import time

from sqlalchemy import Engine, select
from sqlmodel import Session

from link.db.engine import is_unreachable, unreachable_cause
from link.db.models import ApiKey
from link.keys import KeyIdentity, hash_key, verify_key
from link.schemas import OpenAIError
from link.settings import Settings

logger = logging.getLogger(__name__)
ANONYMOUS = KeyIdentity(key_id=None, name="anonymous")  # open mode's caller (compared by identity: `is ANONYMOUS`)


def caller_of(identity: KeyIdentity | None) -> str | None:
    """How a request authenticated, as its request-log row records it (`RequestLog.caller`): "key" (a stored key,
    which the row's api_key_id names), "master" (the master key), "open" (open mode: anonymous, whatever key was
    sent), or None when no key was accepted (a 401 refusal, or a failure before the key was checked)."""
    if identity is None:
        return None
    if identity.key_id is not None:
        return "key"
    return "open" if identity is ANONYMOUS else "master"


def unauthorized(message: str) -> OpenAIError:
    return OpenAIError(401, message, type_="authentication_error", code="invalid_api_key", log_status="unauthorized")


class Authenticator:
    """Maps an Authorization header to a `KeyIdentity`.

    Args:
        engine: the database holding the API keys.
        settings: master key and environment.
        ttl_s: seconds a verified key (and the open-mode check) is cached.
        stale_s: seconds after its verification a cached key is still accepted while the database is unreachable.
    """

    def __init__(self, engine: Engine, settings: Settings, *, ttl_s: float = 2.0, stale_s: float = 600.0):
        self.engine, self.settings, self.ttl_s, self.stale_s = engine, settings, ttl_s, stale_s
        self._cache: dict[str, tuple[KeyIdentity, float]] = {}
        self._open_until = 0.0

    def _is_open(self) -> bool:
        with Session(self.engine) as session:
            return session.exec(select(ApiKey.id).limit(1)).first() is None

    async def is_open_mode(self) -> bool:
        """True in development with no master key and no stored key (cached for `ttl_s`)."""
        if self.settings.is_production or self.settings.master_key is not None:
            return False
        now = time.monotonic()
        if now < self._open_until:
            return True
        if await asyncio.to_thread(self._is_open):
            self._open_until = now + self.ttl_s
            return True
        return False

    async def identify(self, authorization: str | None) -> KeyIdentity:
        """The caller's identity.

        Raises:
            OpenAIError: 401 (`invalid_api_key`) for a missing, unknown or revoked key outside open mode; 503
                (`database_unavailable`) for a stored key the database cannot verify now and this process has not
                verified in the last `stale_s` seconds.
        """
        scheme, _, token = (authorization or "").partition(" ")
        token = token.strip() if scheme.lower() == "bearer" else ""
        if token:
            digest = hash_key(token)
            cached = self._cache.get(digest)
            if cached is not None and cached[1] > time.monotonic():
                return cached[0]
            try:
                identity = await asyncio.to_thread(self._verify, token)
            except Exception as exc:
                if not is_unreachable(exc):
                    raise
                if cached is not None and cached[1] - self.ttl_s + self.stale_s > time.monotonic():
                    return cached[0]
                raise OpenAIError(503, f"The API key cannot be verified: the gateway's database is unreachable "
                                  f"({unreachable_cause(exc)}); retry shortly.", type_="server_error",
                                  code="database_unavailable", headers={"Retry-After": "1"}) from None
            if identity is not None:
                if len(self._cache) > 10_000:
                    self._cache.clear()
                self._cache[digest] = (identity, time.monotonic() + self.ttl_s)
                return identity
        if await self.is_open_mode():
            return ANONYMOUS
        if not token:
            raise unauthorized("You didn't provide an API key: send `Authorization: Bearer <key>` "
                               "(create one with `link keys create NAME`, or use the master key).")
        raise unauthorized("Incorrect API key provided (unknown or revoked).")

    def _verify(self, token: str) -> KeyIdentity | None:
        with Session(self.engine) as session:
            return verify_key(session, token, self.settings.master_key)

    async def require_admin(self, authorization: str | None) -> KeyIdentity:
        """The caller, who must hold the master key (or be in open mode). Raises OpenAIError 401/403."""
        identity = await self.identify(authorization)
        if not identity.is_master:
            raise OpenAIError(403, "This route needs the master key (LINK_MASTER_KEY).", type_="permission_error",
                              code="master_key_required", log_status="unauthorized")
        return identity


async def warn_if_open(auth: Authenticator) -> bool:
    """Log one WARNING when the gateway starts in open mode (see the module docstring); True if it did."""
    if not await auth.is_open_mode():
        return False
    settings = auth.settings
    logger.warning("open mode: no master key (LINK_MASTER_KEY) and no API key stored, so every request is let in as "
                   "the admin: the OpenAI API, the management API (/api/*: keys, policies, the request log "
                   "/api/requests, tool-call traces /api/traces) and the console are unauthenticated for anyone who "
                   "can reach %s:%d. Set LINK_MASTER_KEY or create a key (`link keys create NAME`) to end it",
                   settings.host, settings.port)
    return True
