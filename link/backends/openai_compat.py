"""`OpenAICompatBackend`: an OpenAI-compatible server (`link engine serve`, vLLM, SGLang) over aiohttp.

The body goes out as is and the answer comes back as plain dicts (no response models are built, which keeps
the gateway's per-request overhead low; link/backends/openai_http.py). Each deployment owns one session and so
one HTTP connection pool of `max_connections`. Nothing is retried here: retries and fallbacks are the
gateway's decision. `map_openai_error` maps the `openai` client's exceptions, which LiteLLM's subclass, for
link/backends/litellm_backend.py.
"""

from __future__ import annotations

import os
from typing import AsyncIterator

import openai

from link.backends.base import (Backend, BackendError, BackendTimeout, BackendUnavailable, Endpoint, error_from_status,
                                guard_stream, with_timeout)
from link.backends.openai_http import OpenAIHTTP
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
    """One OpenAI-compatible endpoint at `deployment.api_base` (e.g. "http://127.0.0.1:8001/v1"), over aiohttp
    (link/backends/openai_http.py); the `openai` client is not used on this path."""

    def __init__(self, deployment: ModelDeployment):
        super().__init__(deployment)
        key = os.environ.get(deployment.api_key_env) if deployment.api_key_env else None
        self._http = OpenAIHTTP(deployment, key)

    async def complete(self, endpoint: Endpoint, body: dict) -> dict:
        """POST the body (stream off) and return the response dict. Raises BackendError (see `Backend`)."""
        api_key(self.deployment)
        body = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
        try:
            return await with_timeout(self._http.post_json(PATHS[endpoint], body), self.deployment)
        except BackendError as exc:
            raise exc.redacted(self.redactor) from exc.__cause__

    async def stream(self, endpoint: Endpoint, body: dict) -> AsyncIterator[dict]:
        """Yield the server's chunk dicts under the deployment's timeouts. Raises BackendError (see `Backend`)."""
        api_key(self.deployment)
        try:
            async for chunk in guard_stream(self._http.post_sse(PATHS[endpoint], {**body, "stream": True}), self.deployment):
                yield chunk
        except BackendError as exc:
            raise exc.redacted(self.redactor) from exc.__cause__

    async def health(self) -> bool:
        """GET {root}/health (root = api_base without /v1); a server without it: GET {api_base}/models."""
        base = self._http.base  # without credentials: those go in the Authorization header
        root = base[: -len("/v1")] if base.endswith("/v1") else base
        status = await self._http.get_status(root + "/health", HEALTH_TIMEOUT_S)
        if status == 404:
            status = await self._http.get_status(base + "/models", HEALTH_TIMEOUT_S)
        return status == 200

    async def aclose(self) -> None:
        await self._http.aclose()
