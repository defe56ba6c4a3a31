"""OpenAI request schemas (Chat Completions and legacy Completions) and the error object.

Field names, defaults and ranges follow the OpenAI API reference; vLLM's extra sampling fields
(`top_k`, `min_p`, `repetition_penalty`, `ignore_eos`, `stop_token_ids`) are accepted too.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class StreamOptions(BaseModel):
    include_usage: bool = False


class SamplingFields(BaseModel):
    """Fields shared by both endpoints."""

    model_config = ConfigDict(extra="allow")

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


class ChatCompletionRequest(SamplingFields):
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    response_format: dict[str, Any] | None = None
    metadata: dict[str, str] | None = None


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(None, ge=0, le=5)
    echo: bool = False
    suffix: str | None = None


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


def _token_logprob(tokenizer, token_id: int, logprob: float) -> dict:
    text = tokenizer.decode([token_id], skip_special_tokens=False)
    return {"token": text, "logprob": logprob, "bytes": list(text.encode())}


def chat_logprobs(token_ids: list[int], entries: list[dict], tokenizer, top_k: int) -> dict:
    """Chat `choices[].logprobs`: for each generated token its logprob and the `top_k` most likely tokens.

    Args:
        token_ids: the generated ids.
        entries: per token, {token id: Logprob} holding the chosen token and the top-k (engine output).
    """
    content = []
    for token_id, entry in zip(token_ids, entries):
        top = sorted((lp.rank, tid, lp.logprob) for tid, lp in entry.items() if lp.rank is not None and lp.rank <= top_k)
        item = _token_logprob(tokenizer, token_id, entry[token_id].logprob)
        item["top_logprobs"] = [_token_logprob(tokenizer, tid, lp) for _, tid, lp in top]
        content.append(item)
    return {"content": content}


class ValidationProblem(Exception):
    """A request that parses but cannot be served; becomes a 400 OpenAI error."""

    def __init__(self, message: str, param: str | None = None, status_code: int = 400, code: str | None = None,
                 type_: Literal["invalid_request_error", "not_found_error"] = "invalid_request_error"):
        super().__init__(message)
        self.message, self.param, self.status_code, self.code, self.type = message, param, status_code, code, type_
