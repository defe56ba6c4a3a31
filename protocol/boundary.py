"""The request boundary: what every request must satisfy before any route, FastAPI or pydantic reads it.

    app.add_middleware(RequestBoundary, limits=BodyLimits(max_body_bytes=16 * 2**20, max_json_depth=64))

Used by the engine server (`serving/api/server.py`) and the gateway (`link/app.py`, limits from its Settings).
An ASGI middleware, outside every route, so a route added later is covered too; its refusals are OpenAI error
objects, sent before authentication (they need no key, and reveal nothing but the limit):
- 413 `request_too_large`: a body over `max_body_bytes` (by its Content-Length, before reading it, or
  while reading a chunked body);
- 400 `json_too_deep`: a body whose arrays and objects nest deeper than `max_json_depth`
  (`protocol/json_depth.py`), counted on every body whatever its Content-Type (the gateway's routes read
  JSON whatever the header says; a form percent-encodes its brackets, so no form comes near the limit).
A body within the limits is read whole and handed to the app as one message; later `receive` calls go to the
server, so a disconnect still reaches the routes that wait for it (`protocol/disconnect.py`).

A server that must account for every request of some routes (the gateway logs one row per `/v1` request) names
them with `defer`: a refused request to such a route reaches the app with an empty body and the refusal in
`scope["state"][REFUSAL]` (`request.state`), for the route to answer it in its turn.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from protocol.errors import error_body
from protocol.json_depth import json_depth

# Python recurses once per level in json and in the walks over a parsed body (pydantic, deepcopy, our checks),
# two or three frames each, under a limit of 1,000 frames: past 128 levels the margin is gone.
MAX_JSON_DEPTH_CEILING = 128
# the `request.state` attribute holding a deferred refusal (RequestBoundary's `defer`)
REFUSAL = "body_refused"


@dataclass(frozen=True)
class BodyLimits:
    """Limits on a request body.

    Attributes:
        max_body_bytes: the largest body accepted, in bytes (default 16 MiB: room for an image as a base64 data
            URL in a chat message).
        max_json_depth: the deepest nesting of JSON arrays and objects accepted, in levels (default 64: a tool's
            parameters start 4 levels down in a chat body, so a JSON Schema 20 objects deep, 40 levels with their
            `properties`, fits). At most 128.
    Raises:
        ValueError: a limit below 1, or a depth over `MAX_JSON_DEPTH_CEILING`.
    """

    max_body_bytes: int = 16 * 2**20
    max_json_depth: int = 64

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be at least 1, got {self.max_body_bytes}")
        if not 1 <= self.max_json_depth <= MAX_JSON_DEPTH_CEILING:
            raise ValueError(f"max_json_depth must be in [1, {MAX_JSON_DEPTH_CEILING}], got {self.max_json_depth}")


class BodyRefused(Exception):
    """A request refused at the boundary: an OpenAI error with its status."""

    def __init__(self, status_code: int, message: str, code: str, param: str | None = None):
        super().__init__(message)
        self.status_code, self.message, self.code, self.param = status_code, message, code, param

    def response(self) -> JSONResponse:
        return JSONResponse(error_body(self.message, param=self.param, code=self.code), status_code=self.status_code)


def _too_large(limits: BodyLimits, size: str) -> BodyRefused:
    return BodyRefused(413, f"The request body is {size}, over this server's limit of {limits.max_body_bytes:,} bytes; "
                            "send a smaller body.", "request_too_large")


async def read_bounded_body(scope: Scope, receive: Receive, limits: BodyLimits) -> bytes | None:
    """The whole body of an HTTP request within `limits`, or None when the client left while sending it.

    Raises:
        BodyRefused: 413 over `max_body_bytes` (the rest of the body is left unread: the server closes the
            connection after the answer), 400 nested deeper than `max_json_depth`.
    """
    declared = dict(scope["headers"]).get(b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > limits.max_body_bytes:
        raise _too_large(limits, f"{int(declared):,} bytes")
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limits.max_body_bytes:
            raise _too_large(limits, f"more than {limits.max_body_bytes:,} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    body = b"".join(chunks)
    if body and json_depth(body, limits.max_json_depth) > limits.max_json_depth:
        raise BodyRefused(400, f"The JSON body nests arrays and objects more than {limits.max_json_depth} levels deep, "
                               "this server's limit; send a flatter body.", "json_too_deep")
    return body


class RequestBoundary:
    """ASGI middleware applying `read_bounded_body` to every HTTP request (module docstring).

    Args:
        app: the application it guards. limits: the body limits (default `BodyLimits()`).
        defer: scope -> whether the app answers a refusal of this request itself (module docstring); None: never.
    """

    def __init__(self, app: ASGIApp, limits: BodyLimits = BodyLimits(), defer: Callable[[Scope], bool] | None = None):
        self.app, self.limits, self.defer = app, limits, defer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            body = await read_bounded_body(scope, receive, self.limits)
        except BodyRefused as refused:
            if self.defer is None or not self.defer(scope):
                await refused.response()(scope, receive, send)
                return
            scope.setdefault("state", {})[REFUSAL] = refused
            body = b""
        if body is None:
            return  # the client left before its request was complete: nobody to answer
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if delivered:
                return await receive()
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)
