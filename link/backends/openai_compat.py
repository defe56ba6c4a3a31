"""`OpenAICompatBackend`: an OpenAI-compatible server (`link engine serve`, vLLM, SGLang) via the `openai` client.

The body goes out as is and the answer comes back as plain dicts (`cast_to=object`: no response
models are built, which keeps the gateway's per-request overhead low). Each deployment owns one
client and so one HTTP connection pool of `max_connections`. The client never retries
(`max_retries=0`): retries and fallbacks are the gateway's decision.
"""

from __future__ import annotations

import os
from typing import AsyncIterator

import openai

try:  # the HTTP library of the installed `openai` client: httpx2 (openai >= 3) or httpx before it
    import httpx2
except ImportError:  # pragma: no cover
    import httpx as httpx2

from link.backends.base import (Backend, BackendError, BackendTimeout, BackendUnavailable, Endpoint, error_from_status,
                                guard_stream, with_timeout)
from link.config import ModelDeployment

PATHS = {"chat": "/chat/completions", "completion": "/completions"}
HEALTH_TIMEOUT_S = 5.0


def map_openai_error(exc: Exception, deployment: ModelDeployment, num_chunks: int = 0) -> BackendError:
    """An `openai` (or LiteLLM, whose errors subclass them) exception -> our BackendError.

    Timeouts -> BackendTimeout; connection errors, and any non-4xx failure of a stream that already
    yielded `num_chunks` > 0 chunks -> BackendUnavailable; HTTP errors keep their status and error object.
    The texts are the provider's and the api_base as configured: callers redact the result (`BackendError.redacted`).
    """
    name = deployment.name
    chain = _chain(exc)  # LiteLLM wraps a refused connection in a "500" whose cause is the connection error
    if any(isinstance(e, openai.APITimeoutError) for e in chain):
        return BackendTimeout(f"{name}: timed out ({exc})")
    status = getattr(exc, "status_code", None)
    if status is None or any(isinstance(e, (openai.APIConnectionError, ConnectionError)) for e in chain):
        cause = chain[-1]
        if num_chunks:
            return BackendUnavailable(f"{name}: the stream died after {num_chunks} chunks ({cause})")
        return BackendUnavailable(f"{name}: connection to {deployment.api_base or 'the provider'} failed ({cause})")
    body = getattr(exc, "body", None)
    error = body if isinstance(body, dict) and "message" in body else None
    message = (error or {}).get("message") or getattr(exc, "message", None) or str(exc)
    if num_chunks and not 400 <= status < 500:
        return BackendUnavailable(f"{name}: the stream failed after {num_chunks} chunks ({message})")
    return error_from_status(status, f"{name}: {message}" if status >= 500 else message, error)


def _chain(exc: BaseException) -> list[BaseException]:
    """`exc` and its causes/contexts, outermost first."""
    chain: list[BaseException] = []
    while exc is not None and exc not in chain:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    return chain


def api_key(deployment: ModelDeployment) -> str | None:
    """The key from the environment variable `deployment.api_key_env` (None when no variable is named).

    Raises:
        BackendError: the variable is named but not set (status 500, retryable: another deployment may work).
    """
    if deployment.api_key_env is None:
        return None
    key = os.environ.get(deployment.api_key_env)
    if not key:
        raise BackendError(f"{deployment.name}: the environment variable {deployment.api_key_env} (its API key) is not set",
                           status_code=500, retryable=True, code="missing_api_key")
    return key


class OpenAICompatBackend(Backend):
    """One OpenAI-compatible endpoint at `deployment.api_base` (e.g. "http://127.0.0.1:8001/v1")."""

    def __init__(self, deployment: ModelDeployment):
        super().__init__(deployment)
        limits = httpx2.Limits(max_connections=deployment.max_connections, max_keepalive_connections=deployment.max_connections)
        timeout = httpx2.Timeout(deployment.timeout_s, connect=min(5.0, deployment.timeout_s))
        self._http = openai.DefaultAsyncHttpxClient(limits=limits, timeout=timeout)
        key = os.environ.get(deployment.api_key_env) if deployment.api_key_env else None
        self._client = openai.AsyncOpenAI(base_url=deployment.api_base, api_key=key or "unused", max_retries=0,
                                          timeout=timeout, http_client=self._http)

    async def complete(self, endpoint: Endpoint, body: dict) -> dict:
        """POST the body (stream off) and return the response dict. Raises BackendError (see `Backend`)."""
        api_key(self.deployment)
        body = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
        try:
            return await with_timeout(self._client.post(PATHS[endpoint], body=body, cast_to=object), self.deployment)
        except openai.APIError as exc:
            raise map_openai_error(exc, self.deployment).redacted(self.redactor) from exc

    async def stream(self, endpoint: Endpoint, body: dict) -> AsyncIterator[dict]:
        """Yield the server's chunk dicts under the deployment's timeouts. Raises BackendError (see `Backend`)."""
        api_key(self.deployment)
        async for chunk in guard_stream(self._chunks(endpoint, {**body, "stream": True}), self.deployment):
            yield chunk

    async def _chunks(self, endpoint: Endpoint, body: dict) -> AsyncIterator[dict]:
        num_chunks = 0
        try:
            events = await self._client.post(PATHS[endpoint], body=body, cast_to=object, stream=True,
                                             stream_cls=openai.AsyncStream[object])
            async with events:
                async for chunk in events:
                    num_chunks += 1
                    yield chunk
        except openai.APIError as exc:
            raise map_openai_error(exc, self.deployment, num_chunks).redacted(self.redactor) from exc

    async def health(self) -> bool:
        """GET {root}/health (root = api_base without /v1); a server without it: GET {api_base}/models."""
        base = self.deployment.api_base.rstrip("/")
        root = base[: -len("/v1")] if base.endswith("/v1") else base
        headers = {"Authorization": f"Bearer {self._client.api_key}"}
        try:
            response = await self._http.get(root + "/health", timeout=HEALTH_TIMEOUT_S)
            if response.status_code == 404:
                response = await self._http.get(base + "/models", headers=headers, timeout=HEALTH_TIMEOUT_S)
            return response.status_code == 200
        except (httpx2.HTTPError, OSError):
            return False

    async def aclose(self) -> None:
        await self._client.close()
