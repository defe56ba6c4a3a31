"""Tables and API schemas (SQLModel). One family per resource exposed over the API:

    <Resource>Base    the fields a client may set
    <Resource>Create  the body of a create request
    <Resource>Update  the body of a partial update (every field optional)
    <Resource>Public  what the API returns
    <Resource>        the table (table=True)

Money is stored as integer nano-dollars (1 USD = 10^9 nUSD) in the key ledger, so budget arithmetic
inside the database (`spend + reserved + cost <= budget`) is exact on SQLite and PostgreSQL alike;
floats in USD appear only at the API boundary. Times are UTC.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Annotated, Any
from uuid import uuid4

from pydantic import AfterValidator, ConfigDict, field_validator
from sqlalchemy import JSON, BigInteger, Column, DateTime, Text
from sqlmodel import Field, SQLModel

NANO_PER_USD = 1_000_000_000
# Bounds of API inputs that reach integer columns: a 32-bit INTEGER (PostgreSQL's; SQLite's are 64-bit) for the
# limits, and nano-dollars of a budget well inside BIGINT (1e9 USD = 1e18 nUSD < 2**63).
MAX_INT32 = 2**31 - 1
MAX_BUDGET_USD = 1e9
REQUEST_STATUSES = ("ok", "error", "timeout", "client_disconnected", "rate_limited", "budget_exceeded",
                    "unauthorized", "invalid_request")


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def usd_to_nano(usd: float) -> int:
    """USD (float) -> integer nano-dollars, rounded to the nearest."""
    return round(usd * NANO_PER_USD)


def nano_to_usd(nano: int | None) -> float | None:
    return None if nano is None else nano / NANO_PER_USD


def json_compliant(value: Any) -> Any:
    """`value` with every non-finite float (nested in lists and dicts) replaced by its name ("NaN", "Infinity",
    "-Infinity"), as strict JSON requires."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: json_compliant(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_compliant(v) for v in value]
    return value


def _as_utc(value: datetime) -> datetime:
    # SQLite stores no time zone: a naive value read back is UTC.
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value


UTCDateTime = Annotated[datetime, AfterValidator(_as_utc)]


def time_column(nullable: bool = False, index: bool = False) -> Any:
    """A timezone-aware timestamp column (UTC) for a table model: now at insert, or NULL by default when `nullable`."""
    if nullable:
        return Field(default=None, sa_type=DateTime(timezone=True), nullable=True, index=index)
    return Field(default_factory=utcnow, sa_type=DateTime(timezone=True), nullable=False, index=index)


# --- API keys -----------------------------------------------------------------------------------


class ApiKeyBase(SQLModel):
    name: str = Field(min_length=1, max_length=128, index=True)
    rpm_limit: int | None = Field(default=None, ge=1, le=MAX_INT32, description="requests per minute; None = unlimited")
    tpm_limit: int | None = Field(default=None, ge=1, le=MAX_INT32, description="tokens per minute; None = unlimited")
    capture_traces: bool = Field(default=False, description="record this key's requests with `tools` as tool-call "
                                 "traces (table tool_trace, GET /api/traces)")


class ApiKeyCreate(ApiKeyBase):
    # ge/le also refuse NaN and Infinity (no comparison holds for NaN)
    budget_usd: float | None = Field(default=None, ge=0, le=MAX_BUDGET_USD, description="USD; None = no budget")


class ApiKeyUpdate(SQLModel):
    name: str | None = Field(default=None, min_length=1, max_length=128)
    rpm_limit: int | None = Field(default=None, ge=1, le=MAX_INT32)
    tpm_limit: int | None = Field(default=None, ge=1, le=MAX_INT32)
    budget_usd: float | None = Field(default=None, ge=0, le=MAX_BUDGET_USD)
    capture_traces: bool | None = None


class ApiKey(ApiKeyBase, table=True):
    __tablename__ = "api_key"

    id: int | None = Field(default=None, primary_key=True)
    key_hash: str = Field(max_length=64, unique=True, description="sha256 hex of the plaintext key")
    key_prefix: str = Field(max_length=32, description="the first characters of the key, for display")
    created_at: datetime = time_column()
    revoked_at: datetime | None = time_column(nullable=True)
    budget_nusd: int | None = Field(default=None, sa_type=BigInteger, nullable=True)
    spend_nusd: int = Field(default=0, sa_type=BigInteger)
    reserved_nusd: int = Field(default=0, sa_type=BigInteger)


class ApiKeyPublic(ApiKeyBase):
    id: int
    key_prefix: str
    created_at: UTCDateTime
    revoked_at: UTCDateTime | None = None
    budget_usd: float | None = None
    spend_usd: float = 0.0
    reserved_usd: float = 0.0

    @property
    def is_revoked(self) -> bool:
        return self.revoked_at is not None

    @classmethod
    def from_row(cls, row: ApiKey) -> ApiKeyPublic:
        return cls(id=row.id, name=row.name, rpm_limit=row.rpm_limit, tpm_limit=row.tpm_limit,
                   capture_traces=row.capture_traces, key_prefix=row.key_prefix, created_at=row.created_at,
                   revoked_at=row.revoked_at, budget_usd=nano_to_usd(row.budget_nusd), spend_usd=nano_to_usd(row.spend_nusd),
                   reserved_usd=nano_to_usd(row.reserved_nusd))


# --- policies -----------------------------------------------------------------------------------


class PolicyBase(SQLModel):
    name: str = Field(min_length=1, max_length=128, unique=True)
    type: str = Field(min_length=1, max_length=32, description='"fixed", "fallback", later "router", "moa"')
    models: list[str] = Field(default_factory=list, sa_type=JSON)
    options: dict[str, Any] = Field(default_factory=dict, sa_type=JSON)


class PolicyCreate(PolicyBase):
    pass


class PolicyUpdate(SQLModel):
    type: str | None = Field(default=None, min_length=1, max_length=32)
    models: list[str] | None = None
    options: dict[str, Any] | None = None


class PolicyRow(PolicyBase, table=True):
    __tablename__ = "policy"

    id: int | None = Field(default=None, primary_key=True)
    created_at: datetime = time_column()
    updated_at: datetime = time_column()


class PolicyPublic(PolicyBase):
    id: int
    created_at: UTCDateTime
    updated_at: UTCDateTime

    @field_validator("options")
    @classmethod
    def _json_compliant(cls, value: dict[str, Any]) -> dict[str, Any]:
        # A row stored before options were checked may hold NaN or Infinity, which JSON cannot carry: shown as
        # the strings "NaN", "Infinity", so the API still lists it (and the check refuses it until fixed).
        return json_compliant(value)


# --- models -------------------------------------------------------------------------------------


class ModelBase(SQLModel):
    name: str = Field(min_length=1, max_length=256, index=True, description="public model name; repeats = replicas")
    kind: str = Field(min_length=1, max_length=32, description='"local", "litellm" or "openai"')
    config: dict[str, Any] = Field(default_factory=dict, sa_type=JSON, description="the deployment's settings")


class ModelCreate(ModelBase):
    pass


class ModelUpdate(SQLModel):
    kind: str | None = Field(default=None, min_length=1, max_length=32)
    config: dict[str, Any] | None = None


class ModelRow(ModelBase, table=True):
    __tablename__ = "model"

    id: int | None = Field(default=None, primary_key=True)
    created_at: datetime = time_column()


class ModelPublic(ModelBase):
    id: int
    created_at: UTCDateTime


# --- request log --------------------------------------------------------------------------------


class RequestLogBase(SQLModel):
    api_key_id: int | None = Field(default=None, foreign_key="api_key.id", index=True, ondelete="SET NULL")
    caller: str | None = Field(default=None, max_length=16,
                               description="how the request authenticated: key (api_key_id names it), master, or open "
                                           "(open mode: anonymous); null when refused with a 401 (link/auth.py caller_of)")
    policy: str | None = Field(default=None, max_length=128, index=True)
    model: str | None = Field(default=None, max_length=256, index=True, description="the model that answered")
    deployment: str | None = Field(default=None, max_length=256, description="deployment id, name#index")
    decision: dict[str, Any] | None = Field(default=None, sa_type=JSON, description="the policy's decision")
    prompt_tokens: int = Field(default=0, ge=0)
    completion_tokens: int = Field(default=0, ge=0)
    cost_usd: float = Field(default=0.0, ge=0)
    ttft_ms: float | None = Field(default=None, ge=0, description="time to first token, ms")
    latency_ms: float | None = Field(default=None, ge=0, description="whole request, ms")
    status: str = Field(default="ok", max_length=32, index=True, description=" / ".join(REQUEST_STATUSES))
    http_status: int | None = None
    error: str | None = Field(default=None, sa_type=Text)
    stream: bool = False
    user: str | None = Field(default=None, max_length=256)
    instance: str | None = Field(default=None, max_length=128,
                                 description="the gateway process that served it: its LINK_INSTANCE_ID (with -w<i> for "
                                             "worker i of `link serve --workers N`), else an id fresh per process")

    @field_validator("status")
    @classmethod
    def _known_status(cls, value: str) -> str:
        if value not in REQUEST_STATUSES:
            raise ValueError(f"status must be one of {', '.join(REQUEST_STATUSES)}")
        return value


class RequestLogCreate(RequestLogBase):
    model_config = ConfigDict(populate_by_name=True)

    id: str = Field(default_factory=lambda: uuid4().hex, min_length=1, max_length=64)
    created_at: datetime = Field(default_factory=utcnow)
    # `metadata` is reserved on SQLModel/SQLAlchemy classes: the attribute is `request_metadata`,
    # the JSON name and the column name are `metadata` (the OpenAI request field).
    request_metadata: dict[str, Any] | None = Field(default=None, alias="metadata")


class RequestLog(RequestLogBase, table=True):
    __tablename__ = "request_log"

    id: str = Field(primary_key=True, max_length=64, description="the x-link-request-id")
    created_at: datetime = time_column(index=True)
    request_metadata: dict[str, Any] | None = Field(default=None, sa_column=Column("metadata", JSON, nullable=True))

    @classmethod
    def from_create(cls, entry: RequestLogCreate) -> RequestLog:
        return cls(**entry.model_dump())


class RequestLogPublic(RequestLogBase):
    """Serialize with `model_dump(by_alias=True)` (FastAPI does) to name the metadata `metadata`."""

    model_config = ConfigDict(populate_by_name=True)

    id: str
    created_at: UTCDateTime
    request_metadata: dict[str, Any] | None = Field(default=None, alias="metadata")

    @classmethod
    def from_row(cls, row: RequestLog) -> RequestLogPublic:
        return cls(**row.model_dump())


# --- tool-call traces ---------------------------------------------------------------------------


class ToolTrace(SQLModel, table=True):
    """One chat request with `tools` and its answer, recorded for keys or policies that opted in
    (`ApiKey.capture_traces`, a policy's `options.capture_traces`); written by link/traces.py, read by
    GET /api/traces and posttrain/traces_log.py. `messages` are the request's messages as sent, `response`
    the answer's first choice as one assistant message (`content` when it has text, `tool_calls` when it
    called tools), also for a streamed answer (assembled from its chunks)."""

    __tablename__ = "tool_trace"

    id: str = Field(primary_key=True, max_length=64, description="the x-link-request-id")
    created_at: datetime = time_column(index=True)
    api_key_id: int | None = Field(default=None, foreign_key="api_key.id", index=True, ondelete="SET NULL")
    policy: str | None = Field(default=None, max_length=128, index=True)
    model: str | None = Field(default=None, max_length=256, description="the model that answered")
    stream: bool = False
    messages: list[dict[str, Any]] = Field(sa_type=JSON, description="the request's messages (OpenAI chat format)")
    tools: list[dict[str, Any]] = Field(sa_type=JSON, description="the request's tools (OpenAI format)")
    response: dict[str, Any] = Field(sa_type=JSON, description="the assistant message of the answer")
    finish_reason: str | None = Field(default=None, max_length=32)


# --- console sessions ---------------------------------------------------------------------------


class ConsoleSession(SQLModel, table=True):
    """One login to the console (web/session.py). The signed cookie carries a random session id; the row, keyed by
    its sha256, makes the session revocable: logging out sets `revoked_at`, and `expires_at` (the login time plus
    the session lifetime) ends it whatever the cookie says. `flash` holds a one-time message for the next page
    (a key's plaintext after it was created), removed when that page reads it."""

    __tablename__ = "console_session"

    id: str = Field(primary_key=True, max_length=64, description="sha256 hex of the cookie's session id")
    created_at: datetime = time_column()
    last_seen_at: datetime = time_column()
    expires_at: datetime = Field(sa_type=DateTime(timezone=True), nullable=False, index=True)
    revoked_at: datetime | None = time_column(nullable=True)
    flash: dict[str, Any] | None = Field(default=None, sa_type=JSON, nullable=True)


# --- rate-limit counters (internal; Redis holds them instead when configured) ---------------------


class RateLimitCounter(SQLModel, table=True):
    __tablename__ = "rate_limit_counter"

    key: str = Field(primary_key=True, max_length=128, description="<scope>:<api key id>")
    window_start: int = Field(primary_key=True, sa_type=BigInteger, description="epoch seconds")
    requests: int = 0
    tokens: int = Field(default=0, sa_type=BigInteger)
