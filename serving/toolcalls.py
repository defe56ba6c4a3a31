"""The tool-call harness format for local models (which have no native one), issues 4 and 8.

The offered tools go into the system turn (merged after an existing system message), one JSON schema
per line inside `<tools></tools>`. The model calls a function by writing one JSON object
`{"name": ..., "arguments": {...}}` inside a `<tool_call></tool_call>` block; parallel calls are
several blocks; "no call" is plain text with no block. Results come back in a user turn, one
`<tool_response name="..." tool_call_id="...">...</tool_response>` block per result. A user turn
(not a "tool" role) is used because many chat templates reject unknown roles or demand that user and
assistant alternate. Post-training (issue 8) trains on exactly this rendering.

    messages = render_messages(body["messages"], tools, tool_choice)   # -> the chat template
    parsed = parse_tool_calls(model_text, tools)                       # -> content, OpenAI tool_calls

An example model output with two calls:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>
    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Rome"}}
    </tool_call>
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any, Sequence

from serving.chat_format import message_text
from serving.errors import ServingError

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
RESPONSE_OPEN, RESPONSE_CLOSE = "<tool_response", "</tool_response>"


class ToolFormatError(ServingError):
    """Malformed `tools`, `tool_choice` or tool messages (the message names the field)."""


@dataclass
class ParsedOutput:
    """A model output split into text and OpenAI `tool_calls` ({"id", "type", "function": {"name", "arguments"}})."""

    content: str | None
    tool_calls: list[dict] = field(default_factory=list)


def tool_functions(tools: Sequence[dict] | None) -> list[dict]:
    """The `function` objects of OpenAI `tools`.

    Raises:
        ToolFormatError: a tool that is not {"type": "function", "function": {"name": str, ...}}.
    """
    functions = []
    for i, tool in enumerate(tools or ()):
        fn = tool.get("function") if isinstance(tool, dict) and tool.get("type", "function") == "function" else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ToolFormatError(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": ..., \"parameters\": ...}}}}")
        functions.append(fn)
    return functions


def forced_tool_name(tool_choice: Any, tools: Sequence[dict] | None) -> str | None:
    """The function name a tool_choice {"type": "function", "function": {"name"}} forces, else None.

    Raises:
        ToolFormatError: a tool_choice that is not none/auto/required or a named offered function.
    """
    if tool_choice in (None, "none", "auto", "required"):
        return None
    name = tool_choice.get("function", {}).get("name") if isinstance(tool_choice, dict) else None
    if not isinstance(name, str):
        raise ToolFormatError(f"tool_choice must be 'none', 'auto', 'required' or a named function, got {tool_choice!r}")
    if name not in {fn["name"] for fn in tool_functions(tools)}:
        raise ToolFormatError(f"tool_choice names the function {name!r}, which is not in tools")
    return name


def render_tools_system_prompt(tools: Sequence[dict], tool_choice: Any = "auto", parallel_tool_calls: bool = True) -> str:
    """The system-turn text that offers `tools` and says how to call them.

    Args:
        tools: OpenAI tools, [{"type": "function", "function": {"name", "description", "parameters"}}].
        tool_choice: "none", "auto" (or None), "required", or {"type": "function", "function": {"name"}}.
        parallel_tool_calls: False allows at most one call per reply.
    Raises:
        ToolFormatError: malformed tools or tool_choice.
    """
    forced = forced_tool_name(tool_choice, tools)
    lines = ["# Tools", "", "You can call these functions. Each line in <tools></tools> describes one:", "<tools>"]
    for fn in tool_functions(tools):
        entry = {"name": fn["name"], "description": fn.get("description", ""), "parameters": fn.get("parameters", {})}
        lines.append(json.dumps(entry, ensure_ascii=False))
    lines += ["</tools>", "",
              "To call a function, write a JSON object with its name and arguments inside a tool_call block:",
              CALL_OPEN, '{"name": "<function name>", "arguments": {<argument name>: <value>, ...}}', CALL_CLOSE]
    if parallel_tool_calls and tool_choice != "none":
        lines.append("To call several functions at once, write one block per call.")
    lines.append("Results come back in <tool_response></tool_response> blocks.")
    if tool_choice == "none":
        lines.append("In this reply do not call any function: answer in plain text.")
    elif tool_choice == "required":
        lines.append("In this reply you must call at least one function; write only tool_call blocks.")
    elif forced is not None:
        lines.append(f"In this reply you must call the function {forced}; write only its tool_call block.")
    else:
        lines.append("Call a function when it helps; otherwise answer in plain text with no block.")
    if not parallel_tool_calls and tool_choice != "none":
        lines.append("Call at most one function in a reply.")
    return "\n".join(lines)


def render_tool_call(name: str, arguments: Any) -> str:
    """One call in the harness format; `arguments` is a dict or an OpenAI JSON-string of one."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            pass  # kept as the string it is, so the model sees what was sent
    return f"{CALL_OPEN}\n{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}\n{CALL_CLOSE}"


def with_system_text(messages: Sequence[dict], text: str) -> list[dict]:
    """`messages` with `text` appended to the first system (or developer) message, or in a new first one."""
    out = [dict(m) for m in messages]
    for m in out:
        if isinstance(m, dict) and m.get("role") in ("system", "developer"):
            m["content"] = f"{message_text(m.get('content')).rstrip()}\n\n{text}"
            return out
    return [{"role": "system", "content": text}, *out]


def render_messages(messages: Sequence[dict], tools: Sequence[dict] | None, tool_choice: Any = "auto",
                    parallel_tool_calls: bool = True) -> list[dict]:
    """OpenAI chat messages with tools -> plain {"role", "content"} messages for the chat template.

    Assistant `tool_calls` become tool_call blocks after the assistant's text; consecutive `tool`
    results become one user turn of tool_response blocks, named by the call they answer.

    Raises:
        ToolFormatError: malformed tools/tool_choice, or a tool message without `tool_call_id`.
    """
    names: dict[str, str] = {}
    out: list[dict] = []
    for i, m in enumerate(messages):
        role = m.get("role") if isinstance(m, dict) else None
        if role == "assistant" and m.get("tool_calls"):
            blocks = [message_text(m.get("content")).rstrip()] if message_text(m.get("content")).strip() else []
            for call in m["tool_calls"]:
                fn = call.get("function", {}) if isinstance(call, dict) else {}
                names[call.get("id", "")] = fn.get("name", "")
                blocks.append(render_tool_call(fn.get("name", ""), fn.get("arguments", {})))
            out.append({"role": "assistant", "content": "\n".join(blocks)})
        elif role == "tool":
            call_id = m.get("tool_call_id")
            if not isinstance(call_id, str):
                raise ToolFormatError(f"messages[{i}] has role 'tool' but no tool_call_id")
            name = m.get("name") or names.get(call_id, "")
            block = f'{RESPONSE_OPEN} name="{name}" tool_call_id="{call_id}">\n{message_text(m.get("content"))}\n{RESPONSE_CLOSE}'
            if out and out[-1].get("is_tool_result"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "is_tool_result": True})
        else:
            out.append({k: v for k, v in m.items() if k in ("role", "content")} if isinstance(m, dict) else m)
    out = [{k: v for k, v in m.items() if k != "is_tool_result"} if isinstance(m, dict) else m for m in out]
    if tools:
        out = with_system_text(out, render_tools_system_prompt(tools, tool_choice, parallel_tool_calls))
    return out


def _calls_in_block(body: str, names: set[str] | None) -> list[dict] | None:
    """The calls in one block's text, or None when it is not a well-formed call (or list of calls)."""
    try:
        value = json.loads(body)
    except json.JSONDecodeError:
        return None
    items = value if isinstance(value, list) and value else [value]
    calls = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
            return None
        args = item.get("arguments", item.get("parameters", {}))
        if isinstance(args, str):  # an OpenAI-style JSON string of the arguments
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                return None
        if not isinstance(args, dict) or (names is not None and item["name"] not in names):
            return None
        calls.append(tool_call(item["name"], json.dumps(args, ensure_ascii=False)))
    return calls


def tool_call(name: str, arguments: str) -> dict:
    """One OpenAI tool call with a fresh id; `arguments` is JSON text (OpenAI's wire form)."""
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function", "function": {"name": name, "arguments": arguments}}


def _without_cut_close(body: str) -> str:
    """An unclosed block's body less the start of a `</tool_call>` (and whitespace) that ends it."""
    body = body.rstrip()
    for k in range(len(CALL_CLOSE) - 1, 0, -1):
        if body.endswith(CALL_CLOSE[:k]):
            return body[:-k].rstrip()
    return body


def parse_tool_calls(text: str, tools: Sequence[dict] | None = None, *, cut: bool = False) -> ParsedOutput:
    """Split a model output into content and OpenAI `tool_calls`; never raises on model text.

    A block whose body is not a JSON call object (or a list of them), or that names a function not in
    `tools` (when given), stays in the content verbatim, as does an unclosed `<tool_call>` (unless `cut`).
    Without any call the content is `text` unchanged; with calls it is the text outside the accepted blocks
    (whitespace next to a block trimmed, pieces joined by newlines), or None when that is empty.

    Args:
        text: the model's output.
        tools: the offered OpenAI tools, to check names against; None accepts any name.
        cut: the output was cut short (max_tokens): a last block whose body is already a whole call, only
            its `</tool_call>` (or the end of it) missing, is a call too. An output that ended on its own
            without closing the block is not trusted that far.
    Raises:
        ToolFormatError: only for malformed `tools`.
    """
    names = None if tools is None else {fn["name"] for fn in tool_functions(tools)}
    calls: list[dict] = []
    pieces: list[str] = []  # the text between accepted blocks (rejected blocks included verbatim)
    pos, current = 0, ""
    while (start := text.find(CALL_OPEN, pos)) >= 0:
        end = text.find(CALL_CLOSE, start + len(CALL_OPEN))
        if end < 0:
            found = _calls_in_block(_without_cut_close(text[start + len(CALL_OPEN):]), names) if cut else None
            if found is not None:
                pieces.append(current + text[pos:start])
                current, pos = "", len(text)
                calls.extend(found)
            break
        found = _calls_in_block(text[start + len(CALL_OPEN):end], names)
        if found is None:
            current += text[pos:end + len(CALL_CLOSE)]
        else:
            pieces.append(current + text[pos:start])
            current = ""
            calls.extend(found)
        pos = end + len(CALL_CLOSE)
    if not calls:
        return ParsedOutput(text, [])
    pieces.append(current + text[pos:])
    # Trim only the whitespace next to blocks, so streamed content (sent before the first block) is a prefix.
    pieces = [p.rstrip() if i == 0 else p.lstrip() if i == len(pieces) - 1 else p.strip() for i, p in enumerate(pieces)]
    content = "\n".join(p for p in pieces if p)
    return ParsedOutput(content or None, calls)


def streamable_length(text: str) -> int:
    """How many leading characters of a growing output are surely content: everything before a
    `<tool_call>` tag (or a suffix that could start one), less the whitespace that would be trimmed."""
    start = text.find(CALL_OPEN)
    if start < 0:
        start = len(text)
        for k in range(min(len(CALL_OPEN) - 1, len(text)), 0, -1):
            if text.endswith(CALL_OPEN[:k]):
                start -= k
                break
    return len(text[:start].rstrip())
