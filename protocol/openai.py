"""OpenAI request schemas (Chat Completions and legacy Completions) and the usage object.

Field names, defaults and ranges follow the OpenAI API reference; vLLM's extra sampling fields
(`top_k`, `min_p`, `repetition_penalty`, `ignore_eos`, `stop_token_ids`, `min_tokens`) are accepted
too, and its chat-template fields `add_generation_prompt` (default true) and `continue_final_message` (default
false: true continues a trailing assistant message instead of starting a new turn; it needs
`add_generation_prompt: false` and a last message of role assistant, else a 400 naming the field). As with OpenAI, a field the reference does not list is a 400 ("Unrecognized request argument
supplied: foo"), at the top level and inside messages, content parts, tools, tool_choice,
response_format and stream_options (`protocol/chat_fields.py`); types are strict ("n": "2" or
"max_tokens": 5.0 is a 400 naming the field; a float field still takes an integer), `seed` is a signed
64-bit integer and a `logit_bias` key a token id up to 2**31 - 1 (what every backend takes), every message needs
a role and its content (an assistant message may omit content when it has tool calls), `stream_options`
needs `stream: true`, `tool_choice` needs `tools`, and `max_tokens` with `max_completion_tokens` is a
400 (OpenAI: "Setting 'max_tokens' and 'max_completion_tokens' at the same time is not supported.",
param `max_tokens`). Fields that a local model cannot honour but a provider behind the gateway may
(`audio`, `web_search_options`, image parts, ...) are accepted here and refused by the local request
plan (`serving/frontend/chat_tools.py: unservable_fields`).
Errors are OpenAI error objects (`protocol/errors.py`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from protocol.chat_fields import check_messages, check_response_format, check_tools, problem

# OpenAI's `seed` is a signed 64-bit integer; `torch.Generator.manual_seed` accepts that range.
SEED_MIN = -(2**63)
SEED_MAX = 2**63 - 1
# OpenAI's range for a `logit_bias` value.
MAX_LOGIT_BIAS = 100.0
MAX_METADATA_PAIRS, MAX_METADATA_KEY_CHARS, MAX_METADATA_VALUE_CHARS = 16, 64, 512   # OpenAI's `metadata` limits
# The largest token id a `logit_bias` key may name: vocabularies are far smaller (about 2**18 at most today), and
# a key of thousands of digits would otherwise reach int(), which refuses more than 4,300 digits with a ValueError.
MAX_TOKEN_ID = 2**31 - 1

__all__ = ["MAX_LOGIT_BIAS", "SEED_MAX", "SEED_MIN", "ChatCompletionRequest", "CompletionRequest", "StreamOptions", "usage"]


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
    # Passed to providers; a local model refuses them with a 400 (`serving.frontend.chat_tools.unservable_fields`):
    modalities: list[Literal["text", "audio"]] | None = None
    audio: dict[str, Any] | None = None
    functions: list[dict[str, Any]] | None = None  # legacy, superseded by tools / tool_choice
    function_call: str | dict[str, Any] | None = None
    web_search_options: dict[str, Any] | None = None
    # vLLM's chat-template extensions: continue a trailing assistant message (serving/text/chat_format.py)
    add_generation_prompt: bool = True
    continue_final_message: bool = False

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
        if self.continue_final_message and self.add_generation_prompt:  # vLLM's rule
            raise problem("invalid_parameter_combination", "continue_final_message and add_generation_prompt cannot both "
                          "be true: set add_generation_prompt to false to continue the final assistant message.",
                          "continue_final_message")
        if self.continue_final_message and self.messages[-1].get("role") != "assistant":
            raise problem("invalid_value", "continue_final_message needs the last message to be the assistant's "
                          "(the partial reply to continue).", "continue_final_message")
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
