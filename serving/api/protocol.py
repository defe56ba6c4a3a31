"""OpenAI request schemas (Chat Completions and legacy Completions) and the error object.

Field names, defaults and ranges follow the OpenAI API reference; vLLM's extra sampling fields
(`top_k`, `min_p`, `repetition_penalty`, `ignore_eos`, `stop_token_ids`, `min_tokens`) are accepted
too. As with OpenAI, a field the reference does not list is a 400 ("Unrecognized request argument
supplied: foo"), at the top level and inside messages, content parts, tools, tool_choice,
response_format and stream_options (`serving/api/chat_fields.py`); types are strict ("n": "2" or
"max_tokens": 5.0 is a 400 naming the field; a float field still takes an integer), `seed` is a signed
64-bit integer and a `logit_bias` key a token id up to 2**31 - 1 (what every backend takes), every message needs
a role and its content (an assistant message may omit content when it has tool calls), `stream_options`
needs `stream: true`, `tool_choice` needs `tools`, and `max_tokens` with `max_completion_tokens` is a
400 (OpenAI: "Setting 'max_tokens' and 'max_completion_tokens' at the same time is not supported.",
param `max_tokens`). Fields that a local model cannot honour but a provider behind the gateway may
(`audio`, `web_search_options`, image parts, ...) are accepted here and refused by the local request
plan (`serving/api/chat_tools.py: unservable_fields`).
`describe_errors` turns pydantic errors into the client's field path (`stop`, `messages[0].content`).
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from serving.api.chat_fields import CHAT_ROLES, check_messages, check_response_format, check_tools, json_type, problem
from serving.sampling_params import MAX_LOGIT_BIAS, SEED_MAX, SEED_MIN

MAX_METADATA_PAIRS, MAX_METADATA_KEY_CHARS, MAX_METADATA_VALUE_CHARS = 16, 64, 512   # OpenAI's `metadata` limits
# The largest token id a `logit_bias` key may name: vocabularies are far smaller (about 2**18 at most today), and
# a key of thousands of digits would otherwise reach int(), which refuses more than 4,300 digits with a ValueError.
MAX_TOKEN_ID = 2**31 - 1

__all__ = ["CHAT_ROLES", "ChatCompletionRequest", "CompletionRequest", "ErrorBody", "StreamOptions", "ValidationProblem",
           "check_messages", "client_param", "describe_errors", "error_body", "json_type", "usage"]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    include_usage: bool = False
    include_obfuscation: bool | None = None  # OpenAI's; nothing to obfuscate here


class SamplingFields(BaseModel):
    """Fields shared by both endpoints."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    n: int = Field(1, ge=1, le=16)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    max_tokens: int | None = Field(None, ge=1)
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)  # OpenAI's range: a signed 64-bit integer
    user: str | None = None
    # vLLM extensions
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0, le=1)
    repetition_penalty: float | None = Field(None, gt=0)
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    min_tokens: int = Field(0, ge=0)
    # OpenAI: token id (a string, JSON keys being strings) -> bias added to its logit, in [-100, 100].
    logit_bias: dict[str, float] | None = None

    @field_validator("logit_bias")
    @classmethod
    def _token_ids_and_range(cls, bias: dict[str, float] | None) -> dict[str, float] | None:
        for key, value in (bias or {}).items():
            shown = repr(key[:32]) + ("..." if len(key) > 32 else "")
            if not (key.isascii() and key.isdigit()):
                raise ValueError(f"keys must be token ids (decimal strings), got {shown}")
            if len(key) > len(str(MAX_TOKEN_ID)) or int(key) > MAX_TOKEN_ID:
                raise ValueError(f"keys must be token ids up to {MAX_TOKEN_ID}, got {shown}")
            if not -MAX_LOGIT_BIAS <= value <= MAX_LOGIT_BIAS:
                raise ValueError(f"bias of token {key} must be in [-100, 100], got {value}")
        return bias

    @model_validator(mode="after")
    def _stream_options_need_stream(self):
        if self.stream_options is not None and not self.stream:
            raise problem("invalid_parameter", "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                          "stream_options")
        return self


class ChatCompletionRequest(SamplingFields):
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    metadata: dict[str, str] | None = None
    # Accepted and ignored by a local model (they change nothing about its output):
    store: bool | None = None
    service_tier: str | None = None
    prediction: dict[str, Any] | None = None
    reasoning_effort: str | None = None
    verbosity: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    # Passed to providers; a local model refuses them with a 400 (responses.py: `_unservable_fields`):
    modalities: list[Literal["text", "audio"]] | None = None
    audio: dict[str, Any] | None = None
    functions: list[dict[str, Any]] | None = None  # legacy, superseded by tools / tool_choice
    function_call: str | dict[str, Any] | None = None
    web_search_options: dict[str, Any] | None = None

    @field_validator("metadata")
    @classmethod
    def _openai_metadata_limits(cls, metadata: dict[str, str] | None) -> dict[str, str] | None:
        # OpenAI's limits and wording: at most 16 pairs, keys of at most 64 characters, values of at most 512
        if metadata is None:
            return None
        if len(metadata) > MAX_METADATA_PAIRS:
            raise problem("object_above_max_properties", f"Invalid 'metadata': too many properties. Expected an object "
                          f"with at most {MAX_METADATA_PAIRS} properties, but got an object with {len(metadata)} "
                          "properties instead.", "metadata")
        for key, value in metadata.items():
            if len(key) > MAX_METADATA_KEY_CHARS:
                raise problem("string_above_max_length", f"Invalid 'metadata': key too long. Expected a key with maximum "
                              f"length {MAX_METADATA_KEY_CHARS}, but got a key with length {len(key)} instead.", "metadata")
            if len(value) > MAX_METADATA_VALUE_CHARS:
                raise problem("string_above_max_length", f"Invalid 'metadata.{key}': string too long. Expected a string "
                              f"with maximum length {MAX_METADATA_VALUE_CHARS}, but got a string with length {len(value)} "
                              "instead.", f"metadata.{key}")
        return metadata

    @model_validator(mode="after")
    def _nested_objects_and_combinations(self):
        check_messages(self.messages)
        check_tools(self.tools, self.tool_choice, self.parallel_tool_calls)
        if self.response_format is not None:
            check_response_format(self.response_format)
        if self.max_tokens is not None and self.max_completion_tokens is not None:  # as OpenAI (invalid_parameter_combination)
            raise problem("invalid_parameter_combination", "Setting 'max_tokens' and 'max_completion_tokens' at the same "
                          "time is not supported.", "max_tokens")
        return self


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(None, ge=0, le=5)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1)


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


# A union member's tag in a pydantic error location ("str", "list[str]", a model's class name).
_TYPE_TAG = re.compile(r"^(str|int|float|bool|none|(list|dict|set|tuple|literal|function-\w+)\[.*\]|[A-Z]\w*)$")
_SINGULAR = {"str": "a string", "int": "an integer", "float": "a number", "bool": "a boolean"}
_PLURAL = {"str": "strings", "int": "integers", "float": "numbers", "bool": "booleans"}


def _type_phrase(tag: str, plural: bool = False) -> str:
    """"list[list[int]]" -> "an array of arrays of integers"."""
    if tag.startswith("list[") and tag.endswith("]"):
        return ("arrays of " if plural else "an array of ") + _type_phrase(tag[5:-1], plural=True)
    if tag.startswith("dict["):
        return "objects" if plural else "an object"
    return (_PLURAL if plural else _SINGULAR).get(tag, tag)


def client_param(loc: tuple | list) -> str | None:
    """A pydantic error location -> the client's field path: ("messages", 0, "content") -> "messages[0].content";
    union tags ("stop", "str") and dict-key markers are dropped."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part != "[key]" and not _TYPE_TAG.match(str(part)):
            path += f".{part}" if path else str(part)
    return path or None


def describe_errors(errors: list[dict], skip: int = 0) -> tuple[str, str | None]:
    """Pydantic errors (`ValidationError.errors()`) -> (message, param) of an OpenAI 400.

    Args:
        errors: the errors, in pydantic's order; unknown fields are reported first.
        skip: leading location parts to drop (1 for FastAPI's "body").
    Returns:
        e.g. ("Unrecognized request argument supplied: foo", "foo"), ("stop: expected a string or an array
        of strings, but got an integer", "stop"), ("Missing required parameter: 'messages'.", "messages").
    """
    errors = [{**e, "loc": tuple(e.get("loc", ()))[skip:]} for e in errors]
    if not errors:
        return "invalid request body", None
    extra = [client_param(e["loc"]) for e in errors if e.get("type") == "extra_forbidden"]
    if extra:
        plural = "s" if len(extra) > 1 else ""
        return f"Unrecognized request argument{plural} supplied: {', '.join(map(str, extra))}", extra[0]
    first = errors[0]
    if first.get("type") == "json_invalid":  # FastAPI's body parse error: loc ("body", character offset)
        at = f" at character {first['loc'][-1]}" if first["loc"] and isinstance(first["loc"][-1], int) else ""
        return f"We could not parse the JSON body of your request: {(first.get('ctx') or {}).get('error', 'invalid JSON')}{at}.", None
    if "param" in (first.get("ctx") or {}):
        return first["msg"], first["ctx"]["param"]
    param = client_param(first["loc"])
    if first.get("type") == "missing":
        return f"Missing required parameter: '{param}'.", param
    if first.get("type") == "too_short" and isinstance(first.get("input"), list) and not first["input"]:
        return (f"Invalid '{param}': empty array. Expected an array with minimum length "
                f"{(first.get('ctx') or {}).get('min_length', 1)}, but got an empty array instead."), param
    tag_at = next((i for i, part in enumerate(first["loc"]) if isinstance(part, str) and _TYPE_TAG.match(part)), None)
    if tag_at is not None:  # a union: say which types it takes, unless the value matched one member's shape
        prefix = first["loc"][:tag_at]
        members = [e for e in errors if e["loc"][:tag_at] == prefix and len(e["loc"]) > tag_at]
        deeper = [e for e in members if len(e["loc"]) > tag_at + 1]
        if deeper and len({e["loc"][tag_at] for e in deeper}) == 1:
            first, param = deeper[0], client_param(deeper[0]["loc"])
        else:
            phrases = [_type_phrase(t) for t in dict.fromkeys(str(e["loc"][tag_at]) for e in members)]
            expected = " or ".join([", ".join(phrases[:-1]), phrases[-1]] if len(phrases) > 1 else phrases)
            return f"{param}: expected {expected}, but got {json_type(first.get('input'))}", param
    return f"{param or 'body'}: {first.get('msg', 'invalid value').removeprefix('Value error, ')}", param


def error_body(message: str, type_: str = "invalid_request_error", param: str | None = None, code: str | None = None) -> dict:
    """The OpenAI error object: {"error": {"message", "type", "param", "code"}}."""
    return {"error": ErrorBody(message=message, type=type_, param=param, code=code).model_dump()}


def usage(prompt_tokens: int, completion_tokens: int, speculative: list | None = None) -> dict:
    """The OpenAI usage object. With speculative decoding on (`speculative`: the requests'
    `SpeculativeStats`), `completion_tokens_details` counts the draft tokens kept and rejected under
    OpenAI's Predicted Outputs names (accepted_prediction_tokens, rejected_prediction_tokens)."""
    body = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens}
    stats = [s for s in speculative or () if s is not None]
    if stats:
        body["completion_tokens_details"] = {"accepted_prediction_tokens": sum(s.num_accepted_tokens for s in stats),
                                             "rejected_prediction_tokens": sum(s.num_rejected_tokens for s in stats)}
    return body


class ValidationProblem(Exception):
    """A request that parses but cannot be served; becomes a 400 OpenAI error."""

    def __init__(self, message: str, param: str | None = None, status_code: int = 400, code: str | None = None,
                 type_: Literal["invalid_request_error", "not_found_error"] = "invalid_request_error"):
        super().__init__(message)
        self.message, self.param, self.status_code, self.code, self.type = message, param, status_code, code, type_
