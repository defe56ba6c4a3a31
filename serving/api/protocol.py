"""OpenAI request schemas (Chat Completions and legacy Completions) and the error object.

Field names, defaults and ranges follow the OpenAI API reference; vLLM's extra sampling fields
(`top_k`, `min_p`, `repetition_penalty`, `ignore_eos`, `stop_token_ids`, `min_tokens`) are accepted
too. Types are strict (pydantic strict mode): "n": "2" or "max_tokens": 5.0 is a 400 naming the field,
as with OpenAI; a float field still takes an integer.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from serving.sampling_params import MAX_LOGIT_BIAS


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True)

    include_usage: bool = False


class SamplingFields(BaseModel):
    """Fields shared by both endpoints."""

    model_config = ConfigDict(extra="allow", strict=True)

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
    seed: int | None = None
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
            if not (key.isascii() and key.isdigit()):
                raise ValueError(f"keys must be token ids (decimal strings), got {key!r}")
            if not -MAX_LOGIT_BIAS <= value <= MAX_LOGIT_BIAS:
                raise ValueError(f"bias of token {key} must be in [-100, 100], got {value}")
        return bias


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


def error_body(message: str, type_: str = "invalid_request_error", param: str | None = None, code: str | None = None) -> dict:
    """The OpenAI error object: {"error": {"message", "type", "param", "code"}}."""
    return {"error": ErrorBody(message=message, type=type_, param=param, code=code).model_dump()}


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens}


class ValidationProblem(Exception):
    """A request that parses but cannot be served; becomes a 400 OpenAI error."""

    def __init__(self, message: str, param: str | None = None, status_code: int = 400, code: str | None = None,
                 type_: Literal["invalid_request_error", "not_found_error"] = "invalid_request_error"):
        super().__init__(message)
        self.message, self.param, self.status_code, self.code, self.type = message, param, status_code, code, type_
