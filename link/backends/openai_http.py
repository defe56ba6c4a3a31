"""The HTTP side of `OpenAICompatBackend`: one aiohttp session per deployment, OpenAI's JSON and SSE on the wire.

    client = OpenAIHTTP(deployment)                       # a pool of `max_connections` keep-alive connections
    answer = await client.post_json("/chat/completions", body)
    async for chunk in client.post_sse("/chat/completions", {**body, "stream": True}): ...
    await client.aclose()

Why not the `openai` client: it builds request and response models, retries and auth hooks per call, which cost
the gateway about 0.5 ms of CPU per request over httpx; here a request is one aiohttp call whose body is
serialized once, and an SSE stream is parsed from the bytes of each network read (every complete event in a
read, then the next read), which is what the gateway relays; before each chunk it says how many more are already
parsed (`protocol.sse.READY_AHEAD`), so the relay can write them to the client in one send. Format: the OpenAI API reference's chat and
completions endpoints; SSE framing per the WHATWG HTML standard, section 9.2 (events end at a blank line; `data:`
lines of one event are joined with "\\n"; lines starting with ":" are comments; CR LF and CR also end lines).

Errors are mapped as the `openai` client's errors were (link/backends/openai_compat.py's `map_openai_error`):
a refused or dropped connection -> BackendUnavailable; an HTTP error answer -> its status and the provider's error
object (`{"error": {...}}` unwrapped); an error object inside a stream -> BackendUnavailable after chunks were
yielded, else a BackendError of status 502. Timeouts are the caller's (`with_timeout`, `guard_stream`); the
session only bounds connecting.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any, AsyncIterator

import aiohttp
from yarl import URL

from link.backends.base import BackendError, BackendUnavailable, error_from_status
from link.config import ModelDeployment
from protocol.fast_json import dumps, loads_lenient
from protocol.sse import READY_AHEAD

CONNECT_TIMEOUT_S = 5.0
JSON_HEADERS = {"Content-Type": "application/json", "Accept": "application/json"}
SSE_HEADERS = {"Content-Type": "application/json", "Accept": "text/event-stream"}


class SSEParser:
    """Incremental SSE parser: `feed(bytes)` -> the `data` payloads of the events completed by those bytes.

    An event's `data:` lines are joined with "\\n"; other fields (`event:`, `id:`, `retry:`) and comment lines are
    skipped, as OpenAI sends none that matter; a trailing partial event waits for the next `feed`.
    """

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[bytes]:
        buffer = self._buffer + data
        if b"\r" in buffer:
            buffer = buffer.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        *events, self._buffer = buffer.split(b"\n\n")
        payloads = []
        for event in events:
            lines = [line[5:] for line in event.split(b"\n") if line.startswith(b"data:")]
            if lines:
                payloads.append(b"\n".join(line[1:] if line[:1] == b" " else line for line in lines))
        return payloads


def status_error(deployment: ModelDeployment, status: int, text: str) -> BackendError:
    """An HTTP error answer -> BackendError: the provider's error object (unwrapped from `{"error": ...}`) and its
    message when the body is one, else "Error code: <status> - <body>"; 5xx messages name the deployment."""
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    data = body.get("error", body) if isinstance(body, dict) else body
    error = data if isinstance(data, dict) and "message" in data else None
    message = (error or {}).get("message") or f"Error code: {status} - {text.strip()[:2000]}"
    name = deployment.name
    return error_from_status(status, f"{name}: {message}" if status >= 500 else message, error)


class OpenAIHTTP:
    """POST JSON to `deployment.api_base` + a path and read the answer, whole or as SSE chunk dicts.

    Args:
        deployment: its `api_base` ("http://host:port/v1"), `max_connections` (the pool's size).
        api_key: sent as `Authorization: Bearer <key>` ("unused" when None, as the `openai` client would send);
            an `api_base` with credentials ("http://user:pass@host/v1") sends them as Basic auth instead.
    """

    def __init__(self, deployment: ModelDeployment, api_key: str | None) -> None:
        self.deployment = deployment
        url = URL(deployment.api_base.rstrip("/"))
        self.base = str(url.with_user(None)) if url.user is not None else str(url)
        if url.user is not None:  # credentials in the URL are sent as Basic auth instead of the key, as httpx does
            self.auth = {"Authorization": aiohttp.BasicAuth(url.user, url.password or "").encode()}
        else:
            self.auth = {"Authorization": f"Bearer {api_key or 'unused'}"}
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _drop_session(self) -> None:
        session, self._session = self._session, None
        if session is not None and not session.closed:
            connector = session.connector
            session.detach()  # its connections belong to another loop: close their sockets without awaiting it
            if connector is not None:
                with contextlib.suppress(Exception):
                    connector._close()

    @property
    def session(self) -> aiohttp.ClientSession:
        """The deployment's session, made on first use inside the running event loop (again in a new loop: a script
        or test that runs each call under its own `asyncio.run`; the old loop's connections are dropped)."""
        loop = asyncio.get_running_loop()
        if self._session is not None and self._loop is not loop:
            self._drop_session()
        if self._session is None or self._session.closed:
            self._loop = loop
            connector = aiohttp.TCPConnector(limit=self.deployment.max_connections, ttl_dns_cache=300)
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=min(CONNECT_TIMEOUT_S, self.deployment.timeout_s))
            self._session = aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=True,
                                                  skip_auto_headers=("User-Agent",))
        return self._session

    def _unavailable(self, exc: BaseException, num_chunks: int = 0) -> BackendUnavailable:
        if num_chunks:
            return BackendUnavailable(f"{self.deployment.name}: the stream died after {num_chunks} chunks ({exc})")
        return BackendUnavailable(f"{self.deployment.name}: connection to {self.deployment.api_base} failed ({exc})")

    async def post_json(self, path: str, body: dict, headers: dict[str, str] | None = None) -> dict:
        """The answer's JSON object.

        Raises:
            BackendUnavailable: the connection was refused or dropped.
            BackendError: an HTTP error status (the provider's error object kept), or an answer that is not JSON.
        """
        try:
            async with self.session.post(self.base + path, data=dumps(body), headers={**JSON_HEADERS, **self.auth, **(headers or {})}) as response:
                raw = await response.read()
                if response.status >= 400:
                    raise status_error(self.deployment, response.status, raw.decode("utf-8", "replace"))
        except (aiohttp.ClientError, OSError) as exc:
            raise self._unavailable(exc) from exc
        try:
            return loads_lenient(raw)
        except ValueError:
            raise BackendError(f"{self.deployment.name}: the answer is not JSON: {raw[:200]!r}") from None

    async def post_sse(self, path: str, body: dict, headers: dict[str, str] | None = None) -> AsyncIterator[dict]:
        """Yield the stream's chunk objects until `data: [DONE]` or the end of the body.

        Raises (while iterating):
            BackendUnavailable: the connection was refused, or dropped (also after chunks).
            BackendError: an HTTP error status at the start; an error object in the stream (502 before any chunk).
        """
        num_chunks = 0
        parser = SSEParser()
        try:
            async with self.session.post(self.base + path, data=dumps(body), headers={**SSE_HEADERS, **self.auth, **(headers or {})}) as response:
                if response.status >= 400:
                    text = (await response.read()).decode("utf-8", "replace")
                    raise status_error(self.deployment, response.status, text)
                async for data in response.content.iter_any():
                    payloads = parser.feed(data)
                    for index, payload in enumerate(payloads):
                        if payload.startswith(b"[DONE]"):
                            return
                        chunk = loads_lenient(payload)
                        if isinstance(chunk, dict) and chunk.get("error") and "choices" not in chunk:
                            raise self._stream_error(chunk["error"], num_chunks)
                        num_chunks += 1
                        READY_AHEAD.set(len(payloads) - 1 - index)
                        yield chunk
                    READY_AHEAD.set(0)
        except (aiohttp.ClientError, OSError) as exc:
            raise self._unavailable(exc, num_chunks) from exc
        except ValueError as exc:
            raise BackendUnavailable(f"{self.deployment.name}: the stream sent an event that is not JSON ({exc})") from exc
        finally:
            READY_AHEAD.set(0)

    def _stream_error(self, error: Any, num_chunks: int) -> BackendError:
        message = error.get("message") if isinstance(error, dict) else str(error)
        if num_chunks:
            return BackendUnavailable(f"{self.deployment.name}: the stream failed after {num_chunks} chunks ({message})")
        return BackendError(f"{self.deployment.name}: {message}", status_code=502, retryable=True,
                            error=None)

    async def get_status(self, url: str, timeout_s: float) -> int | None:
        """GET `url` with this client's key; its status, or None when it could not be reached in `timeout_s`."""
        try:
            async with self.session.get(url, headers=self.auth, timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:
                return response.status
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
            return None

    async def aclose(self) -> None:
        """Close the session and its connections."""
        if self._session is not None and not self._session.closed:
            await self._session.close()
