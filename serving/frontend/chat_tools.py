"""Tools and `response_format` on the chat endpoint: request -> messages and constraint, output -> message.

- `prepare_chat`: refuses what a local text model cannot honour (`unservable_fields`), renders `tools`
  into the messages (`serving.tools.harness`), turns a forcing `tool_choice` ("required", a named function)
  into the structural tag the engine enforces (`serving.guided.tool_choice`) and `response_format` into the
  JSON Schema it enforces (`serving.guided.automaton`), with 400s naming the field.
- `tool_message`: a finished output -> the OpenAI assistant message and finish reason
  (`tool_calls` and finish_reason "tool_calls" when the model called functions). A forced output is
  always calls, content null, even when max_tokens cut it (arguments as far as they got, finish_reason
  "length"; `serving.guided.tool_choice.parse_forced_calls`). In "auto" mode an output cut by max_tokens right
  after a whole call, inside its `</tool_call>`, is that call too (finish_reason stays "length"); any
  other unclosed or malformed block stays content.
- After a tool result (a "tool" message), the model writing a result block of its own is echoing the
  harness: blocks before any answer text are skipped (EOS refused until the model answers) and the opening
  marker after answer text stops the output (`ChatSetup.echo_markers`, `serving.engine.stop`); the output is parsed
  (with no tools offered: `tools` []), which cuts any such block (`serving.tools.harness.strip_tool_results`).
- `ToolStream`: the streamed form: content is held back from where a `<tool_call>` tag may start (a
  forced output sends none), and the calls are sent at the end as `delta.tool_calls` chunks, parsed as
  the whole response parses them, so streamed equals whole.

Every step takes the model's harness format (`serving.tools.formats.ToolCallFormat`, link.yaml
`tool_format:`; default the JSON format). A format of style xml is not forced by constrained decoding:
a forcing tool_choice is then a prompt instruction, and the output is parsed as in "auto" mode
(calls only of the forced tools).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from protocol.errors import ValidationProblem
from protocol.openai import ChatCompletionRequest
from serving.guided.automaton import UnsupportedSchemaError, response_format_schema
from serving.guided.schema import InvalidSchemaError
from serving.guided.tool_choice import forced_tool_tag, forced_tools, parse_forced_calls
from serving.tools.harness import (
    DEFAULT_FORMAT, ParsedOutput, ToolCallFormat, ToolFormatError, parse_tool_calls, render_messages, streamable_length,
    with_system_text,
)


@dataclass(frozen=True)
class ChatSetup:
    """messages: for the chat template; guided_json: the schema as JSON text or None; tools: the tools
    whose calls are parsed from the output (None: no parsing; a named tool_choice: that tool); parallel:
    several calls allowed; structural_tag: the forced tool calls (`SamplingParams.structural_tag`) or None;
    forced: the output is forced calls; tool_format: the harness format that rendered and parses the calls;
    echo_markers: after a tool result, the format's result markers (`SamplingParams.echo_markers`), else ();
    template_tools: the tools for a chat template that renders them itself (`native`), else None."""

    messages: list[dict]
    guided_json: str | None
    tools: list[dict] | None
    parallel: bool = True
    structural_tag: str | None = None
    forced: bool = False
    tool_format: ToolCallFormat = DEFAULT_FORMAT
    echo_markers: tuple[str, ...] = ()
    template_tools: list[dict] | None = None


def unservable_fields(body: ChatCompletionRequest) -> None:
    """Refuse the chat fields a local text model cannot honour (accepted by the schema for providers).

    Raises:
        ValidationProblem: naming the field, or the content part (`messages[0].content[1]`) it cannot read.
    """
    if body.audio is not None or "audio" in (body.modalities or ()):
        raise ValidationProblem("this model only produces text: audio output (`modalities` with \"audio\", `audio`) is "
                                "not supported", param="audio" if body.audio is not None else "modalities")
    if body.functions is not None or body.function_call is not None:
        raise ValidationProblem("the legacy `functions` / `function_call` are not supported by this model; send the same "
                                "functions as `tools` (type \"function\") and `tool_choice`",
                                param="functions" if body.functions is not None else "function_call")
    if body.web_search_options is not None:
        raise ValidationProblem("this model cannot search the web: `web_search_options` is not supported",
                                param="web_search_options")
    for i, message in enumerate(body.messages):
        parts = message.get("content")
        for j, part in enumerate(parts if isinstance(parts, list) else ()):
            if part["type"] != "text":
                raise ValidationProblem(f"this model reads text only: a content part of type {part['type']!r} is not "
                                        f"supported", param=f"messages[{i}].content[{j}]")
    for i, tool in enumerate(body.tools or ()):
        if tool["type"] != "function":
            raise ValidationProblem(f"this model calls function tools only, not {tool['type']!r} tools",
                                    param=f"tools[{i}].type")


def prepare_chat(body: ChatCompletionRequest, fmt: ToolCallFormat = DEFAULT_FORMAT, native: bool = False) -> ChatSetup:
    """The messages and constraints of a chat request, tools in the harness format `fmt`; `native`: the chat
    template renders the tools and results itself (`render_messages(native=True)`; `ChatSetup.template_tools`
    holds the tools unless tool_choice is "none").

    Raises:
        ValidationProblem: malformed tools/tool_choice, an unsupported response_format or schema keyword, a
            schema no automaton can decode (param `response_format.json_schema.schema` or
            `tools[i].function.parameters`: too deep, a `$ref` cycle that writes nothing),
            or response_format json together with active tools; tools `fmt` cannot carry (`fmt.check_tools`). (`stop` with response_format is accepted, as
            by OpenAI: a stop sequence may end the output before the JSON closes.)
    """
    unservable_fields(body)
    tools = body.tools or None
    active = bool(tools) and body.tool_choice != "none"
    parallel = body.parallel_tool_calls is not False
    messages = body.messages
    try:
        if tools or any(m.get("tool_calls") or m.get("role") == "tool" for m in messages if isinstance(m, dict)):
            messages = render_messages(messages, tools, body.tool_choice or "auto", parallel, fmt=fmt, native=native)
        fmt.check_tools(tools)
        tag = forced_tool_tag(tools, body.tool_choice, parallel, fmt) if fmt.can_force else None
        forced = forced_tools(tools, body.tool_choice)
    except ToolFormatError as exc:
        param = getattr(exc, "param", None) or (
            "tool_choice" if "tool_choice" in str(exc) else "messages" if "messages[" in str(exc) else "tools")
        raise ValidationProblem(str(exc), param=param) from None
    try:
        schema = response_format_schema(body.response_format) if body.response_format else None
    except InvalidSchemaError as exc:  # too deep, a $ref cycle: the message names the place (#/$defs/a)
        raise ValidationProblem(str(exc), param="response_format.json_schema.schema") from None
    except UnsupportedSchemaError as exc:
        raise ValidationProblem(str(exc), param="response_format") from None
    if schema is not None:
        if active:
            raise ValidationProblem("response_format json_object/json_schema cannot be combined with tools on a local model "
                                    "unless tool_choice is 'none'", param="response_format")
        hint = "Reply with one JSON object and nothing else."
        if schema != {"type": "object"}:
            hint += f" It must follow this JSON Schema:\n{json.dumps(schema, ensure_ascii=False)}"
        messages = with_system_text(messages, hint)
    parsed_tools = forced if forced is not None else list(tools) if active else None
    has_results = any(m.get("role") == "tool" for m in body.messages if isinstance(m, dict))
    echo_markers = (fmt.result_open, fmt.result_close) if has_results and fmt.result_open else ()
    if has_results and parsed_tools is None:
        parsed_tools = []  # parsed for the echoed result blocks only: no call is accepted
    return ChatSetup(messages, None if schema is None else json.dumps(schema), parsed_tools, parallel, tag, tag is not None,
                     fmt, echo_markers, list(tools) if native and active else None)


def _parse(text: str, finish: str | None, tools: list[dict], parallel: bool, forced: bool, fmt: ToolCallFormat) -> ParsedOutput:
    parsed = (parse_forced_calls(text, tools, fmt) if forced else
              parse_tool_calls(text, tools, cut=finish == "length", fmt=fmt))
    if not parallel:
        parsed.tool_calls = parsed.tool_calls[:1]
    return parsed


def tool_message(text: str, finish: str | None, tools: list[dict] | None, parallel: bool = True,
                 forced: bool = False, fmt: ToolCallFormat = DEFAULT_FORMAT) -> tuple[dict, str | None]:
    """The assistant message of a whole response and its finish reason ("tool_calls" after calls that
    ended on their own; "length" stays)."""
    if tools is None:
        return {"role": "assistant", "content": text}, finish
    parsed = _parse(text, finish, tools, parallel, forced, fmt)
    message = {"role": "assistant", "content": parsed.content}
    if not parsed.tool_calls:
        return message, finish
    message["tool_calls"] = parsed.tool_calls
    return message, "tool_calls" if finish == "stop" else finish


class ToolStream:
    """Per-choice streaming of a chat output whose tool calls are parsed (see the module docstring)."""

    def __init__(self, tools: list[dict], parallel: bool = True, forced: bool = False, fmt: ToolCallFormat = DEFAULT_FORMAT):
        self.tools, self.parallel, self.forced, self.fmt = tools, parallel, forced, fmt

    def safe_length(self, text: str, sent: int) -> int:
        """Characters of `text` that may be sent as content before the output ends."""
        return sent if self.forced else max(sent, streamable_length(text, self.fmt))

    def final_deltas(self, text: str, sent: int, finish: str | None) -> tuple[list[dict], str | None]:
        """The deltas that finish a choice (the rest of the content, then one per tool call) and its
        finish reason; the last delta is the one to carry the finish reason."""
        parsed = _parse(text, finish, self.tools, self.parallel, self.forced, self.fmt)
        rest = (parsed.content or "")[sent:]  # `text` less its call blocks and any echoed tool result block
        deltas = [{"content": rest}] if rest else []
        for i, call in enumerate(parsed.tool_calls):
            deltas.append({"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                           "function": {"name": call["function"]["name"], "arguments": call["function"]["arguments"]}}]})
        if not parsed.tool_calls:
            return deltas or [{}], finish
        deltas.append({})
        return deltas, "tool_calls" if finish == "stop" else finish
