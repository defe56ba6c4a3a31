"""The backend interface: one deployment of a model that answers OpenAI requests, and its errors.

A backend takes the validated OpenAI request as a dict (the gateway has already put the backend's own
model string in `body["model"]`) and returns the whole response dict, or yields chunk dicts. Backends
raise only `BackendError` and its subclasses, so the gateway can decide on fallbacks and retries
without knowing the provider:

    BackendTimeout      no first chunk within `first_token_timeout_s`, or the request passed `timeout_s`
    BackendUnavailable  connection refused or reset, including a stream that dies midway
    BackendError        anything else; a provider's 4xx keeps its status and OpenAI error object

A provider's error text can carry a secret (a key it echoes, an `api_base` with credentials): a backend
passes every error it maps from a provider through `BackendError.redacted(self.redactor)` (link/redact.py),
so what the gateway answers, logs and stores from it is already clean.

Backends are named in a registry (`kind` in the config) and built by `make_backend`, which imports a
backend's module (and its heavy dependencies: torch, litellm, openai) only when it is first used.
"""

from __future__ import annotations

import asyncio
import importlib
from abc import ABC, abstractmethod
from typing import Any, AsyncIterator, Awaitable, Literal, TypeVar

from link.config import ModelDeployment
from link.redact import Redactor

Endpoint = Literal["chat", "completion"]
T = TypeVar("T")


class BackendError(Exception):
    """A backend call that failed.

    Attributes:
        message: what went wrong, for the client and the request log.
        status_code: the HTTP status to answer with (a provider's 4xx is kept as is).
        retryable: whether another deployment may succeed (timeouts, connection errors, 429, 5xx).
        code: an OpenAI error code such as "context_length_exceeded", or None.
        error: the provider's OpenAI error object ({"message", "type", "param", "code"}) to pass through.
    """

    def __init__(self, message: str, *, status_code: int = 502, retryable: bool = False, code: str | None = None,
                 error: dict | None = None):
        super().__init__(message)
        self.message, self.status_code, self.retryable, self.code, self.error = message, status_code, retryable, code, error

    def to_openai(self) -> dict:
        """The OpenAI error object to send: the provider's own when there is one."""
        if self.error:
            return {"error": {"message": self.message, "type": "api_error", "param": None, "code": self.code, **self.error}}
        kind = "invalid_request_error" if 400 <= self.status_code < 500 else "api_error"
        return {"error": {"message": self.message, "type": kind, "param": None, "code": self.code}}

    def redacted(self, redactor: Redactor) -> BackendError:
        """This error with the secrets `redactor` finds replaced in its message (`str(self)` too) and in the
        provider's error object; changed in place, so its class and cause stay. Returns self."""
        self.message = redactor.redact(self.message)
        self.args = (self.message,)
        if self.error:
            self.error = redactor.redact_json(self.error)
        return self


class BackendTimeout(BackendError):
    """No first chunk within `first_token_timeout_s`, or no answer within `timeout_s`; retryable."""

    def __init__(self, message: str, *, code: str | None = "timeout"):
        super().__init__(message, status_code=504, retryable=True, code=code)


class BackendUnavailable(BackendError):
    """The deployment cannot be reached or dropped the connection; retryable."""

    def __init__(self, message: str, *, code: str | None = "backend_unavailable"):
        super().__init__(message, status_code=503, retryable=True, code=code)


def error_from_status(status_code: int, message: str, error: dict | None = None) -> BackendError:
    """A provider's HTTP error answer -> BackendError (408/429/5xx retryable; other 4xx not)."""
    retryable = status_code in (408, 429) or status_code >= 500
    code = error.get("code") if isinstance(error, dict) else None
    return BackendError(message, status_code=status_code, retryable=retryable, code=code if isinstance(code, str) else None,
                        error=error if isinstance(error, dict) and 400 <= status_code < 500 else None)


class Backend(ABC):
    """One deployment that answers OpenAI chat and completion requests.

    Subclasses implement `complete`, `stream` and `health`; `needs` names the shared resources
    `make_backend` passes to the constructor as keyword arguments (e.g. ("engine_pool",)).

    Attributes:
        redactor: what the provider errors are cleaned with (`BackendError.redacted`): by default the secrets of
            this deployment (its key, its URL's credentials); `make_backend` hands the gateway's, which knows them all.
    """

    needs: tuple[str, ...] = ()
    # A timeout says the deployment is overloaded, not broken, when its engine runs in this process: its
    # requests queue in the engine's scheduler and finish later, so ejecting it would only refuse requests.
    timeouts_mean_overload: bool = False

    def __init__(self, deployment: ModelDeployment):
        self.deployment = deployment
        self.redactor = Redactor.for_deployments([deployment])

    @abstractmethod
    async def complete(self, endpoint: Endpoint, body: dict) -> dict:
        """The whole OpenAI response dict, `usage` included.

        Raises:
            BackendTimeout: no answer within `deployment.timeout_s`.
            BackendUnavailable: the deployment cannot be reached.
            BackendError: any other failure (a provider 4xx keeps its status and error object).
        """

    @abstractmethod
    def stream(self, endpoint: Endpoint, body: dict) -> AsyncIterator[dict]:
        """Yield OpenAI chunk dicts; with `stream_options.include_usage` the last carries `usage`.

        Raises (while iterating): BackendTimeout when the first chunk takes longer than
        `first_token_timeout_s` or the stream longer than `timeout_s`; BackendUnavailable when the
        connection is refused or dies (also after some chunks); BackendError otherwise.
        """

    @abstractmethod
    async def health(self) -> bool:
        """True when the deployment can take requests; never raises."""

    async def aclose(self) -> None:
        """Release connections; the backend is not used afterwards."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.deployment.deployment_id or self.deployment.name})"


async def with_timeout(awaitable: Awaitable[T], deployment: ModelDeployment) -> T:
    """Await `awaitable` within `deployment.timeout_s`; raise BackendTimeout after it."""
    try:
        async with asyncio.timeout(deployment.timeout_s):
            return await awaitable
    except TimeoutError:
        raise BackendTimeout(f"{deployment.name}: no answer within {deployment.timeout_s:g} s") from None


async def guard_stream(chunks: AsyncIterator[dict], deployment: ModelDeployment) -> AsyncIterator[dict]:
    """Re-yield `chunks` under the deployment's first-chunk and whole-stream timeouts.

    Raises:
        BackendTimeout: no first chunk within `first_token_timeout_s`, or the stream outlived `timeout_s`.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + deployment.timeout_s
    num_chunks = 0
    try:
        while True:
            budget = deadline - loop.time()
            if num_chunks == 0:
                budget = min(budget, deployment.first_token_timeout_s)
            try:
                async with asyncio.timeout(max(budget, 0)):
                    chunk = await anext(chunks)
            except StopAsyncIteration:
                return
            except TimeoutError:
                if num_chunks == 0:
                    raise BackendTimeout(f"{deployment.name}: no first chunk within "
                                         f"{min(deployment.first_token_timeout_s, deployment.timeout_s):g} s") from None
                raise BackendTimeout(f"{deployment.name}: stream exceeded {deployment.timeout_s:g} s after "
                                     f"{num_chunks} chunks") from None
            num_chunks += 1
            yield chunk
    finally:
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            await aclose()


# kind -> "module:Class"; a module is imported only when a deployment of its kind is built.
BACKENDS: dict[str, str] = {
    "local": "link.backends.local:LocalBackend",
    "litellm": "link.backends.litellm_backend:LiteLLMBackend",
    "openai": "link.backends.openai_compat:OpenAICompatBackend",
}


def register_backend(kind: str, target: str) -> None:
    """Register a backend class by "module:Class" under `kind` (the config's `kind`)."""
    BACKENDS[kind] = target


def backend_class(kind: str) -> type[Backend]:
    """Import and return the backend class of `kind`. Raises ValueError for an unknown kind."""
    try:
        module_name, _, class_name = BACKENDS[kind].partition(":")
    except KeyError:
        raise ValueError(f"unknown backend kind {kind!r}; known: {', '.join(sorted(BACKENDS))}") from None
    return getattr(importlib.import_module(module_name), class_name)


def make_backend(deployment: ModelDeployment, *, redactor: Redactor | None = None, **resources: Any) -> Backend:
    """Build the backend for `deployment`, passing the shared resources its class `needs`.

    Args:
        deployment: one config entry.
        redactor: the gateway's (every configured secret), for the backend's errors; default: the deployment's own.
        resources: shared objects owned by the app, e.g. `engine_pool=EnginePool(...)` for kind local.
    Raises:
        ValueError: an unknown kind, or a needed resource that was not given.
    """
    cls = backend_class(deployment.kind)
    missing = [n for n in cls.needs if resources.get(n) is None]
    if missing:
        raise ValueError(f"{cls.__name__} for {deployment.name!r} needs {', '.join(missing)}")
    backend = cls(deployment, **{n: resources[n] for n in cls.needs})
    if redactor is not None:
        backend.redactor = redactor
    return backend
