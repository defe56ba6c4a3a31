"""Forced tool calls by constrained decoding: `tool_choice` "required" or a named function -> a structural tag.

The output is then exactly the harness's blocks (`serving.toolcalls`), one per call:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}
    </tool_call>

Each offered function is one structure: begin `<tool_call>\\n{"name": "<name>", "arguments": `, its
`parameters` schema, end `}\\n</tool_call>` (the text `render_tool_call` writes). A named function
offers only its own structure and allows one call; "required" offers every tool and, with
`parallel_tool_calls`, up to `MAX_PARALLEL_CALLS` blocks written back to back. No separator is
allowed between blocks: SmolLM2 prefers a newline after `</tool_call>` to ending its turn, and with a
newline separator it went on calling until max_tokens; without one it ends after the calls it means to
make. "auto" and "none" are not constrained.

An object schema that lists `properties` and leaves `additionalProperties` unsaid is closed
(additionalProperties false, OpenAI strict mode's rule): every output still validates against the
given schema, and a small model cannot invent properties until max_tokens (SmolLM2 did). A
`parameters` schema outside the automaton's subset (`serving.guided_schema`) is enforced as any JSON
object, as OpenAI's non-strict function calling promises no more; with `"strict": true` it is refused.

    tag = forced_tool_tag(tools, tool_choice, parallel_tool_calls)   # JSON text or None
    params = dataclasses.replace(params, structural_tag=tag)
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from serving.guided_json import JsonAutomaton, UnsupportedSchemaError
from serving.toolcalls import CALL_CLOSE, CALL_OPEN, ToolFormatError, forced_tool_name, tool_functions

MAX_PARALLEL_CALLS = 4


def call_structure(function: dict) -> dict:
    """The structure {"begin", "schema", "end"} of one call to `function` (an OpenAI `function` object).

    Raises:
        ToolFormatError: a strict function whose parameters schema the automaton cannot enforce.
    """
    schema = function.get("parameters")
    if not isinstance(schema, dict) or not schema or schema.get("type", "object") != "object":
        schema = {"type": "object"}  # arguments are always an object (the parser takes nothing else)
    elif "type" not in schema and not {"$ref", "anyOf", "enum", "const"} & set(schema):
        schema = {"type": "object", **schema}
    schema = _closed(schema)
    try:
        JsonAutomaton(schema)
    except UnsupportedSchemaError as exc:
        if function.get("strict") is True:
            raise ToolFormatError(f"tools: function {function['name']!r} is strict but its parameters cannot be "
                                  f"enforced on a local model: {exc}") from None
        schema = {"type": "object"}
    begin = f"{CALL_OPEN}\n{{\"name\": {json.dumps(function['name'], ensure_ascii=False)}, \"arguments\": "
    return {"begin": begin, "schema": schema, "end": f"}}\n{CALL_CLOSE}"}


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


def forced_tool_tag(tools: Sequence[dict] | None, tool_choice: Any, parallel_tool_calls: bool = True) -> str | None:
    """The `SamplingParams.structural_tag` (JSON text) that forces the calls `tool_choice` asks for, or None.

    Args:
        tools: OpenAI tools, [{"type": "function", "function": {"name", "parameters", ...}}].
        tool_choice: "required" or {"type": "function", "function": {"name"}} constrain; None, "auto"
            and "none" do not.
        parallel_tool_calls: False allows one call.
    Raises:
        ToolFormatError: malformed tools or tool_choice, or a strict function that cannot be enforced.
    """
    if not tools:
        return None
    name = forced_tool_name(tool_choice, tools)
    if name is None and tool_choice != "required":
        return None
    functions = [fn for fn in tool_functions(tools) if name is None or fn["name"] == name]
    max_blocks = MAX_PARALLEL_CALLS if parallel_tool_calls and name is None else 1
    return json.dumps({"structures": [call_structure(fn) for fn in functions], "max_blocks": max_blocks, "separator": ""},
                      ensure_ascii=False)
