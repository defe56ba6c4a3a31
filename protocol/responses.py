"""The OpenAI Responses API (`POST /v1/responses`) over a Chat Completions backend: the request schema, the
request -> chat translation and the chat answer -> Response object translation (streams: responses_stream.py).

    request = ResponsesRequest.model_validate(body)           # a ValidationError names the client's field
    chat = to_chat(request, history)                          # the chat request (history: earlier turns' messages)
    response = response_object(request, ids, output_items(message, finish_reason, ids), usage, created_at=t)
    conversation = [*history, *input_messages(request), *output_messages(response["output"])]   # what to store

What is supported (OpenAI's API reference, "Create a model response"): `input` as a string or a list of items
- messages (role user / assistant / system / developer, content a string or parts `input_text`, `output_text`,
`refusal`, `input_image` with an `image_url`), `function_call` items and `function_call_output` items (matched
by `call_id`) -; `instructions` (the first system message; not carried over from `previous_response_id`, as with
OpenAI); function `tools` in the Responses shape and `tool_choice` (none / auto / required / one function);
`temperature`, `top_p`, `max_output_tokens`, `parallel_tool_calls`, `stream`, `store`, `previous_response_id`,
`metadata`, `user`, `text.format` (text / json_object / json_schema -> the chat `response_format`),
`text.verbosity`, `reasoning.effort`, `service_tier`, `safety_identifier`, `prompt_cache_key`. Refused with a 400
that names the field and says what is supported: hosted tools (web search, file search, computer use, MCP, ...),
`background: true`, `conversation`, `prompt`, `include`, `max_tool_calls`, `top_logprobs`, `truncation: "auto"`,
and input item types other than the three above. Output: `message` items (`output_text` / `refusal` parts) and
`function_call` items; a chat `finish_reason` "length" makes the response `incomplete` with
`incomplete_details.reason` "max_output_tokens" ("content_filter": "content_filter"). `output_text` is a
convenience of the SDKs, not a field of the object.
"""

from __future__ import annotations

import secrets
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from protocol.chat_fields import problem
from protocol.responses_fields import check_input_item, check_text_format, check_tool, check_tool_choice

INCOMPLETE_REASONS = {"length": "max_output_tokens", "content_filter": "content_filter"}


def new_id(prefix: str) -> str:
    """A fresh object id as OpenAI shapes them: `prefix` ("resp", "msg", "fc") + "_" + 48 hex digits."""
    return f"{prefix}_{secrets.token_hex(24)}"


class TextConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    format: dict[str, Any] | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class Reasoning(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


class ResponsesRequest(BaseModel):
    """The body of `POST /v1/responses` (OpenAI's fields; see the module docstring for what is refused)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    max_output_tokens: int | None = Field(None, ge=16)  # OpenAI's minimum
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    store: bool = True
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    text: TextConfig | None = None
    reasoning: Reasoning | None = None
    service_tier: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    # OpenAI's, refused here unless at their do-nothing value (`_nothing_unsupported`)
    background: bool | None = None
    truncation: Literal["auto", "disabled"] | None = None
    include: list[str] | None = None
    conversation: Any = None
    prompt: Any = None
    max_tool_calls: int | None = None
    top_logprobs: int | None = None

    @model_validator(mode="after")
    def _nested(self):
        _nothing_unsupported(self)
        if isinstance(self.input, list):
            for i, item in enumerate(self.input):
                check_input_item(item, f"input[{i}]")
        for i, tool in enumerate(self.tools or ()):
            check_tool(tool, f"tools[{i}]")
        if self.tool_choice is not None:
            check_tool_choice(self.tool_choice)
        if self.text is not None and self.text.format is not None:
            check_text_format(self.text.format)
        if self.stream_options is not None and not self.stream:
            raise problem("invalid_parameter", "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                          "stream_options")
        return self


def _nothing_unsupported(request: ResponsesRequest) -> None:
    unsupported = {"background": request.background, "conversation": request.conversation, "prompt": request.prompt,
                   "include": request.include or None, "max_tool_calls": request.max_tool_calls,
                   "top_logprobs": request.top_logprobs, "truncation": request.truncation == "auto" or None}
    for field, value in unsupported.items():
        if value:
            raise problem("unsupported_parameter", f"'{field}' is not supported by this gateway's Responses API "
                          "(see docs/gateway.md, section /v1/responses).", field)


# --- request -> chat ------------------------------------------------------------------------------


def _text_of(parts: list[dict]) -> str:
    return "".join(p.get("text") or p.get("refusal") or "" for p in parts)


def _chat_part(part: dict) -> dict:
    if part["type"] == "input_image":
        image = {"url": part["image_url"]}
        if part.get("detail"):
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    return {"type": "text", "text": part["text"]}


def input_messages(request: ResponsesRequest) -> list[dict]:
    """The request's `input` as chat messages (without `instructions`). Function calls that follow an assistant
    message (or each other) join it as `tool_calls`; each output becomes a `tool` message."""
    if isinstance(request.input, str):
        return [{"role": "user", "content": request.input}]
    messages: list[dict] = []
    for item in request.input:
        kind = item.get("type", "message")
        if kind == "function_call":
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item["output"]
            messages.append({"role": "tool", "tool_call_id": item["call_id"],
                             "content": output if isinstance(output, str) else _text_of(output)})
        else:
            content = item["content"]
            if isinstance(content, list):
                content = _text_of(content) if item["role"] != "user" else [_chat_part(p) for p in content]
            messages.append({"role": item["role"], "content": content})
    return messages


def _chat_tool(tool: dict) -> dict:
    function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
    return {"type": "function", "function": function}


def _response_format(fmt: dict) -> dict | None:
    if fmt["type"] == "text":
        return None
    if fmt["type"] == "json_object":
        return {"type": "json_object"}
    schema = {k: fmt[k] for k in ("name", "schema", "description", "strict") if fmt.get(k) is not None}
    return {"type": "json_schema", "json_schema": schema}


def to_chat(request: ResponsesRequest, history: list[dict] | None = None) -> dict[str, Any]:
    """The Chat Completions request that serves `request`: [system: instructions] + `history` (the earlier turns'
    messages, from `previous_response_id`) + the input; `max_output_tokens` -> `max_completion_tokens`, tools and
    tool_choice in the chat shape, `text.format` -> `response_format`; a stream asks for its usage chunk."""
    messages = [{"role": "system", "content": request.instructions}] if request.instructions is not None else []
    chat: dict[str, Any] = {"model": request.model, "messages": [*messages, *(history or []), *input_messages(request)]}
    for field in ("temperature", "top_p", "parallel_tool_calls", "metadata", "user", "service_tier",
                  "safety_identifier", "prompt_cache_key"):
        if getattr(request, field) is not None:
            chat[field] = getattr(request, field)
    if request.max_output_tokens is not None:
        chat["max_completion_tokens"] = request.max_output_tokens
    if request.tools:
        chat["tools"] = [_chat_tool(t) for t in request.tools]
    if request.tool_choice is not None:
        choice = request.tool_choice
        chat["tool_choice"] = choice if isinstance(choice, str) else {"type": "function", "function": {"name": choice["name"]}}
    if request.text is not None:
        if request.text.format is not None and (fmt := _response_format(request.text.format)) is not None:
            chat["response_format"] = fmt
        if request.text.verbosity is not None:
            chat["verbosity"] = request.text.verbosity
    if request.reasoning is not None and request.reasoning.effort is not None:
        chat["reasoning_effort"] = request.reasoning.effort
    if request.stream:
        chat["stream"], chat["stream_options"] = True, {"include_usage": True}
    return chat


# --- chat answer -> Response object ---------------------------------------------------------------


def message_item(item_id: str, text: str | None, refusal: str | None, status: str) -> dict:
    """An output `message` item: one `output_text` part (and/or a `refusal` part)."""
    content = []
    if text is not None:
        content.append({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
    if refusal is not None:
        content.append({"type": "refusal", "refusal": refusal})
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def function_call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict:
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}


def output_items(message: dict, finish_reason: str | None) -> list[dict]:
    """A chat answer's assistant `message` -> output items: a `message` item when it has text or a refusal, then one
    `function_call` item per tool call (its chat `id` is the `call_id`)."""
    status = "incomplete" if finish_reason in INCOMPLETE_REASONS else "completed"
    items = []
    if message.get("content") or message.get("refusal"):
        items.append(message_item(new_id("msg"), message.get("content"), message.get("refusal"), status))
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        items.append(function_call_item(new_id("fc"), call.get("id") or new_id("call"), function.get("name") or "",
                                        function.get("arguments") or "", status))
    return items


def response_usage(usage: dict | None) -> dict | None:
    """A chat `usage` -> the Responses usage (input/output tokens, their details); `link_billed` rides along."""
    if not usage:
        return None
    details = usage.get("prompt_tokens_details") or {}
    out = {"input_tokens": usage.get("prompt_tokens", 0),
           "input_tokens_details": {"cached_tokens": details.get("cached_tokens") or 0, "cache_write_tokens": 0},
           "output_tokens": usage.get("completion_tokens", 0),
           "output_tokens_details": {"reasoning_tokens": (usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0},
           "total_tokens": usage.get("total_tokens", usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0))}
    if "link_billed" in usage:
        out["link_billed"] = usage["link_billed"]
    return out


def response_object(request: ResponsesRequest, response_id: str, created_at: int, model: str, *,
                    output: list[dict], status: str, finish_reason: str | None = None, usage: dict | None = None,
                    error: dict | None = None) -> dict[str, Any]:
    """The Response object (`object: "response"`). `status`: "in_progress", "completed", "incomplete" (then
    `incomplete_details.reason` from the chat `finish_reason`) or "failed" (with `error` {code, message}).
    `usage` is the chat usage (converted here)."""
    if status == "completed" and finish_reason in INCOMPLETE_REASONS:
        status = "incomplete"
    text = {"format": (request.text.format if request.text and request.text.format else {"type": "text"})}
    if request.text is not None and request.text.verbosity is not None:
        text["verbosity"] = request.text.verbosity
    return {
        "id": response_id, "object": "response", "created_at": created_at, "status": status,
        "background": False, "error": error,
        "incomplete_details": {"reason": INCOMPLETE_REASONS[finish_reason]} if status == "incomplete" else None,
        "instructions": request.instructions, "max_output_tokens": request.max_output_tokens, "model": model,
        "output": output, "parallel_tool_calls": request.parallel_tool_calls is not False,
        "previous_response_id": request.previous_response_id,
        "reasoning": {"effort": request.reasoning.effort if request.reasoning else None, "summary": None},
        "service_tier": request.service_tier, "store": request.store,
        "temperature": 1.0 if request.temperature is None else request.temperature, "text": text,
        "tool_choice": "auto" if request.tool_choice is None else request.tool_choice,
        "tools": [{"strict": True, **t} for t in request.tools or ()], "top_p": 1.0 if request.top_p is None else request.top_p,
        "truncation": "disabled", "usage": response_usage(usage), "user": request.user, "metadata": request.metadata or {},
    }


def whole_response(request: ResponsesRequest, response_id: str, created_at: int, chat: dict) -> dict[str, Any]:
    """A whole chat completion -> the Response object (its first choice)."""
    choice = (chat.get("choices") or [{}])[0]
    finish_reason = choice.get("finish_reason")
    return response_object(request, response_id, created_at, chat.get("model") or request.model,
                           output=output_items(choice.get("message") or {}, finish_reason), status="completed",
                           finish_reason=finish_reason, usage=chat.get("usage"))


def output_messages(output: list[dict]) -> list[dict]:
    """A response's output items as chat messages (one assistant message, its calls as `tool_calls`): what a later
    request that names this response in `previous_response_id` reads after its input."""
    message: dict[str, Any] = {"role": "assistant", "content": None}
    for item in output:
        if item["type"] == "message":
            message["content"] = (message["content"] or "") + _text_of(
                [p for p in item["content"] if p["type"] == "output_text"])
        elif item["type"] == "function_call":
            message.setdefault("tool_calls", []).append(
                {"id": item["call_id"], "type": "function", "function": {"name": item["name"], "arguments": item["arguments"]}})
    return [message] if message["content"] is not None or message.get("tool_calls") else []
