"""Anthropic's Messages API (`POST /v1/messages`) as the OpenAI chat request the gateway runs, and back.

    request = parse_messages_request(body)            # MessagesRequest, or MessagesProblem naming the field
    chat = to_chat_request(request)                   # the OpenAI Chat Completions body
    message = to_message(completion, message_id="msg_1", stop_sequences=request.stop_sequences)
    events = MessageStream("msg_1", "m", stop_sequences=None); events.feed(chunk); events.finish()
    error_object(429, "slow down")                    # {"type": "error", "error": {"type": "rate_limit_error", ...}}

The shapes follow Anthropic's API reference (Messages, streaming, errors). Request: `model`, `max_tokens`
(required), `system` (a string or text blocks), `messages` (string content or `text`, `image`, `tool_use`,
`tool_result` blocks), `tools` (custom tools: name, description, input_schema), `tool_choice` (auto, any, tool,
none; `disable_parallel_tool_use`), `stop_sequences`, `temperature`, `top_p`, `top_k`, `metadata.user_id`,
`stream`; `cache_control` is accepted and ignored, `service_tier` too. A field outside that list is a 400 naming
it ("thinking: Extra inputs are not permitted"), as Anthropic's validation words it: `path.0.field: message`.
Translation to OpenAI: `system` -> a system message (text blocks joined by a blank line); a user message's
`tool_result` blocks -> `tool` messages (placed before its other blocks, as the tool calls they answer must
come first; a string or the text of its blocks, prefixed "Error: " when `is_error`), its `image` blocks ->
`image_url` parts (a data URL for base64); an assistant's `tool_use` blocks -> `tool_calls` with the input as
JSON arguments; `tool_choice` any -> "required", tool -> the named function, `disable_parallel_tool_use` ->
`parallel_tool_calls: false`; `stop_sequences` -> `stop`; `metadata.user_id` -> `user`; a stream asks for
usage (`stream_options.include_usage`) to report `output_tokens`.
Back: `finish_reason` stop -> `end_turn`, or `stop_sequence` when the backend names the matched string in
`stop_reason` (vLLM's field; a backend that does not say reports `end_turn`), length -> `max_tokens`, tool_calls
-> `tool_use`, content_filter -> `refusal`. A stream starts (`message_start`) before the prompt's token count is
known: its `input_tokens` is 0 there and the real count comes in `message_delta.usage` (cumulative, as Anthropic's
clients read it). `protocol` imports no package of ours.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

# HTTP status -> Anthropic's error type (its API reference, "Errors"); other 4xx are invalid requests, 5xx api errors.
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 402: "billing_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
               504: "timeout_error", 529: "overloaded_error"}
STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use", "function_call": "tool_use", "content_filter": "refusal"}
# pydantic's location parts that name a Python type of a union member, not a field ("str", "list[...]")
_TYPE_TAG = re.compile(r"^(str|int|float|bool|none|(list|dict|tagged-union|literal|function-\w+)\[.*\]|[A-Z]\w*)$")


class MessagesProblem(Exception):
    """A Messages request that cannot be served: a 400 `invalid_request_error`; `param` is the field path."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.message, self.param = message, param


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class TextBlock(_Strict):
    type: Literal["text"]
    text: str
    cache_control: dict[str, Any] | None = None
    citations: list[dict[str, Any]] | None = None


class Base64Source(_Strict):
    type: Literal["base64"]
    media_type: Literal["image/jpeg", "image/png", "image/gif", "image/webp"]
    data: str


class UrlSource(_Strict):
    type: Literal["url"]
    url: str


class ImageBlock(_Strict):
    type: Literal["image"]
    source: Annotated[Union[Base64Source, UrlSource], Field(discriminator="type")]
    cache_control: dict[str, Any] | None = None


class ToolUseBlock(_Strict):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]
    cache_control: dict[str, Any] | None = None


class ToolResultBlock(_Strict):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[Annotated[Union[TextBlock, ImageBlock], Field(discriminator="type")]] | None = None
    is_error: bool | None = None
    cache_control: dict[str, Any] | None = None


ContentBlock = Annotated[Union[TextBlock, ImageBlock, ToolUseBlock, ToolResultBlock], Field(discriminator="type")]


class MessageParam(_Strict):
    role: Literal["user", "assistant"]
    content: str | list[ContentBlock]


class Tool(_Strict):
    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None
    cache_control: dict[str, Any] | None = None


class ToolChoiceAuto(_Strict):
    type: Literal["auto"]
    disable_parallel_tool_use: bool | None = None


class ToolChoiceAny(_Strict):
    type: Literal["any"]
    disable_parallel_tool_use: bool | None = None


class ToolChoiceTool(_Strict):
    type: Literal["tool"]
    name: str
    disable_parallel_tool_use: bool | None = None


class ToolChoiceNone(_Strict):
    type: Literal["none"]


class Metadata(_Strict):
    user_id: str | None = Field(None, max_length=256)


class MessagesRequest(_Strict):
    """The Messages request body (Anthropic's `MessageCreateParams`, the fields listed in the module docstring)."""

    model: str
    max_tokens: int = Field(ge=1)
    messages: list[MessageParam] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    metadata: Metadata | None = None
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, ge=0, le=1)
    top_k: int | None = Field(None, ge=0)
    tools: list[Tool] | None = None
    tool_choice: Annotated[Union[ToolChoiceAuto, ToolChoiceAny, ToolChoiceTool, ToolChoiceNone],
                           Field(discriminator="type")] | None = None
    service_tier: Literal["auto", "standard_only"] | None = None  # one tier here: accepted, changes nothing
    cache_control: dict[str, Any] | None = None  # no prompt cache to steer: accepted, changes nothing


def field_path(loc: tuple | list) -> str:
    """A pydantic location -> Anthropic's field path: ("messages", 0, "content", "list[...]", 1, "image") ->
    "messages.0.content.1.image" (a content block's type stays in the path, as Anthropic writes it)."""
    return ".".join(str(p) for p in loc if isinstance(p, int) or not _TYPE_TAG.match(str(p))) or "body"


def parse_messages_request(body: dict[str, Any]) -> MessagesRequest:
    """The validated request. Raises MessagesProblem: the first error, "max_tokens: Field required" style."""
    try:
        request = MessagesRequest.model_validate(body)
    except ValidationError as exc:
        errors = exc.errors()
        # an unknown field first; else the deepest error (a union's member that matched the value's shape)
        first = next((e for e in errors if e["type"] == "extra_forbidden"), max(errors, key=lambda e: len(e["loc"])))
        path = field_path(first["loc"])
        raise MessagesProblem(f"{path}: {first['msg'].removeprefix('Value error, ')}", path) from None
    for i, tool in enumerate(request.tools or ()):
        if tool.input_schema.get("type") != "object":
            raise MessagesProblem(f"tools.{i}.custom.input_schema.type: Input should be 'object'",
                                  f"tools.{i}.custom.input_schema.type")
    return request


def _text(blocks: list[TextBlock]) -> str:
    return "\n\n".join(b.text for b in blocks)


def _image_part(block: ImageBlock) -> dict:
    source = block.source
    url = source.url if isinstance(source, UrlSource) else f"data:{source.media_type};base64,{source.data}"
    return {"type": "image_url", "image_url": {"url": url}}


def _tool_message(block: ToolResultBlock) -> dict:
    content = block.content
    if isinstance(content, list):
        if any(isinstance(b, ImageBlock) for b in content):
            raise MessagesProblem(f"tool_result {block.tool_use_id!r}: image blocks in a tool result are not supported (an "
                                  "OpenAI tool message carries text only); send the image in the user message instead")
        content = "".join(b.text for b in content)
    text = content or ""
    return {"role": "tool", "tool_call_id": block.tool_use_id, "content": f"Error: {text}" if block.is_error else text}


def _chat_messages(i: int, message: MessageParam) -> list[dict]:
    """One Messages message -> its OpenAI chat messages (several when a user message carries tool results)."""
    if isinstance(message.content, str):
        return [{"role": message.role, "content": message.content}]
    if message.role == "assistant":
        texts = [b.text for b in message.content if isinstance(b, TextBlock)]
        calls = [{"id": b.id, "type": "function", "function": {"name": b.name, "arguments": json.dumps(b.input)}}
                 for b in message.content if isinstance(b, ToolUseBlock)]
        for j, block in enumerate(message.content):
            if not isinstance(block, (TextBlock, ToolUseBlock)):
                raise MessagesProblem(f"messages.{i}.content.{j}.{block.type}: an assistant message takes text and "
                                      f"tool_use blocks only", f"messages.{i}.content.{j}")
        chat = {"role": "assistant", "content": "".join(texts) if texts else None}
        return [{**chat, "tool_calls": calls} if calls else {**chat, "content": chat["content"] or ""}]
    tools = [_tool_message(b) for b in message.content if isinstance(b, ToolResultBlock)]
    parts = []
    for j, block in enumerate(message.content):
        if isinstance(block, ToolUseBlock):
            raise MessagesProblem(f"messages.{i}.content.{j}.tool_use: tool_use blocks belong in assistant messages",
                                  f"messages.{i}.content.{j}")
        if isinstance(block, TextBlock):
            parts.append({"type": "text", "text": block.text})
        elif isinstance(block, ImageBlock):
            parts.append(_image_part(block))
    if not parts:
        return tools
    if all(p["type"] == "text" for p in parts):
        return [*tools, {"role": "user", "content": "".join(p["text"] for p in parts) if len(parts) == 1 else parts}]
    return [*tools, {"role": "user", "content": parts}]


def to_chat_request(request: MessagesRequest) -> dict[str, Any]:
    """The OpenAI Chat Completions body that asks what `request` asks (module docstring). Raises MessagesProblem."""
    messages = []
    if request.system:
        messages.append({"role": "system", "content": request.system if isinstance(request.system, str)
                         else _text(request.system)})
    for i, message in enumerate(request.messages):
        messages += _chat_messages(i, message)
    chat: dict[str, Any] = {"model": request.model, "messages": messages, "max_tokens": request.max_tokens}
    for field in ("temperature", "top_p", "top_k"):
        if getattr(request, field) is not None:
            chat[field] = getattr(request, field)
    if request.stop_sequences:
        chat["stop"] = request.stop_sequences
    if request.metadata is not None and request.metadata.user_id is not None:
        chat["user"] = request.metadata.user_id
    if request.stream:
        chat["stream"], chat["stream_options"] = True, {"include_usage": True}
    if request.tools:
        chat["tools"] = [{"type": "function", "function": {"name": t.name, "parameters": t.input_schema,
                                                           **({"description": t.description} if t.description else {})}}
                         for t in request.tools]
        choice = request.tool_choice
        if choice is not None:
            chat["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}.get(choice.type) or \
                {"type": "function", "function": {"name": getattr(choice, "name", "")}}
            if getattr(choice, "disable_parallel_tool_use", None):
                chat["parallel_tool_calls"] = False
    elif request.tool_choice is not None and request.tool_choice.type in ("any", "tool"):
        raise MessagesProblem(f"tool_choice.{request.tool_choice.type}: tool_choice needs `tools`", "tool_choice")
    return chat


def stop_reason(finish_reason: str | None, matched: Any, stop_sequences: list[str] | None) -> tuple[str, str | None]:
    """(Anthropic stop_reason, stop_sequence) of an OpenAI choice's finish_reason and its `stop_reason` (`matched`)."""
    if finish_reason == "stop" and isinstance(matched, str) and matched in (stop_sequences or ()):
        return "stop_sequence", matched
    return STOP_REASONS.get(finish_reason or "", "end_turn"), None


def _tool_input(arguments: str | None, name: str) -> dict:
    try:
        value = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, dict):
        raise ValueError(f"the model called tool {name!r} with arguments that are not a JSON object: {arguments!r:.200}")
    return value


def usage_object(usage: dict | None) -> dict:
    """OpenAI's usage -> Anthropic's {input_tokens, output_tokens}."""
    usage = usage or {}
    return {"input_tokens": int(usage.get("prompt_tokens") or 0), "output_tokens": int(usage.get("completion_tokens") or 0)}


def to_message(completion: dict, *, message_id: str, stop_sequences: list[str] | None) -> dict:
    """A whole OpenAI chat completion (its first choice) -> the Messages response object.

    Raises:
        ValueError: a tool call whose arguments are not a JSON object (Anthropic's `input` must be one).
    """
    choice = (completion.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    content: list[dict] = [{"type": "text", "text": message["content"]}] if message.get("content") else []
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        content.append({"type": "tool_use", "id": call.get("id") or f"toolu_{uuid.uuid4().hex}",
                        "name": function.get("name"), "input": _tool_input(function.get("arguments"), function.get("name"))})
    reason, sequence = stop_reason(choice.get("finish_reason"), choice.get("stop_reason"), stop_sequences)
    if reason == "end_turn" and message.get("tool_calls"):
        reason = "tool_use"
    return {"id": message_id, "type": "message", "role": "assistant", "model": completion.get("model"), "content": content,
            "stop_reason": reason, "stop_sequence": sequence, "usage": usage_object(completion.get("usage"))}


def error_object(status_code: int, message: str) -> dict:
    """Anthropic's error body: {"type": "error", "error": {"type": <by status>, "message"}}."""
    kind = ERROR_TYPES.get(status_code) or ("api_error" if status_code >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def event(name: str, payload: dict) -> bytes:
    """One Anthropic server-sent event: `event: <name>` and its JSON `data` line."""
    return f"event: {name}\ndata: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


class MessageStream:
    """OpenAI chat chunks in, Anthropic stream events out (message_start, ping, content_block_start/delta/stop,
    message_delta, message_stop). Text deltas are `text_delta`s of a text block; each tool call is a `tool_use`
    block whose arguments arrive as `input_json_delta`s. Only the first choice (index 0) is read."""

    def __init__(self, message_id: str, model: str, *, stop_sequences: list[str] | None):
        self.message_id, self.model, self.stop_sequences = message_id, model, stop_sequences
        self.is_started = False
        self.block: tuple[str, int | None] | None = None  # the open block: ("text", None) or ("tool_use", call index)
        self.num_blocks = 0
        self.finish_reason: str | None = None
        self.matched: Any = None
        self.usage: dict | None = None
        self.num_deltas = 0

    def _start(self) -> list[bytes]:
        if self.is_started:
            return []
        self.is_started = True
        message = {"id": self.message_id, "type": "message", "role": "assistant", "model": self.model, "content": [],
                   "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 0, "output_tokens": 0}}
        return [event("message_start", {"type": "message_start", "message": message}), event("ping", {"type": "ping"})]

    def _close_block(self) -> list[bytes]:
        if self.block is None:
            return []
        self.block = None
        self.num_blocks += 1
        return [event("content_block_stop", {"type": "content_block_stop", "index": self.num_blocks - 1})]

    def _open(self, kind: tuple[str, int | None], block: dict) -> list[bytes]:
        out = self._close_block()
        self.block = kind
        return out + [event("content_block_start", {"type": "content_block_start", "index": self.num_blocks,
                                                    "content_block": block})]

    def _delta(self, delta: dict) -> bytes:
        self.num_deltas += 1
        return event("content_block_delta", {"type": "content_block_delta", "index": self.num_blocks, "delta": delta})

    def feed(self, chunk: dict) -> list[bytes]:
        """The events of one OpenAI chat chunk (a usage-only chunk yields none)."""
        out = self._start()
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if delta.get("content"):
                if self.block != ("text", None):
                    out += self._open(("text", None), {"type": "text", "text": ""})
                out.append(self._delta({"type": "text_delta", "text": delta["content"]}))
            for call in delta.get("tool_calls") or ():
                index, function = call.get("index", 0), call.get("function") or {}
                if self.block != ("tool_use", index):
                    out += self._open(("tool_use", index), {"type": "tool_use", "id": call.get("id") or f"toolu_{uuid.uuid4().hex}",
                                                            "name": function.get("name") or "", "input": {}})
                if function.get("arguments"):
                    out.append(self._delta({"type": "input_json_delta", "partial_json": function["arguments"]}))
            if choice.get("finish_reason"):
                self.finish_reason, self.matched = choice["finish_reason"], choice.get("stop_reason")
        return out

    def finish(self) -> list[bytes]:
        """The closing events: the open block's stop, message_delta (stop_reason, usage), message_stop."""
        out = self._start() + self._close_block()
        reason, sequence = stop_reason(self.finish_reason, self.matched, self.stop_sequences)
        usage = usage_object(self.usage) if self.usage else {"output_tokens": self.num_deltas}
        return out + [event("message_delta", {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                                              "usage": usage}),
                      event("message_stop", {"type": "message_stop"})]

    def error(self, status_code: int, message: str) -> list[bytes]:
        """The `error` event that ends a stream which failed after its first byte."""
        return [event("error", error_object(status_code, message))]
