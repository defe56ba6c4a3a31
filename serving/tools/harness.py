"""The tool-call harness for local models (which have no native one).

Everything model-visible goes through a `serving.tools.formats.ToolCallFormat` (`fmt`, default
`DEFAULT_FORMAT`, the format below, unchanged since the harness began); a link.yaml local model may name
another (`tool_format: xml`). Post-training renders traces with the same functions, so a
fine-tuned model sees at serving exactly what it was trained on.

The default: the offered tools go into the system turn (merged after an existing system message), one
JSON schema per line inside `<tools></tools>`. The model calls a function by writing one JSON object
`{"name": ..., "arguments": {...}}` inside a `<tool_call></tool_call>` block; parallel calls are
several blocks; "no call" is plain text with no block. Results come back in a user turn, one
`<tool_response name="..." tool_call_id="...">...</tool_response>` block per result. A user turn
(not a "tool" role) is used because many chat templates reject unknown roles or demand that user and
assistant alternate. A model that goes on to write such a block itself is echoing the harness: after a
tool result generation goes on past such blocks written first and stops at one written after answer text
(`serving.engine.stop`), and `parse_tool_calls` cuts any result block from the answer (`strip_tool_results`).

    messages = render_messages(body["messages"], tools, tool_choice, fmt=fmt)   # -> the chat template
    parsed = parse_tool_calls(model_text, tools, fmt=fmt)                      # -> content, OpenAI tool_calls
    messages = render_messages(trace_messages, tools, fmt=fmt, strict=True)    # training: refuses what
                                                                               # would not parse back

An example model output with two calls:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>
    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Rome"}}
    </tool_call>
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from typing import Any, Sequence

from serving.text.chat_format import message_text
from serving.tools.formats import DEFAULT_FORMAT, ToolCallFormat
from serving.tools.styles import ToolFormatError, tool_call, tool_functions  # re-exported: callers import them from here

__all__ = ["CALL_OPEN", "CALL_CLOSE", "DEFAULT_FORMAT", "ParsedOutput", "ToolCallFormat", "ToolFormatError",
           "forced_tool_name", "parse_tool_calls", "render_messages", "render_tool_call", "render_tools_system_prompt",
           "streamable_length", "strip_tool_results", "tool_call", "tool_functions", "with_system_text"]

CALL_OPEN, CALL_CLOSE = DEFAULT_FORMAT.call_open, DEFAULT_FORMAT.call_close


@dataclass
class ParsedOutput:
    """A model output split into text and OpenAI `tool_calls` ({"id", "type", "function": {"name", "arguments"}})."""

    content: str | None
    tool_calls: list[dict] = field(default_factory=list)


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


def render_tools_system_prompt(tools: Sequence[dict], tool_choice: Any = "auto", parallel_tool_calls: bool = True,
                               *, fmt: ToolCallFormat = DEFAULT_FORMAT) -> str:
    """The system-turn text that offers `tools` and says how to call them (`fmt.system_template`).

    Args:
        tools: OpenAI tools, [{"type": "function", "function": {"name", "description", "parameters"}}].
        tool_choice: "none", "auto" (or None), "required", or {"type": "function", "function": {"name"}}.
        parallel_tool_calls: False allows at most one call per reply.
        fmt: the harness format.
    Raises:
        ToolFormatError: malformed tools or tool_choice.
    """
    forced = forced_tool_name(tool_choice, tools)
    if tool_choice == "none":
        choice = "In this reply do not call any function: answer in plain text."
    elif tool_choice == "required":
        choice = f"In this reply you must call at least one function; write only {fmt.block} blocks."
    elif forced is not None:
        choice = f"In this reply you must call the function {forced}; write only its {fmt.block} block."
    else:
        choice = "Call a function when it helps; otherwise answer in plain text with no block."
    if not parallel_tool_calls and tool_choice != "none":
        choice += "\nCall at most one function in a reply."
    parallel = "To call several functions at once, write one block per call." if parallel_tool_calls and tool_choice != "none" else ""
    return fmt.render_system_prompt(tool_functions(tools), choice, parallel)


def render_tool_call(name: str, arguments: Any, tools: Sequence[dict] | None = None, *,
                     fmt: ToolCallFormat = DEFAULT_FORMAT) -> str:
    """One call in the harness format; `arguments` is a dict or an OpenAI JSON-string of one. `tools` gives
    the parameter types the xml style needs (`ToolCallFormat.render_call`)."""
    return fmt.render_call(name, arguments, tools)


def with_system_text(messages: Sequence[dict], text: str) -> list[dict]:
    """`messages` with `text` appended to the first system (or developer) message, or in a new first one."""
    out = [dict(m) for m in messages]
    for m in out:
        if isinstance(m, dict) and m.get("role") in ("system", "developer"):
            m["content"] = f"{message_text(m.get('content')).rstrip()}\n\n{text}"
            return out
    return [{"role": "system", "content": text}, *out]


def native_tool_format(chat_format: Any, fmt: ToolCallFormat) -> ToolCallFormat | None:
    """The format a server parses replies with when `chat_format`'s template renders the tools itself, else None.

    Native: the template reads `tools` (`TemplateChatFormat.renders_tools`, Qwen2.5's) and `fmt` is the default
    format, whose `<tool_call>` JSON blocks are that template's own call syntax. Then the messages go through
    `render_messages(..., native=True)` and the tools to `chat_format.render(messages, tools=...)` (unless
    tool_choice is "none"). The returned format reads a reply that is only a Markdown code block holding a call, or
    only the call's JSON without its tags, as that call (`fenced_calls="call"`): unforced, Qwen2.5-Coder often
    writes its call those ways. The engine's chat path
    (`serving.frontend.responses.plan_chat`) and post-training (`posttrain.dataset`) both decide here.
    """
    if getattr(chat_format, "renders_tools", False) and fmt == DEFAULT_FORMAT:
        return dataclasses.replace(fmt, fenced_calls="call")
    return None


def render_messages(messages: Sequence[dict], tools: Sequence[dict] | None, tool_choice: Any = "auto",
                    parallel_tool_calls: bool = True, *, fmt: ToolCallFormat = DEFAULT_FORMAT,
                    strict: bool = False, native: bool = False) -> list[dict]:
    """OpenAI chat messages with tools -> plain {"role", "content"} messages for the chat template.

    Assistant `tool_calls` become call blocks after the assistant's text; consecutive `tool` results
    become one user turn of result blocks, named by the call they answer.

    Args:
        messages: OpenAI chat messages (assistant turns may carry `tool_calls`, "tool" turns `tool_call_id`).
        tools: OpenAI tools (None or empty: no system text is added).
        tool_choice, parallel_tool_calls: as in `render_tools_system_prompt`.
        fmt: the harness format.
        strict: training data: also refuse tools the format cannot carry (`fmt.check_tools`) and any assistant
            turn that `parse_tool_calls` would not read back as the same content and calls.
        native: the chat template renders tools itself (`TemplateChatFormat.renders_tools`, Qwen2.5's, whose
            calls are the default format's): no system text is added (the template gets `tools`) and each
            result stays a {"role": "tool", "content"} message for the template to wrap.
    Raises:
        ToolFormatError: malformed tools/tool_choice, a tool message without `tool_call_id`; with `strict`, the
            first tool or turn (`messages[i]`) that does not round-trip.
    """
    if strict:
        fmt.check_tools(tools)
    names: dict[str, str] = {}
    out: list[dict] = []
    for i, m in enumerate(messages):
        role = m.get("role") if isinstance(m, dict) else None
        if role == "assistant" and m.get("tool_calls"):
            text = message_text(m.get("content"))
            blocks = [text.rstrip()] if text.strip() else []
            for call in m["tool_calls"]:
                fn = call.get("function", {}) if isinstance(call, dict) else {}
                names[call.get("id", "")] = fn.get("name", "")
                blocks.append(fmt.render_call(fn.get("name", ""), fn.get("arguments", {}), tools))
            out.append({"role": "assistant", "content": "\n".join(blocks)})
            if strict:
                _check_round_trip(i, text, m["tool_calls"], out[-1]["content"], tools, fmt)
        elif role == "tool":
            call_id = m.get("tool_call_id")
            if not isinstance(call_id, str):
                raise ToolFormatError(f"messages[{i}] has role 'tool' but no tool_call_id")
            if native:
                out.append({"role": "tool", "content": message_text(m.get("content"))})
                continue
            block = fmt.render_result(m.get("name") or names.get(call_id, ""), call_id, message_text(m.get("content")))
            if out and out[-1].get("is_tool_result"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "is_tool_result": True})
        else:
            out.append({k: v for k, v in m.items() if k in ("role", "content")} if isinstance(m, dict) else m)
    out = [{k: v for k, v in m.items() if k != "is_tool_result"} if isinstance(m, dict) else m for m in out]
    if tools and not native:
        out = with_system_text(out, render_tools_system_prompt(tools, tool_choice, parallel_tool_calls, fmt=fmt))
    return out


def _canonical(arguments: Any) -> str | None:
    """Arguments (a dict or OpenAI JSON text) as sorted JSON text, None when they are not a JSON object."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return None
    return json.dumps(arguments, sort_keys=True, ensure_ascii=False) if isinstance(arguments, dict) else None


def _check_round_trip(i: int, text: str, calls: list, rendered: str, tools, fmt: ToolCallFormat) -> None:
    """Raise unless `rendered` (assistant turn `messages[i]`) parses back to `text` and `calls`."""
    parsed = parse_tool_calls(rendered, tools, fmt=fmt)
    want = [(c.get("function", {}).get("name"), _canonical(c.get("function", {}).get("arguments", {})))
            for c in calls if isinstance(c, dict)]
    got = [(c["function"]["name"], _canonical(c["function"]["arguments"])) for c in parsed.tool_calls]
    if len(want) != len(calls) or any(a is None for _, a in want):
        raise ToolFormatError(f"messages[{i}].tool_calls: each call needs a function name and arguments that are a JSON object")
    if got != want or parsed.content != (text.rstrip() or None):
        bad = next((j for j, w in enumerate(want) if j >= len(got) or got[j] != w), None)
        what = f"tool_calls[{bad}] ({want[bad][0]}, arguments {want[bad][1]})" if bad is not None else "content"
        raise ToolFormatError(f"messages[{i}].{what} does not survive the {fmt.name!r} tool format: the model's text "
                              f"would not parse back to it (a value holding the format's tags, a name the tools do not "
                              f"offer, or a value of the wrong type); fix or drop this trace")


def parse_tool_calls(text: str, tools: Sequence[dict] | None = None, *, cut: bool = False,
                     fmt: ToolCallFormat = DEFAULT_FORMAT) -> ParsedOutput:
    """Split a model output into content and OpenAI `tool_calls`; never raises on model text.

    Tool result blocks the model wrote (echoing the harness, `strip_tool_results`) are cut first.
    A block whose body is not a call (or a list of calls, style json), or that names a function not in
    `tools` (when given), stays in the content verbatim, as does an unclosed block (unless `cut`).
    Without any call the content is that text; with calls it is the text outside the accepted blocks
    (whitespace next to a block trimmed, pieces joined by newlines), or None when that is empty.

    Args:
        text: the model's output.
        tools: the offered OpenAI tools, to check names against (and, style xml, to type values); None accepts
            any name.
        cut: the output was cut short (max_tokens): a last block whose body is already a whole call, only
            its close tag (or the end of it) missing, is a call too. An output that ended on its own
            without closing the block is not trusted that far.
        fmt: the harness format.
    Raises:
        ToolFormatError: only for malformed `tools`.
    """
    if tools is not None:
        tool_functions(tools)
    text = strip_tool_results(text, fmt)
    opener, closer = fmt.block_open, fmt.block_close
    calls: list[dict] = []
    pieces: list[str] = []  # the text between accepted blocks (rejected blocks included verbatim)
    pos, current = 0, ""
    while (start := text.find(opener, pos)) >= 0:
        end = text.find(closer, start + len(opener))
        if end < 0:
            found = fmt.parse_block(_without_cut_close(text[start + len(opener):], closer), tools) if cut else None
            if found is not None:
                pieces.append(current + text[pos:start])
                current, pos = "", len(text)
                calls.extend(found)
            break
        found = fmt.parse_block(text[start + len(opener):end], tools)
        if found is None:
            current += text[pos:end + len(closer)]
        else:
            pieces.append(current + text[pos:start])
            current = ""
            calls.extend(found)
        pos = end + len(closer)
    if not calls:
        found = None
        if fmt.fenced_calls == "call":  # one code block holding a call, or the call's JSON bare
            fenced = _FENCED.fullmatch(text)
            body = fenced.group(1) if fenced else text.strip() if text.strip().startswith("{") else None
            found = fmt.parse_block(body, tools) if body else None
        return ParsedOutput(None, found) if found else ParsedOutput(text, [])
    pieces.append(current + text[pos:])
    # Trim only the whitespace next to blocks, so streamed content (sent before the first block) is a prefix.
    pieces = [p.rstrip() if i == 0 else p.lstrip() if i == len(pieces) - 1 else p.strip() for i, p in enumerate(pieces)]
    content = "\n".join(p for p in pieces if p)
    return ParsedOutput(content or None, calls)


_FENCED = re.compile(r"\s*```(?:json)?[ \t]*\n(.*?)\n[ \t]*```\s*", re.DOTALL)  # a reply that is one code block


def _without_cut_close(body: str, closer: str = CALL_CLOSE) -> str:
    """An unclosed block's body less the start of its close tag (and whitespace) that ends it."""
    body = body.rstrip()
    for k in range(len(closer) - 1, 0, -1):
        if body.endswith(closer[:k]):
            return body[:-k].rstrip()
    return body


def strip_tool_results(text: str, fmt: ToolCallFormat = DEFAULT_FORMAT) -> str:
    """`text` less every tool result block in it (`fmt.result_open` ... `fmt.result_close`, an unclosed one to the
    end, and any stray closing marker): a model that writes one after a tool result is echoing the harness's
    rendering, not answering. The text before a block is kept, whitespace next to a block trimmed, pieces joined
    by newlines; `text` is returned unchanged when it holds no marker (or the format's results have no opening
    marker)."""
    opener, closer = fmt.result_open, fmt.result_close
    if not opener or (opener not in text and not (closer and closer in text)):
        return text
    pieces, pos = [], 0
    while (start := text.find(opener, pos)) >= 0:
        pieces.append(text[pos:start])
        end = text.find(closer, start + len(opener)) if closer else -1
        pos = len(text) if end < 0 else end + len(closer)
    pieces.append(text[pos:])
    pieces = [p.replace(closer, "") for p in pieces] if closer else pieces  # a stray closing marker: echoed too
    pieces = [p.rstrip() if i == 0 else p.lstrip() if i == len(pieces) - 1 else p.strip() for i, p in enumerate(pieces)]
    return "\n".join(p for p in pieces if p)


def streamable_length(text: str, fmt: ToolCallFormat = DEFAULT_FORMAT) -> int:
    """How many leading characters of a growing output are surely content: everything before a call block's
    or a tool result block's open tag (or a suffix that could start one), less the whitespace that would be
    trimmed. With `fmt.fenced_calls` "call", nothing while the output may still be one code block holding a call."""
    head = text.lstrip()
    if fmt.fenced_calls == "call" and (head.startswith("```") or "```".startswith(head)) and not _closed_fence(head):
        return 0
    if fmt.fenced_calls == "call" and head.startswith("{"):  # maybe a bare call: known only once the output ends
        return 0
    return min(len(text[:_held_from(text, opener)].rstrip())
               for opener in (fmt.block_open, fmt.result_open, fmt.result_close) if opener)


def _closed_fence(head: str) -> bool:
    """Whether text opening with a code fence has gone on past the block's closing fence (so it is content)."""
    close = head.find("\n```", 3)
    return close >= 0 and bool(head[close + 4:].strip())


def _held_from(text: str, opener: str) -> int:
    """Where `opener` first starts in `text`, else where a suffix of `text` that could start it begins, else len(text)."""
    start = text.find(opener)
    if start >= 0:
        return start
    for k in range(min(len(opener) - 1, len(text)), 0, -1):
        if text.endswith(opener[:k]):
            return len(text) - k
    return len(text)
