"""The OpenAI schemas the gateway speaks: requests (reused from `serving/api/protocol.py`), errors, model cards.

The gateway accepts the full request schema of Chat Completions and Completions (tools, tool_choice,
parallel_tool_calls, response_format, user, metadata, logprobs/top_logprobs, stream_options, n, stop,
seed, max_tokens/max_completion_tokens and vLLM's sampling extensions); fields it does not know pass
through to the backend untouched. Every failure answers with OpenAI's error object
`{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ValidationError

from serving.api.protocol import ChatCompletionRequest, CompletionRequest, error_body

REQUEST_SCHEMAS: dict[str, type[BaseModel]] = {"chat": ChatCompletionRequest, "completion": CompletionRequest}


class OpenAIError(Exception):
    """A failure answered as an OpenAI error object.

    Args:
        status_code: HTTP status (400 invalid body, 401 no key, 404 unknown model, 429 limits, 5xx backends).
        message: for the client.
        type_: OpenAI error type ("invalid_request_error", "authentication_error", "insufficient_quota", ...).
        param: the request field at fault, if any.
        code: OpenAI error code ("model_not_found", "rate_limit_exceeded", ...).
        headers: extra response headers (e.g. Retry-After).
        log_status: the request log's status for it (see link.db.models.REQUEST_STATUSES).
        body: a complete error object to send instead (a provider's own).
    """

    def __init__(self, status_code: int, message: str, *, type_: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None, log_status: str = "error",
                 body: dict | None = None):
        super().__init__(message)
        self.status_code, self.message, self.type, self.param, self.code = status_code, message, type_, param, code
        self.headers = headers or {}
        self.log_status = log_status
        self._body = body

    def body(self) -> dict:
        return self._body or error_body(self.message, self.type, self.param, self.code)


def invalid_body(exc: ValidationError, prefix_loc: int = 0) -> OpenAIError:
    """A pydantic error -> 400 naming the first offending field ("messages", "n", "stream_options.include_usage")."""
    first = exc.errors()[0] if exc.errors() else {}
    loc = [str(p) for p in first.get("loc", ())[prefix_loc:]]
    param = ".".join(loc) or None
    message = first.get("msg", "invalid request").removeprefix("Value error, ")
    return OpenAIError(400, f"{param or 'body'}: {message}", param=param, log_status="invalid_request")


def parse_request(raw: bytes, endpoint: str) -> tuple[dict[str, Any], BaseModel]:
    """Parse and validate a request body; returns (the JSON dict as sent, the validated model).

    Raises:
        OpenAIError: 400 for JSON that does not parse, is not an object, or fails the schema (naming the field).
    """
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise OpenAIError(400, f"the request body is not valid JSON: {exc}", log_status="invalid_request") from None
    if not isinstance(body, dict):
        raise OpenAIError(400, "the request body must be a JSON object", log_status="invalid_request")
    try:
        return body, REQUEST_SCHEMAS[endpoint].model_validate(body)
    except ValidationError as exc:
        raise invalid_body(exc) from None


def model_not_found(name: str, known: list[str]) -> OpenAIError:
    return OpenAIError(404, f"The model `{name}` does not exist; models and policies served here: {', '.join(known)}",
                       param="model", code="model_not_found", log_status="invalid_request")


def model_card(name: str, created: int, *, owned_by: str, link: dict[str, Any]) -> dict:
    """One entry of GET /v1/models; `link` carries our details (kind, replicas, policy type and models)."""
    return {"id": name, "object": "model", "created": created, "owned_by": owned_by, "link": link}
