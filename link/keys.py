"""API keys: create (the plaintext is shown once), list, revoke, verify.

    key, plaintext = create_key(session, "alice", budget_usd=5.0, rpm_limit=60)
    update_key(session, key.id, ApiKeyUpdate(budget_usd=10.0))      # fields left out keep their values
    identity = verify_key(session, request_bearer_token, master_key=settings.master_key)

Keys look like `sk-link-<43 url-safe characters>` (256 random bits). Only the key's sha256 (hex) is stored,
with its first characters for display; a leaked database reveals no usable key. The master key from
settings is never stored: it always authenticates (as the admin) unless unset.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from pydantic import SecretStr
from sqlmodel import Session, select

from link.db.models import ApiKey, ApiKeyCreate, ApiKeyPublic, ApiKeyUpdate, usd_to_nano, utcnow

KEY_PREFIX = "sk-link-"
DISPLAY_PREFIX_LENGTH = len(KEY_PREFIX) + 6


class KeyNotFound(LookupError):
    """No API key with this id."""


@dataclass(frozen=True)
class KeyIdentity:
    """Who a request authenticated as: a stored key (`key_id` set) or the master key (`key_id` None)."""

    key_id: int | None
    name: str
    rpm_limit: int | None = None
    tpm_limit: int | None = None
    budget_usd: float | None = None
    capture_traces: bool = False  # record requests with `tools` as tool-call traces (link/traces.py)

    @property
    def is_master(self) -> bool:
        return self.key_id is None

    @property
    def has_budget(self) -> bool:
        return self.budget_usd is not None


MASTER_IDENTITY = KeyIdentity(key_id=None, name="master")


def hash_key(plaintext: str) -> str:
    """The sha256 of a key as 64 hex characters (what the database stores)."""
    return hashlib.sha256(plaintext.encode()).hexdigest()


def generate_key() -> str:
    """A new random key, `sk-link-` + 256 random bits in URL-safe base64."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def create_key(session: Session, name: str, budget_usd: float | None = None, rpm_limit: int | None = None,
               tpm_limit: int | None = None, capture_traces: bool = False) -> tuple[ApiKeyPublic, str]:
    """Create and store a key; returns its public view and the plaintext (shown this once, never stored).

    Args:
        name: a label (several keys may share one).
        budget_usd: the most this key may spend in USD; None = unlimited.
        rpm_limit, tpm_limit: requests and tokens per minute; None = unlimited.
        capture_traces: record the key's chat requests with `tools` as tool-call traces (link/traces.py).

    Raises:
        pydantic.ValidationError: an empty name or a negative budget / non-positive limit.
    """
    fields = ApiKeyCreate(name=name, budget_usd=budget_usd, rpm_limit=rpm_limit, tpm_limit=tpm_limit,
                          capture_traces=capture_traces)
    plaintext = generate_key()
    row = ApiKey(name=fields.name, rpm_limit=fields.rpm_limit, tpm_limit=fields.tpm_limit,
                 capture_traces=fields.capture_traces, key_hash=hash_key(plaintext), key_prefix=plaintext[:DISPLAY_PREFIX_LENGTH],
                 budget_nusd=None if fields.budget_usd is None else usd_to_nano(fields.budget_usd))
    session.add(row)
    session.commit()
    session.refresh(row)
    return ApiKeyPublic.from_row(row), plaintext


def get_key(session: Session, key_id: int) -> ApiKeyPublic:
    """The public view of one key, spend included.

    Raises:
        KeyNotFound: no key with this id.
    """
    row = session.get(ApiKey, key_id, populate_existing=True)
    if row is None:
        raise KeyNotFound(f"no API key with id {key_id}")
    return ApiKeyPublic.from_row(row)


def list_keys(session: Session, include_revoked: bool = True) -> list[ApiKeyPublic]:
    """All keys, oldest first."""
    query = select(ApiKey).order_by(ApiKey.id)
    if not include_revoked:
        query = query.where(ApiKey.revoked_at.is_(None))
    return [ApiKeyPublic.from_row(row) for row in session.exec(query)]


def update_key(session: Session, key_id: int, changes: ApiKeyUpdate) -> ApiKeyPublic:
    """Change a key's name, limits, budget or trace capture: the fields set in `changes` (an explicit None makes a
    limit or the budget unlimited); spend is kept. The ledger reads the budget at each reservation, so a new budget applies
    to the next request.

    Raises:
        KeyNotFound: no key with this id. ValueError: `changes` sets the name or capture_traces to None.
    """
    row = session.get(ApiKey, key_id)
    if row is None:
        raise KeyNotFound(f"no API key with id {key_id}")
    fields = changes.model_dump(exclude_unset=True)
    if "name" in fields and fields["name"] is None:
        raise ValueError("a key's name cannot be removed")
    if "capture_traces" in fields and fields["capture_traces"] is None:
        raise ValueError("capture_traces must be true or false, not null")
    if "budget_usd" in fields:
        budget = fields.pop("budget_usd")
        row.budget_nusd = None if budget is None else usd_to_nano(budget)
    for name, value in fields.items():
        setattr(row, name, value)
    session.add(row)
    session.commit()
    session.refresh(row)
    return ApiKeyPublic.from_row(row)


def revoke_key(session: Session, key_id: int) -> ApiKeyPublic:
    """Revoke a key: every gateway sharing the database refuses it once its cache of verified keys (2 s) expires.
    Revoking an already revoked key keeps the first revocation time.

    Raises:
        KeyNotFound: no key with this id.
    """
    row = session.get(ApiKey, key_id)
    if row is None:
        raise KeyNotFound(f"no API key with id {key_id}")
    if row.revoked_at is None:
        row.revoked_at = utcnow()
        session.add(row)
        session.commit()
        session.refresh(row)
    return ApiKeyPublic.from_row(row)


def is_master_key(plaintext: str, master_key: str | SecretStr | None) -> bool:
    """Constant-time comparison with the master key; False when no master key is set."""
    if master_key is None:
        return False
    expected = master_key.get_secret_value() if isinstance(master_key, SecretStr) else master_key
    return bool(expected) and hmac.compare_digest(plaintext.encode(), expected.encode())


def verify_key(session: Session, plaintext: str, master_key: str | SecretStr | None = None) -> KeyIdentity | None:
    """Who `plaintext` (the bearer token) authenticates as, or None for an unknown or revoked key.

    Args:
        plaintext: the key as the client sent it (without "Bearer ").
        master_key: the master key from settings (`Settings.master_key`); None = no master key.
    """
    if is_master_key(plaintext, master_key):
        return MASTER_IDENTITY
    if not plaintext.startswith(KEY_PREFIX):
        return None
    row = session.exec(select(ApiKey).where(ApiKey.key_hash == hash_key(plaintext))).first()
    if row is None or row.revoked_at is not None:
        return None
    public = ApiKeyPublic.from_row(row)
    return KeyIdentity(key_id=row.id, name=row.name, rpm_limit=row.rpm_limit, tpm_limit=row.tpm_limit,
                       budget_usd=public.budget_usd, capture_traces=row.capture_traces)
