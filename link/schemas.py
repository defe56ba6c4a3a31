"""The OpenAI schemas the gateway speaks: requests (reused from `protocol/openai.py`), errors, model cards.

The gateway accepts every field of OpenAI's Chat Completions and Completions request schemas (tools,
tool_choice, parallel_tool_calls, response_format, user, metadata, store, service_tier, prediction,
reasoning_effort, modalities, audio, web_search_options, the legacy functions/function_call, logprobs,
stream_options, n, stop, seed, max_tokens/max_completion_tokens) and vLLM's sampling extensions, and
passes them to the backend untouched; a field outside that schema is a 400 ("Unrecognized request
argument supplied: foo"), as with OpenAI, at the top level and inside messages, content parts, tools,
tool_choice, response_format and stream_options (`protocol/chat_fields.py`). As OpenAI does, it also
refuses `tool_choice` or `parallel_tool_calls` without `tools`, an empty `tools`, a tool or JSON-schema
name outside `^[a-zA-Z0-9_-]{1,64}$`, and `max_tokens` together with `max_completion_tokens`. A local
model refuses what it cannot honour (audio, web search, legacy functions, image/audio/file parts) with a
400 naming the field or the content part. Every failure answers with OpenAI's error object
`{"error": {"message", "type", "param", "code"}}`, `param` being the client's field path (`stop`,
`messages[0].content`). Every body is read as strict JSON (`parse_json_object`, shared with the engine
server): a NaN, a NUL character or a lone UTF-16 surrogate anywhere, free text included, is a 400 naming
its field, so nothing is served that its request-log row could not record.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from protocol import strict_json
from protocol.errors import ValidationProblem, describe_errors, error_body
from protocol.openai import ChatCompletionRequest, CompletionRequest

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


def invalid_body(exc: ValidationError) -> OpenAIError:
    """A pydantic error -> 400 naming the client's field ("messages[0].content", "stop", "stream_options")."""
    message, param = describe_errors(exc.errors())
    return OpenAIError(400, message, param=param, log_status="invalid_request")


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """A request body that must be one JSON object of values every later step can carry (UTF-8; finite numbers;
    no NUL and no lone surrogate in any string or key: protocol/strict_json.py says why).

    Raises:
        OpenAIError: 400 naming the position of a JSON syntax error, saying the body is not an object, or naming
            the field of a non-finite number, a NUL or a lone surrogate.
    """
    try:
        return strict_json.parse_json_object(raw)
    except ValidationProblem as exc:
        raise OpenAIError(exc.status_code, exc.message, param=exc.param, code=exc.code,
                          log_status="invalid_request") from None


def parse_body(raw: bytes, schema: type[BaseModel], what: str) -> BaseModel:
    """A management API body: one JSON object with only `schema`'s fields, validated against it.

    Args:
        raw: the request body. what: the resource in the message of an unknown field ("a policy").
    Raises:
        OpenAIError: 400 for a body that is not a JSON object, a field `schema` does not have (named in `param`)
            or a field of the wrong type.
    """
    body = parse_json_object(raw)
    unknown = [k for k in body if k not in schema.model_fields]
    if unknown:
        known = ", ".join(schema.model_fields)
        raise OpenAIError(400, f"Unrecognized request argument{'s' if len(unknown) > 1 else ''} supplied: "
                          f"{', '.join(unknown)} ({what} has {known})", param=unknown[0])
    try:
        return schema.model_validate(body)
    except ValidationError as exc:
        raise invalid_body(exc) from None


def validate_request(body: dict[str, Any], endpoint: str) -> BaseModel:
    """The validated request of `endpoint` ("chat" or "completion"). Raises OpenAIError: 400 naming the field."""
    try:
        return REQUEST_SCHEMAS[endpoint].model_validate(body)
    except ValidationError as exc:
        raise invalid_body(exc) from None


def parse_request(raw: bytes, endpoint: str) -> tuple[dict[str, Any], BaseModel]:
    """Parse and validate a request body; returns (the JSON dict as sent, the validated model).

    Raises:
        OpenAIError: 400 for JSON that does not parse, is not an object, or fails the schema (naming the field).
    """
    body = parse_json_object(raw)
    return body, validate_request(body, endpoint)


def model_not_found(name: str, known: list[str]) -> OpenAIError:
    return OpenAIError(404, f"The model `{name}` does not exist; models and policies served here: {', '.join(known)}",
                       param="model", code="model_not_found", log_status="invalid_request")


def model_card(name: str, created: int, *, owned_by: str, link: dict[str, Any], max_model_len: int | None = None) -> dict:
    """One entry of GET /v1/models; `link` carries our details (kind, replicas, policy type and models).

    `max_model_len` (tokens of prompt plus output, vLLM's field; models only) is left out when unknown.
    """
    card = {"id": name, "object": "model", "created": created, "owned_by": owned_by, "link": link}
    if max_model_len is not None:
        card["max_model_len"] = max_model_len
    return card
