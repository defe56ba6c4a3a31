"""Forced tool calls by constrained decoding: `tool_choice` "required" or a named function -> a structural tag.

The output is then exactly the harness's blocks (`serving.tools.harness`), one per call:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}
    </tool_call>

Each offered function is one structure: begin `<tool_call>\\n{"name": "<name>", "arguments": `, its
`parameters` schema, end `}\\n</tool_call>` (the text `render_tool_call` writes). A named function
offers only its own structure and allows one call; "required" offers every tool and, with
`parallel_tool_calls`, up to `MAX_PARALLEL_CALLS` blocks written back to back. No separator is
allowed between blocks: SmolLM2 prefers a newline after `</tool_call>` to ending its turn, and with a
newline separator it went on calling until max_tokens; without one it ends after the calls it means to
make. "auto" and "none" are not constrained. The arguments are compact JSON (a whitespace run is one
space, no newline: the form `render_tool_call` shows the model in past calls), which saves the
tokens of pretty-printing (SmolLM2 wrote `{\\n    "city": ...` unconstrained).

An object schema that lists `properties` and leaves `additionalProperties` unsaid is closed
(additionalProperties false, OpenAI strict mode's rule): every output still validates against the
given schema, and a small model cannot invent properties until max_tokens (SmolLM2 did). A
`parameters` schema outside the automaton's subset (`serving.guided.schema`) is enforced as any JSON
object, as OpenAI's non-strict function calling promises no more; with `"strict": true` it is refused.

    tag = forced_tool_tag(tools, tool_choice, parallel_tool_calls)   # JSON text or None
    params = dataclasses.replace(params, structural_tag=tag)
    parsed = parse_forced_calls(output_text, forced_tools(tools, tool_choice))   # content None, the calls

A `parameters` schema no automaton can decode (nested deeper than `serving.guided.schema.MAX_SCHEMA_DEPTH`,
a `$ref` cycle that writes nothing, no finite document) is refused strict or not (`ToolSchemaError`,
naming `tools[i].function.parameters`): it is malformed, not merely beyond the subset.

A forced output always comes back as `tool_calls`, even when max_tokens cut it (`parse_forced_calls`).
Each function takes the harness format (`fmt`, a json-style `serving.tools.formats.ToolCallFormat`: its
block tags and keys); an xml-style format cannot be forced this way (`ToolCallFormat.can_force`).
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from serving.guided.automaton import JsonAutomaton, UnsupportedSchemaError
from serving.guided.checks import check_json_depth
from serving.guided.schema import InvalidSchemaError
from serving.tools.harness import (
    DEFAULT_FORMAT, ParsedOutput, ToolCallFormat, ToolFormatError, forced_tool_name, parse_tool_calls, tool_call,
    tool_functions,
)

MAX_PARALLEL_CALLS = 4


class ToolSchemaError(ToolFormatError):
    """A forced function's `parameters` that no automaton can decode; `param` names it (`tools[0].function.parameters`)."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


def call_structure(function: dict, fmt: ToolCallFormat = DEFAULT_FORMAT, param: str = "tools[].function.parameters") -> dict:
    """The structure {"begin", "schema", "end"} of one call to `function` (an OpenAI `function` object).

    Args:
        param: where the request holds `function`'s parameters, for errors (`tools[2].function.parameters`).
    Raises:
        ToolSchemaError: parameters no automaton can decode (`serving.guided.schema.InvalidSchemaError`).
        ToolFormatError: a strict function whose parameters schema the automaton cannot enforce.
    """
    schema = function.get("parameters")
    if not isinstance(schema, dict) or not schema or schema.get("type", "object") != "object":
        schema = {"type": "object"}  # arguments are always an object (the parser takes nothing else)
    elif "type" not in schema and not {"$ref", "anyOf", "enum", "const"} & set(schema):
        schema = {"type": "object", **schema}
    try:
        check_json_depth(schema)  # before `_closed` walks it recursively
        schema = _closed(schema)
        JsonAutomaton(schema)
    except InvalidSchemaError as exc:
        raise ToolSchemaError(f"{param}: {exc}", param) from None
    except UnsupportedSchemaError as exc:
        if function.get("strict") is True:
            raise ToolFormatError(f"tools: function {function['name']!r} is strict but its parameters cannot be "
                                  f"enforced on a local model: {exc}") from None
        schema = {"type": "object"}
    return {"begin": call_begin(function["name"], fmt), "schema": schema, "end": f"}}\n{fmt.call_close}"}


def call_begin(name: str, fmt: ToolCallFormat = DEFAULT_FORMAT) -> str:
    """The fixed text before a call's arguments: `<tool_call>\\n{"name": "<name>", "arguments": `.

    Raises:
        ToolFormatError: `fmt` is not of style json.
    """
    if not fmt.can_force:
        raise ToolFormatError(f"tool format {fmt.name!r} (style {fmt.style}) cannot force tool calls by constrained decoding")
    key, args = json.dumps(fmt.name_key, ensure_ascii=False), json.dumps(fmt.arguments_key, ensure_ascii=False)
    return f"{fmt.call_open}\n{{{key}: {json.dumps(name, ensure_ascii=False)}, {args}: "


def _closed(schema):
    """`schema` with additionalProperties false on every object schema that lists (all its required) properties
    and says nothing about others."""
    if isinstance(schema, list):
        return [_closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _closed(v) if k in ("items", "anyOf", "additionalProperties") else
           {name: _closed(s) for name, s in v.items()} if k in ("properties", "$defs", "definitions") and isinstance(v, dict)
           else v for k, v in schema.items()}
    props = out.get("properties")
    if isinstance(props, dict) and "additionalProperties" not in out and set(out.get("required", ())) <= set(props):
        out["additionalProperties"] = False
    return out


def forced_tools(tools: Sequence[dict] | None, tool_choice: Any) -> list[dict] | None:
    """The tools a forcing `tool_choice` lets the output call ("required": all; a named function: its own),
    or None when `tool_choice` does not force a call.

    Raises:
        ToolFormatError: malformed tools or tool_choice.
    """
    if not tools:
        return None
    name = forced_tool_name(tool_choice, tools)
    if name is None and tool_choice != "required":
        return None
    return [tool for tool, fn in zip(tools, tool_functions(tools)) if name is None or fn["name"] == name]


def forced_tool_tag(tools: Sequence[dict] | None, tool_choice: Any, parallel_tool_calls: bool = True,
                    fmt: ToolCallFormat = DEFAULT_FORMAT) -> str | None:
    """The `SamplingParams.structural_tag` (JSON text) that forces the calls `tool_choice` asks for, or None.

    Args:
        tools: OpenAI tools, [{"type": "function", "function": {"name", "parameters", ...}}].
        tool_choice: "required" or {"type": "function", "function": {"name"}} constrain; None, "auto"
            and "none" do not.
        parallel_tool_calls: False allows one call.
        fmt: the harness format (style json).
    Raises:
        ToolSchemaError: a forced function's parameters that no automaton can decode.
        ToolFormatError: malformed tools or tool_choice, a strict function that cannot be enforced, or a forcing
            tool_choice with a format that cannot be forced.
    """
    allowed = forced_tools(tools, tool_choice)
    if allowed is None:
        return None
    max_blocks = MAX_PARALLEL_CALLS if parallel_tool_calls and tool_choice == "required" else 1
    chosen = {id(tool) for tool in allowed}
    structures = [call_structure(fn, fmt, f"tools[{i}].function.parameters")
                  for i, (tool, fn) in enumerate(zip(tools, tool_functions(tools))) if id(tool) in chosen]
    return json.dumps({"structures": structures, "max_blocks": max_blocks, "separator": "", "whitespace": "compact"},
                      ensure_ascii=False)


def parse_forced_calls(text: str, tools: Sequence[dict], fmt: ToolCallFormat = DEFAULT_FORMAT) -> ParsedOutput:
    """The calls of a forced output: the blocks the tag allowed, the last one perhaps cut short (max_tokens).

    Whole blocks parse as usual. A block cut after its arguments closed (`}}\n</` with the end tag missing)
    is a whole call. A block cut inside its arguments is a call whose `arguments` is the text produced so far,
    incomplete JSON, as OpenAI returns it with finish_reason "length". A block cut inside its begin text is a
    call of the one allowed function whose begin it starts, with arguments ""; when several could still
    follow (max_tokens below a dozen) there is no call. The content is always None: the tag allows nothing
    but blocks, so the `<tool_call>` markup never reaches the client.

    Args:
        text: the model's output under `forced_tool_tag`.
        tools: the tools the tag allowed (`forced_tools`).
        fmt: the harness format the tag was built with.
    """
    parsed = parse_tool_calls(text, tools, cut=True, fmt=fmt)
    tail = ((parsed.content or "") if parsed.tool_calls else text).strip()
    calls = parsed.tool_calls
    if tail:
        functions = tool_functions(tools)
        begins = {fn["name"]: call_begin(fn["name"], fmt) for fn in functions}
        whole = [name for name, begin in begins.items() if tail.startswith(begin)]
        if whole:
            calls.append(tool_call(whole[0], _arguments_so_far(tail[len(begins[whole[0]]):])))
        elif len(started := [name for name, begin in begins.items() if begin.startswith(tail)]) == 1:
            calls.append(tool_call(started[0], ""))
    return ParsedOutput(None, calls)


def _arguments_so_far(text: str) -> str:
    """A cut call's arguments: the object re-serialized when it closed (as whole calls are), else the text as produced."""
    try:
        value, _ = json.JSONDecoder().raw_decode(text)
    except json.JSONDecodeError:
        return text
    return json.dumps(value, ensure_ascii=False) if isinstance(value, dict) else text
