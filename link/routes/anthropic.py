"""Anthropic's Messages API: POST /v1/messages, over the same pipeline as /v1/chat/completions.

    client = anthropic.Anthropic(base_url="http://127.0.0.1:8000", api_key="sk-...")   # x-api-key
    client.messages.create(model="link/moa", max_tokens=256, messages=[{"role": "user", "content": "Hi"}])

A request takes `handle`'s steps (link/routes/openai.py: key, rate limit, body, policy, budget, backends,
accounting and its request-log row) through `MessagesDialect`, which:
- reads the key from `x-api-key` (else `Authorization: Bearer`); `anthropic-beta` is ignored;
- requires `anthropic-version` (any value: one wire format is served), as Anthropic does: without it a 400
  "anthropic-version: header is required";
- validates the body against the Messages schema and translates it into an OpenAI chat request
  (protocol/anthropic.py: what is taken, what is refused, how each field maps); then, once the policy named
  the candidates, drops `top_k` unless every candidate takes it (our engine, local or behind `kind: openai`,
  and vLLM do; a LiteLLM provider may not) and refuses `image` blocks when a candidate runs on the local engine
  (it reads text only); a remote backend gets them as `image_url` parts and answers for itself;
- writes the answer back as a Message (`id` "msg_" + the x-link-request-id), a stream as Anthropic's events
  (the gateway's keep-alives become `ping` events; a failure after the first byte ends it with an `error`
  event), and every error as Anthropic's error object, its type from the HTTP status (`Retry-After` kept).
The request-log row records `decision.endpoint` "/v1/messages" and the translated (OpenAI) body's `user`
(`metadata.user_id`).
"""

from __future__ import annotations

import json
from typing import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import Response

from link.accounting import RequestRecord
from link.backends import BackendError
from link.config import ModelDeployment
from link.deps import StateDep
from link.routes.openai import Dialect, handle
from link.schemas import OpenAIError
from protocol.anthropic import (MessagesProblem, MessagesRequest, MessageStream, error_object, event,
                                parse_messages_request, to_chat_request, to_message)
from protocol.openapi_body import json_body

router = APIRouter()
PATH = "/v1/messages"
# the routes whose every request gets a request-log row, refusals by the request boundary included
LOGGED_PATHS = (PATH,)
# deployment kinds whose servers take vLLM's `top_k` (our engine in process or behind its OpenAI server, vLLM)
TOP_K_KINDS = ("local", "openai")


def _invalid(message: str, param: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, param=param, log_status="invalid_request")


class MessagesDialect(Dialect):
    """One Messages request's translation (module docstring); holds the parsed request, so one per request."""

    path = PATH

    def __init__(self) -> None:
        self.request: MessagesRequest | None = None

    def authorization(self, request: Request) -> str | None:
        key = request.headers.get("x-api-key")
        return f"Bearer {key}" if key else request.headers.get("authorization")

    def to_openai(self, request: Request, body: dict) -> dict:
        if not request.headers.get("anthropic-version"):
            raise _invalid("anthropic-version: header is required", "anthropic-version")
        try:
            self.request = parse_messages_request(body)
            return to_chat_request(self.request)
        except MessagesProblem as exc:
            raise _invalid(exc.message, exc.param) from None

    def for_candidates(self, body: dict, deployments: list[ModelDeployment]) -> dict:
        if "top_k" in body and any(d.kind not in TOP_K_KINDS for d in deployments):
            body = {k: v for k, v in body.items() if k != "top_k"}
        local = next((d for d in deployments if d.kind == "local"), None)
        if local is not None:
            for i, message in enumerate(body["messages"]):
                parts = message.get("content") if isinstance(message.get("content"), list) else []
                if any(p.get("type") == "image_url" for p in parts):
                    raise _invalid(f"messages: image blocks are not supported by model {local.name!r}: it runs on the "
                                   "local engine, which reads text only; send text, or name a model whose backend "
                                   "takes images", "messages")
        return body

    def answer(self, response: dict, record: RequestRecord) -> dict:
        try:
            return to_message(response, message_id=f"msg_{record.request_id}",
                              stop_sequences=self.request.stop_sequences if self.request else None)
        except ValueError as exc:
            raise BackendError(f"{record.model}: {exc}", status_code=502) from None

    def frames(self, frames: AsyncIterator[bytes], record: RequestRecord) -> AsyncIterator[bytes]:
        stream = MessageStream(f"msg_{record.request_id}", record.model or "",
                               stop_sequences=self.request.stop_sequences if self.request else None)
        return _events(frames, stream)

    def error(self, status_code: int, body: dict) -> dict:
        error = body.get("error") if isinstance(body.get("error"), dict) else {}
        return error_object(status_code, str(error.get("message") or "error"))


async def _events(frames: AsyncIterator[bytes], stream: MessageStream) -> AsyncIterator[bytes]:
    """The OpenAI SSE `frames` (one event each: a chunk, an error object, `[DONE]` or a keep-alive comment) as
    Anthropic's events; closing this closes `frames` (which ends the request's accounting)."""
    try:
        async for data in frames:
            text = data.decode()
            if not text.startswith("data: "):
                yield event("ping", {"type": "ping"})  # a keep-alive comment while a plan's calls run
                continue
            payload = text.removeprefix("data: ").strip()
            if payload == "[DONE]":
                for out in stream.finish():
                    yield out
                return
            chunk = json.loads(payload)
            if "error" in chunk:  # the stream failed after its first byte: one error event ends it
                error = chunk["error"] if isinstance(chunk["error"], dict) else {}
                status = 400 if error.get("type") == "invalid_request_error" else 500
                for out in stream.error(status, str(error.get("message") or "the stream failed")):
                    yield out
                return
            for out in stream.feed(chunk):
                yield out
    finally:
        await frames.aclose()


@router.post(PATH, openapi_extra=json_body(MessagesRequest))
async def messages(request: Request, state: StateDep) -> Response:
    """Anthropic Messages (whole or streamed)."""
    return await handle(request, state, "chat", MessagesDialect())
