"""`target_error`: an `openai` (or `httpx`) client error as a `TargetError`, shared by the gateway and LiteLLM targets.

    raise target_error(exc) from exc     # retryable: timeouts, connection errors, 429 and 5xx

A connection error names the URL and the reason ("cannot reach http://127.0.0.1:8000/v1/chat/completions:
connection refused"), so a run against a server that is not up says so.
"""

from __future__ import annotations

import socket

import httpx
import openai

from evals.targets import TargetError


def connection_reason(exc: BaseException) -> str:
    """Why a connection failed, from the exception chain: "connection refused", "unknown host", "timed out",
    else the innermost message."""
    reason, seen = str(exc), set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, ConnectionRefusedError):
            return "connection refused"
        if isinstance(exc, socket.gaierror):
            return "unknown host"
        if isinstance(exc, (TimeoutError, httpx.TimeoutException, openai.APITimeoutError)):
            return "timed out"
        if str(exc):
            reason = str(exc)
        exc = exc.__cause__ or exc.__context__
    return reason


def _request_url(exc: Exception) -> str | None:
    try:
        return str(exc.request.url)  # openai and httpx errors carry the request
    except (AttributeError, RuntimeError):
        return None


def target_error(exc: Exception) -> TargetError:
    """Map an `openai` client error to `TargetError`: retryable for timeouts, connection errors, 429 and 5xx.
    A connection error names the URL and the reason ("cannot reach http://...: connection refused")."""
    if isinstance(exc, TargetError):
        return exc
    if isinstance(exc, (openai.APITimeoutError, httpx.TimeoutException)):
        return TargetError(f"{type(exc).__name__}: {exc}", retryable=True)
    if isinstance(exc, (openai.APIConnectionError, httpx.TransportError)):
        reason = connection_reason(exc)
        return TargetError(f"cannot reach {_request_url(exc) or 'the server'}: {reason}", retryable=True, reason=reason)
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        return TargetError(f"HTTP {status}: {exc.message}", retryable=status == 429 or status >= 500, status=status)
    return TargetError(f"{type(exc).__name__}: {exc}", retryable=False)
