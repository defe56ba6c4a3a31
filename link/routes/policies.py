"""`/api/policies`: create, read, update and delete the database policies (master key required).

    POST   /api/policies            {"name", "type", "models", "options"}   201, 400 invalid, 409 name taken
    GET    /api/policies            every policy: config ones (`"source": "config"`, read-only) and database ones
    GET    /api/policies/{name}     one policy (404 unknown)
    PUT    /api/policies/{name}     replace type, models and options (400 without type or models)
    PATCH  /api/policies/{name}     change the fields given
    DELETE /api/policies/{name}     204
Errors are OpenAI error objects naming the field at fault (`param`).
"""

from __future__ import annotations

from fastapi import APIRouter, Response

from link.db.models import PolicyCreate, PolicyPublic, PolicyUpdate
from link.deps import AdminDep, SessionDep, StateDep
from link.policies.base import PolicyError
from link.policies.store import PolicyConflict, PolicyNotFound
from link.schemas import OpenAIError

router = APIRouter(prefix="/api/policies", tags=["policies"])


def _call(method, *args, **kwargs):
    try:
        return method(*args, **kwargs)
    except PolicyError as exc:
        raise OpenAIError(400, exc.message, param=exc.param, code="invalid_policy") from None
    except PolicyNotFound as exc:
        raise OpenAIError(404, str(exc), type_="not_found_error", param="name", code="policy_not_found") from None
    except PolicyConflict as exc:
        raise OpenAIError(409, str(exc), param="name", code="policy_conflict") from None


@router.post("", status_code=201, response_model=PolicyPublic)
def create_policy(body: PolicyCreate, state: StateDep, session: SessionDep, _: AdminDep):
    return _call(state.policies.create, session, body)


@router.get("")
def list_policies(state: StateDep, session: SessionDep, _: AdminDep) -> dict:
    configured = [{**p.describe(), "source": "config"} for p in state.policies.configured.values()]
    stored = [{**p.model_dump(mode="json"), "source": "database"} for p in state.policies.list(session)]
    return {"object": "list", "data": configured + stored}


@router.get("/{name:path}", response_model=PolicyPublic)
def get_policy(name: str, state: StateDep, session: SessionDep, _: AdminDep):
    return _call(state.policies.get, session, name)


@router.put("/{name:path}", response_model=PolicyPublic)
def replace_policy(name: str, body: PolicyUpdate, state: StateDep, session: SessionDep, _: AdminDep):
    return _call(state.policies.update, session, name, body, replace=True)


@router.patch("/{name:path}", response_model=PolicyPublic)
def update_policy(name: str, body: PolicyUpdate, state: StateDep, session: SessionDep, _: AdminDep):
    return _call(state.policies.update, session, name, body)


@router.delete("/{name:path}", status_code=204)
def delete_policy(name: str, state: StateDep, session: SessionDep, _: AdminDep) -> Response:
    _call(state.policies.delete, session, name)
    return Response(status_code=204)
