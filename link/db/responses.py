"""The stored responses of the Responses API (`POST /v1/responses` with `store`, the default): the table and its
three queries, each scoped to the caller that created the response (another key finds nothing: a 404).

    save_response(engine, StoredResponse(id=..., api_key_id=3, caller="key", response={...}, messages=[...]))
    row = load_response(engine, "resp_...", api_key_id=3, caller="key")      # None: unknown or not this caller's
    deleted = delete_response(engine, "resp_...", api_key_id=3, caller="key")

`response` is the Response object as the client got it; `messages` the conversation through that response as
chat messages (the earlier turns, the input, the output; never the `instructions`, which OpenAI does not carry
over), which a request naming it in `previous_response_id` continues. The owner is the pair (api_key_id, caller):
a stored key by its id, the master key as ("master", no id), open mode as ("open", no id). Created by migration 0007.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Engine, delete
from sqlmodel import Field, Session, SQLModel, select

from link.db.models import time_column


class StoredResponse(SQLModel, table=True):
    __tablename__ = "stored_response"

    id: str = Field(primary_key=True, max_length=64, description="the response id, resp_...")
    created_at: datetime = time_column(index=True)
    api_key_id: int | None = Field(default=None, foreign_key="api_key.id", index=True, ondelete="CASCADE")
    caller: str = Field(max_length=16, description="key, master or open (link/auth.py caller_of)")
    response: dict[str, Any] = Field(sa_type=JSON, description="the Response object")
    messages: list[dict[str, Any]] = Field(sa_type=JSON,
                                           description="the conversation through this response, as chat messages")


def _owned(response_id: str, api_key_id: int | None, caller: str):
    owner = StoredResponse.api_key_id == api_key_id if api_key_id is not None else StoredResponse.api_key_id.is_(None)
    return (StoredResponse.id == response_id, owner, StoredResponse.caller == caller)


def save_response(engine: Engine, row: StoredResponse) -> None:
    """Insert one stored response. Raises sqlalchemy errors (the caller logs them: the answer was already given)."""
    with Session(engine) as session:
        session.add(row)
        session.commit()


def load_response(engine: Engine, response_id: str, *, api_key_id: int | None, caller: str) -> StoredResponse | None:
    """The stored response `response_id` if this owner created it, else None."""
    with Session(engine) as session:
        return session.exec(select(StoredResponse).where(*_owned(response_id, api_key_id, caller))).first()


def delete_response(engine: Engine, response_id: str, *, api_key_id: int | None, caller: str) -> bool:
    """Delete the stored response `response_id` of this owner; False when there is none."""
    with Session(engine) as session:
        result = session.execute(delete(StoredResponse).where(*_owned(response_id, api_key_id, caller)))
        session.commit()
        return result.rowcount > 0
