"""`/api/policies`: create, read, update and delete the database policies (master key required).

    POST   /api/policies            {"name", "type", "models", "options"}   201, 400 invalid, 409 name taken
    GET    /api/policies            every policy: config ones (`"source": "config"`, read-only) and database ones
                                    (a stored one that fails today's checks carries `"invalid": why`, and is not served)
    GET    /api/policies/{name}     one policy (404 unknown)
    PUT    /api/policies/{name}     replace type, models and options (400 without type or models); "name" renames
    PATCH  /api/policies/{name}     change the fields given; "name" renames
    DELETE /api/policies/{name}     204
Bodies are JSON objects with only the fields above: a body that is not JSON (its position named), a
field not listed (400 naming it) or a field of the wrong type is a 400. A model name is not a stored
policy (404); a config policy is read-only (409). Errors are OpenAI error objects naming the field at
fault (`param`).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response
from pydantic import Field

from link.db.models import PolicyCreate, PolicyPublic, PolicyUpdate
from link.deps import AdminDep, SessionDep, StateDep
from link.policies.base import PolicyError
from link.policies.store import PolicyConflict, PolicyNotFound
from protocol.openapi_body import json_body
from link.schemas import OpenAIError, parse_body

router = APIRouter(prefix="/api/policies", tags=["policies"])


class PolicyChange(PolicyUpdate):
    """A PUT or PATCH body: the fields to change; `name` renames the policy."""

    name: str | None = Field(default=None, min_length=1, max_length=128)


async def _create_body(request: Request, _: AdminDep) -> PolicyCreate:
    return parse_body(await request.body(), PolicyCreate, "a policy")


async def _change_body(request: Request, _: AdminDep) -> PolicyChange:
    return parse_body(await request.body(), PolicyChange, "a policy")


CreateBody = Annotated[PolicyCreate, Depends(_create_body)]
ChangeBody = Annotated[PolicyChange, Depends(_change_body)]


def _call(method, *args, **kwargs):
    try:
        return method(*args, **kwargs)
    except PolicyError as exc:
        raise OpenAIError(400, exc.message, param=exc.param, code="invalid_policy") from None
    except PolicyNotFound as exc:
        raise OpenAIError(404, str(exc), param="name", code="policy_not_found") from None
    except PolicyConflict as exc:
        raise OpenAIError(409, str(exc), param="name", code="policy_conflict") from None


@router.post("", status_code=201, response_model=PolicyPublic, openapi_extra=json_body(PolicyCreate))
def create_policy(body: CreateBody, state: StateDep, session: SessionDep):
    return _call(state.policies.create, session, body)


@router.get("")
def list_policies(state: StateDep, session: SessionDep, _: AdminDep) -> dict:
    configured = [{**p.describe(), "source": "config"} for p in state.policies.configured.values()]
    stored = []
    for policy in state.policies.list(session):
        item = {**policy.model_dump(mode="json"), "source": "database"}
        problem = state.policies.why_invalid(policy)
        if problem is not None:
            item["invalid"] = problem  # stored before today's checks, or a model gone since: listed, not served
        stored.append(item)
    return {"object": "list", "data": configured + stored}


@router.get("/{name:path}", response_model=PolicyPublic)
def get_policy(name: str, state: StateDep, session: SessionDep, _: AdminDep):
    return _call(state.policies.get, session, name)


@router.put("/{name:path}", response_model=PolicyPublic, openapi_extra=json_body(PolicyChange))
def replace_policy(name: str, body: ChangeBody, state: StateDep, session: SessionDep):
    return _call(state.policies.update, session, name, body, replace=True)


@router.patch("/{name:path}", response_model=PolicyPublic, openapi_extra=json_body(PolicyChange))
def update_policy(name: str, body: ChangeBody, state: StateDep, session: SessionDep):
    return _call(state.policies.update, session, name, body)


@router.delete("/{name:path}", status_code=204)
def delete_policy(name: str, state: StateDep, session: SessionDep, _: AdminDep) -> Response:
    _call(state.policies.delete, session, name)
    return Response(status_code=204)
