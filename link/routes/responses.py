"""OpenAI's Responses API: POST /v1/responses, GET and DELETE /v1/responses/{response_id}.

A `POST /v1/responses` runs the chat pipeline of link/routes/openai.py (`handle`: key, rate limit, policy,
budget, backends with fallback, accounting, request-log row and metrics, all as `/v1/chat/completions`) through
`ResponsesDialect`, which translates the body into a chat request (protocol/responses.py) and the answer back
into a Response object, or the chat stream into the Responses events (protocol/responses_stream.py). The
request-log row records `decision.endpoint` "/v1/responses"; its tokens and cost are the chat call's.

Stored responses (`store`, true by default as with OpenAI) live in the `stored_response` table
(link/db/responses.py) with the conversation through them; a request naming one in `previous_response_id`
continues it (its earlier input and output come before the new input; `instructions` are not carried over).
Each is visible only to the caller that created it: the same API key (or the master key, or open mode); any
other gets the 404 of an unknown id. A whole response is stored before it is answered, a streamed one before
its `response.completed` event, so the client can continue it at once; a failed or refused one is not stored.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from link.accounting import RequestRecord
from link.auth import caller_of
from link.db.responses import StoredResponse, delete_response, load_response, save_response
from link.deps import StateDep
from link.routes.openai import Dialect, handle
from link.schemas import OpenAIError, invalid_body
from link.state import GatewayState
from protocol.openapi_body import json_body
from protocol.responses import ResponsesRequest, input_messages, new_id, output_messages, to_chat, whole_response
from protocol.responses_stream import ResponseStream, event_frame

logger = logging.getLogger(__name__)
router = APIRouter()
PATH = "/v1/responses"
# the routes whose every request gets a request-log row, refusals by the request boundary included (link/app.py)
LOGGED_PATHS = (PATH,)


def _owner(record_identity) -> dict:
    return {"api_key_id": record_identity.key_id if record_identity else None, "caller": caller_of(record_identity) or ""}


def not_found(response_id: str) -> OpenAIError:
    """OpenAI's 404 for an unknown (or another caller's) response id."""
    return OpenAIError(404, f"Response with id '{response_id}' not found.", log_status="invalid_request")


class ResponsesDialect(Dialect):
    """One Responses request over `handle`: validated and its stored history read in `load`, translated in
    `to_openai`, answered by `answer` (whole) or `frames` (stream). `final` is the Response object once known."""

    path = PATH

    def __init__(self, state: GatewayState):
        self.state = state
        self.request: ResponsesRequest | None = None
        self.history: list[dict] = []      # the chat messages of the conversation `previous_response_id` continues
        self.owner: dict = {}
        self.response_id, self.created_at = new_id("resp"), int(time.time())
        self.final: dict | None = None

    async def load(self, body: dict, record: RequestRecord) -> None:
        """Validate the body (400 naming the field) and read the conversation it continues (404 when unknown)."""
        try:
            self.request = ResponsesRequest.model_validate(body)
        except ValidationError as exc:
            raise invalid_body(exc) from None
        self.owner = _owner(record.identity)
        previous = self.request.previous_response_id
        if previous is not None:
            row = await asyncio.to_thread(load_response, self.state.db, previous, **self.owner)
            if row is None:
                raise OpenAIError(404, f"Previous response with id '{previous}' not found.", param="previous_response_id",
                                  code="previous_response_not_found", log_status="invalid_request")
            self.history = row.messages

    def to_openai(self, request: Request, body: dict) -> dict:
        return to_chat(self.request, self.history)

    def answer(self, response: dict, record: RequestRecord) -> dict:
        self.final = whole_response(self.request, self.response_id, self.created_at, response)
        return self.final

    async def save(self) -> None:
        """Store `final` with its conversation when the request asked to (`store`); a failure is logged."""
        if self.final is None or not self.request.store:
            return
        messages = [*self.history, *input_messages(self.request), *output_messages(self.final["output"])]
        row = StoredResponse(id=self.response_id, response=self.final, messages=messages, **self.owner)
        try:
            await asyncio.to_thread(save_response, self.state.db, row)
        except Exception:
            logger.exception("response %s could not be stored", self.response_id)

    def frames(self, frames: AsyncIterator[bytes], record: RequestRecord) -> AsyncIterator[bytes]:
        return self._events(frames, record)

    async def _events(self, frames: AsyncIterator[bytes], record: RequestRecord) -> AsyncIterator[bytes]:
        """The chat SSE frames (`data: {chunk}`, an error event, `data: [DONE]`, keep-alive comments) as
        Responses events; keep-alives pass through."""
        stream = ResponseStream(self.request, self.response_id, self.created_at, record.model or self.request.model)
        for event in stream.start():
            yield event_frame(event)
        has_failed = False
        try:
            async for data in frames:
                for block in data.split(b"\n\n"):
                    if not block.startswith(b"data: "):
                        if block:
                            yield block + b"\n\n"
                        continue
                    if block == b"data: [DONE]":
                        continue
                    chunk = json.loads(block[len(b"data: "):])
                    if "error" in chunk and not chunk.get("choices"):
                        has_failed = True
                        events = stream.fail("server_error", str((chunk["error"] or {}).get("message") or "the backend failed"))
                    else:
                        events = stream.add(chunk)
                    for event in events:
                        yield event_frame(event)
        finally:
            await frames.aclose()
        if has_failed:
            return
        closing = stream.finish()
        self.final = stream.final
        await self.save()
        for event in closing:
            yield event_frame(event)


@router.post(PATH, openapi_extra=json_body(ResponsesRequest))
async def create_response(request: Request, state: StateDep) -> Response:
    """OpenAI Responses (whole or streamed), served over the chat pipeline; see the module docstring."""
    dialect = ResponsesDialect(state)
    response = await handle(request, state, "chat", dialect)
    if dialect.final is not None and response.status_code == 200 and not dialect.request.stream:
        await dialect.save()
    return response


@router.get(PATH + "/{response_id}")
async def retrieve_response(response_id: str, request: Request, state: StateDep) -> JSONResponse:
    """A stored response, as it was answered; 404 when unknown or created by another key."""
    owner = _owner(await state.auth.identify(request.headers.get("authorization")))
    row = await asyncio.to_thread(load_response, state.db, response_id, **owner)
    if row is None:
        raise not_found(response_id)
    return JSONResponse(row.response)


@router.delete(PATH + "/{response_id}")
async def remove_response(response_id: str, request: Request, state: StateDep) -> JSONResponse:
    """Delete a stored response: {"id", "object": "response", "deleted": true}; 404 when unknown or another key's."""
    owner = _owner(await state.auth.identify(request.headers.get("authorization")))
    if not await asyncio.to_thread(delete_response, state.db, response_id, **owner):
        raise not_found(response_id)
    return JSONResponse({"id": response_id, "object": "response", "deleted": True})
