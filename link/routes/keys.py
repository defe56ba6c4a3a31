"""`/api/keys`: API keys with their limits, budgets and spend (master key required).

    POST   /api/keys                {"name", "budget_usd", "rpm_limit", "tpm_limit", "capture_traces"}   201: the key's fields and
                                    "key", the plaintext, returned this once (only its sha256 is stored)
    GET    /api/keys?include_revoked=true    every key, oldest first: budget_usd, spend_usd, reserved_usd
    GET    /api/keys/{id}           one key (404 unknown)
    PATCH  /api/keys/{id}           {"name", "budget_usd", "rpm_limit", "tpm_limit", "capture_traces"}: the fields given
                                    (null = unlimited); capture_traces true records the key's requests with `tools`
                                    as tool-call traces (GET /api/traces)
    DELETE /api/keys/{id}           revoke it (200, the revoked key; revoking twice keeps the first time)
The same operations as `link keys create|list|revoke`; errors are OpenAI error objects naming the field.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request

from link.db.models import ApiKeyCreate, ApiKeyPublic, ApiKeyUpdate
from link.deps import AdminDep, SessionDep
from link.keys import KeyNotFound, create_key, get_key, list_keys, revoke_key, update_key
from link.request_log import MAX_ID
from protocol.openapi_body import json_body
from link.schemas import OpenAIError, parse_body

router = APIRouter(prefix="/api/keys", tags=["keys"])
KeyId = Annotated[int, Path(ge=1, le=MAX_ID, description="the key's id")]  # beyond 64 bits no query can run


class ApiKeyCreated(ApiKeyPublic):
    """A new key: its public fields and `key`, the plaintext (shown once)."""

    key: str


def _not_found(exc: KeyNotFound) -> OpenAIError:
    return OpenAIError(404, str(exc), param="id", code="key_not_found")


@router.post("", status_code=201, response_model=ApiKeyCreated, openapi_extra=json_body(ApiKeyCreate))
async def create(request: Request, session: SessionDep, _: AdminDep):
    body = parse_body(await request.body(), ApiKeyCreate, "an API key")
    key, plaintext = create_key(session, body.name, budget_usd=body.budget_usd, rpm_limit=body.rpm_limit,
                                tpm_limit=body.tpm_limit, capture_traces=body.capture_traces)
    return ApiKeyCreated(**key.model_dump(), key=plaintext)


@router.get("", response_model=list[ApiKeyPublic])
def list_all(session: SessionDep, _: AdminDep, include_revoked: bool = True):
    return list_keys(session, include_revoked=include_revoked)


@router.get("/{key_id}", response_model=ApiKeyPublic)
def one(key_id: KeyId, session: SessionDep, _: AdminDep):
    try:
        return get_key(session, key_id)
    except KeyNotFound as exc:
        raise _not_found(exc) from None


@router.patch("/{key_id}", response_model=ApiKeyPublic, openapi_extra=json_body(ApiKeyUpdate))
async def update(key_id: KeyId, request: Request, session: SessionDep, _: AdminDep):
    changes = parse_body(await request.body(), ApiKeyUpdate, "an API key")
    try:
        return update_key(session, key_id, changes)
    except KeyNotFound as exc:
        raise _not_found(exc) from None
    except ValueError as exc:
        raise OpenAIError(400, str(exc), param="capture_traces" if "capture_traces" in str(exc) else "name") from None


@router.delete("/{key_id}", response_model=ApiKeyPublic)
def revoke(key_id: KeyId, session: SessionDep, _: AdminDep):
    try:
        return revoke_key(session, key_id)
    except KeyNotFound as exc:
        raise _not_found(exc) from None
