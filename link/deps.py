"""Dependency aliases of the routes: the gateway state, a database session, the admin caller."""

from __future__ import annotations

from typing import Annotated, Iterator

from fastapi import Depends, Request
from sqlmodel import Session

from link.keys import KeyIdentity
from link.state import GatewayState


async def get_state(request: Request) -> GatewayState:
    return request.app.state.gateway


StateDep = Annotated[GatewayState, Depends(get_state)]


def get_session(state: StateDep) -> Iterator[Session]:
    with Session(state.db) as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session)]


async def require_admin(request: Request, state: StateDep) -> KeyIdentity:
    """The caller, who must hold the master key (or be in development open mode); else 401/403."""
    return await state.auth.require_admin(request.headers.get("authorization"))


AdminDep = Annotated[KeyIdentity, Depends(require_admin)]
