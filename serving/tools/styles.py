"""The call styles of the tool-call harness formats: how one call is written and read back.

- "json" (Hermes-like, the default): one JSON object `{"name": "f", "arguments": {...}}` (the keys are
  configurable) per block; a block may also hold a JSON list of such objects.
- "xml" (the call style of Qwen3-Coder's template):

      <function=get_weather>
      <parameter=city>
      Paris
      </parameter>
      <parameter=days>
      3
      </parameter>
      </function>

  A value sits between one newline after `<parameter=p>` and one before `</parameter>`. A parameter whose
  schema declares `"type": "string"` (or a string enum) is plain text; a parameter of any other declared type
  is JSON text (numbers, booleans, null; objects and arrays JSON-encoded); an undeclared or untyped parameter
  is plain text unless the string itself reads as JSON, then it is JSON-quoted (so "42" the string comes
  back a string). Names must fit the tag syntax: no whitespace, `<`, `>`, `=` or `/` (`check_xml_tools`).

Both readers return OpenAI tool calls (`tool_call`) or None for text that is not a well-formed call of an
offered function; neither raises on model text. `serving.tools.formats.ToolCallFormat` picks the style.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any, Sequence

from serving.errors import ServingError

_XML_NAME = re.compile(r"[^\s<>=/]+")  # a function or parameter name inside `<function=...>` / `<parameter=...>`
_XML_FUNCTION = re.compile(r"<function=([^\s<>=/]+)>")
_XML_PARAMETER = re.compile(r"<parameter=([^\s<>=/]+)>")
SCALAR_TYPES = ("string", "integer", "number", "boolean")


class ToolFormatError(ServingError):
    """Malformed `tools`, `tool_choice`, tool messages or format config, or a schema the format cannot carry
    (the message names the field, tool or parameter)."""


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


def tool_call(name: str, arguments: str) -> dict:
    """One OpenAI tool call with a fresh id; `arguments` is JSON text (OpenAI's wire form)."""
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function", "function": {"name": name, "arguments": arguments}}


def parameter_schemas(tools: Sequence[dict] | None) -> dict[str, dict] | None:
    """Function name -> its parameters' `properties` ({} when it lists none); None when `tools` is None.

    Raises:
        ToolFormatError: malformed tools.
    """
    if tools is None:
        return None
    out = {}
    for fn in tool_functions(tools):
        params = fn.get("parameters")
        props = params.get("properties") if isinstance(params, dict) else None
        out[fn["name"]] = props if isinstance(props, dict) else {}
    return out


def declared_type(schema: Any) -> str | None:
    """The single JSON type a parameter schema declares ("string", "integer", ...; a string enum is "string"), else None."""
    if not isinstance(schema, dict):
        return None
    kind = schema.get("type")
    if isinstance(kind, str):
        return kind
    values = schema.get("enum", [schema["const"]] if "const" in schema else None)
    if isinstance(values, list) and values and all(isinstance(v, str) for v in values):
        return "string"
    return None


def _reads_as_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def json_calls(body: str, schemas: dict | None, name_key: str = "name", arguments_key: str = "arguments") -> list[dict] | None:
    """The calls in a json-style block body (one object or a non-empty list of them), or None.

    `arguments` may also be under "parameters" or be a JSON string of the object. `schemas`
    (`parameter_schemas`) limits the names; None accepts any.
    """
    try:
        value = json.loads(body)
    except json.JSONDecodeError:
        return None
    items = value if isinstance(value, list) and value else [value]
    calls = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get(name_key), str) or not item[name_key]:
            return None
        args = item.get(arguments_key, item.get("parameters", {}))
        if isinstance(args, str):  # an OpenAI-style JSON string of the arguments
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                return None
        if not isinstance(args, dict) or (schemas is not None and item[name_key] not in schemas):
            return None
        calls.append(tool_call(item[name_key], json.dumps(args, ensure_ascii=False)))
    return calls


def xml_call(name: str, arguments: dict, properties: dict) -> str:
    """One `<function=name>` element; `properties` types the values (see the module docstring)."""
    lines = [f"<function={name}>"]
    for key, value in arguments.items():
        kind = declared_type(properties.get(key))
        plain = isinstance(value, str) and (kind == "string" or (kind is None and not _reads_as_json(value)))
        lines += [f"<parameter={key}>", value if plain else json.dumps(value, ensure_ascii=False), "</parameter>"]
    return "\n".join(lines + ["</function>"])


def xml_calls(text: str, schemas: dict | None) -> list[dict] | None:
    """The calls of one or more `<function=...>` elements with only whitespace around and between them, or None."""
    calls, pos = [], 0
    while (pos := _skip_space(text, pos)) < len(text):
        head = _XML_FUNCTION.match(text, pos)
        if head is None or (schemas is not None and head.group(1) not in schemas):
            return None
        name, known, args, pos = head.group(1), (schemas or {}).get(head.group(1), {}), {}, head.end()
        while not text.startswith("</function>", pos := _skip_space(text, pos)):
            param = _XML_PARAMETER.match(text, pos)
            end = text.find("</parameter>", pos) if param else -1
            if end < 0:
                return None
            value = text[param.end():end]
            value = value[1:] if value.startswith("\n") else value
            value = value[:-1] if value.endswith("\n") else value
            args[param.group(1)] = _xml_value(value, declared_type(known.get(param.group(1))))
            pos = end + len("</parameter>")
        calls.append(tool_call(name, json.dumps(args, ensure_ascii=False)))
        pos += len("</function>")
    return calls or None


def _xml_value(text: str, kind: str | None) -> Any:
    """A parameter's value from its text: plain text for strings, else JSON (the text itself when it is not JSON)."""
    if kind == "string":
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def check_xml_tools(tools: Sequence[dict] | None, format_name: str, scalars_only: bool) -> None:
    """Refuse tools the xml style cannot write and read back.

    Raises:
        ToolFormatError: malformed tools; a function or parameter name with whitespace, `<`, `>`, `=` or `/`;
            with `scalars_only`, a parameter whose declared type is not string/integer/number/boolean.
    """
    for i, fn in enumerate(tool_functions(tools)):
        if not _XML_NAME.fullmatch(fn["name"]):
            raise ToolFormatError(f"tools[{i}]: the function name {fn['name']!r} cannot be written as <function=...> in the "
                                  f"{format_name!r} tool format; rename it without whitespace, < > = /")
        for key, schema in parameter_schemas([tools[i]])[fn["name"]].items():
            if not _XML_NAME.fullmatch(key):
                raise ToolFormatError(f"tools[{i}] ({fn['name']}): the parameter name {key!r} cannot be written as "
                                      f"<parameter=...> in the {format_name!r} tool format; rename it without whitespace, < > = /")
            kind = declared_type(schema)
            if scalars_only and kind not in SCALAR_TYPES:
                raise ToolFormatError(f"tools[{i}] ({fn['name']}): parameter {key!r} has type {kind or 'unspecified'}, which "
                                      f"the {format_name!r} tool format (nested_values: refuse) cannot write as plain text; "
                                      f"give it a scalar type ({', '.join(SCALAR_TYPES)}) or use nested_values: json")
