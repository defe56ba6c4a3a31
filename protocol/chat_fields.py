"""Strict checks of a chat request's nested objects, as OpenAI makes them: messages and their content parts,
assistant tool calls, tools, tool_choice, parallel_tool_calls and response_format.

An unknown key, a missing required key, a wrong type or an unknown `type` value is a 400 whose `param` is
the client's field path (`messages[0].content[1].type`, `tools[0].function.name`); each check raises a
`PydanticCustomError` carrying that path in `ctx.param` (read by `protocol.errors.describe_errors`). What OpenAI
accepts passes: `name` on system, developer, user (and tool) messages; `refusal`, `audio`, `function_call`
and `annotations` on assistant messages (a response's message may be sent back as is); a null optional
field counts as absent; image, audio and file parts (a local model refuses them later, naming the part:
`serving/frontend/responses.py`). Tool and JSON-schema names follow OpenAI's pattern `^[a-zA-Z0-9_-]{1,64}$`.
`tool_choice` and `parallel_tool_calls` need `tools` (OpenAI rejects them without, "none" included), and
`tools` may not be empty.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic_core import PydanticCustomError

CHAT_ROLES = ("system", "developer", "user", "assistant", "tool", "function")
_PLAIN = frozenset({"role", "content", "name"})
MESSAGE_KEYS = {"system": _PLAIN, "developer": _PLAIN, "user": _PLAIN, "function": _PLAIN,
                "assistant": _PLAIN | {"tool_calls", "function_call", "refusal", "audio", "annotations"},
                "tool": _PLAIN | {"tool_call_id"}}
PART_TYPES = {"system": ("text",), "developer": ("text",), "user": ("text", "image_url", "input_audio", "file"),
              "assistant": ("text", "refusal"), "tool": ("text",), "function": ("text",)}
# content part type -> (its keys, the required ones); the value under an object key is checked by _PART_OBJECTS
_PART_KEYS = {"text": ({"type", "text"}, ("type", "text")), "refusal": ({"type", "refusal"}, ("type", "refusal")),
              "image_url": ({"type", "image_url"}, ("type", "image_url")),
              "input_audio": ({"type", "input_audio"}, ("type", "input_audio")), "file": ({"type", "file"}, ("type", "file"))}
_PART_OBJECTS = {"image_url": ({"url", "detail"}, ("url",)), "input_audio": ({"data", "format"}, ("data", "format")),
                 "file": ({"file_data", "file_id", "filename"}, ())}
NAME_PATTERN = re.compile(r"^[a-zA-Z0-9_-]+$")
MAX_NAME_CHARS = 64


def json_type(value: Any) -> str:
    """The JSON type of a value, as OpenAI's messages name it ("a string", "an array", ...)."""
    for kind, name in ((bool, "a boolean"), (int, "an integer"), (float, "a number"), (str, "a string"),
                       (list, "an array"), (dict, "an object")):
        if isinstance(value, kind):
            return name
    return "null" if value is None else type(value).__name__


def problem(kind: str, message: str, param: str) -> PydanticCustomError:
    """A validation error that names the client's field path itself (`ctx.param`, read by `describe_errors`)."""
    return PydanticCustomError(kind, message, {"param": param})  # only "{param}" would be substituted


def _supported(values) -> str:
    quoted = [f"'{v}'" for v in values]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])}{',' if len(quoted) > 2 else ''} and {quoted[-1]}"


def _one_of(value: Any, allowed, at: str) -> None:
    if value not in allowed:
        raise problem("invalid_value", f"Invalid value: {value!r}. Supported values are: {_supported(allowed)}.", at)


def _typed(value: Any, kind: type, at: str) -> None:
    """`value` (None: absent) is of JSON type `kind` (str, dict, list or bool)."""
    if value is not None and (not isinstance(value, kind) or (kind is not bool and isinstance(value, bool))):
        expected = {str: "a string", dict: "an object", list: "an array", bool: "a boolean"}[kind]
        raise problem("invalid_type", f"Invalid type for '{at}': expected {expected}, but got {json_type(value)} instead.", at)


def _object(value: Any, at: str, keys, required=()) -> dict:
    """`value` is an object with only `keys` and every key of `required` (not null)."""
    if not isinstance(value, dict):
        raise problem("invalid_type", f"Invalid type for '{at}': expected an object, but got {json_type(value)} instead.", at)
    for key in value:
        if key not in keys:
            raise problem("unknown_parameter", f"Unrecognized request argument supplied: {at}.{key}", f"{at}.{key}")
    for key in required:
        if value.get(key) is None:
            raise problem("missing_parameter", f"Missing required parameter: '{at}.{key}'.", f"{at}.{key}")
    return value


def _name(value: Any, at: str) -> None:
    """A function or schema name: a string matching NAME_PATTERN, at most MAX_NAME_CHARS characters."""
    _typed(value, str, at)
    if len(value) > MAX_NAME_CHARS:
        raise problem("string_above_max_length", f"Invalid '{at}': string too long. Expected a string with maximum length "
                      f"{MAX_NAME_CHARS}, but got a string with length {len(value)} instead.", at)
    if not NAME_PATTERN.match(value):
        raise problem("invalid_value", f"Invalid '{at}': string does not match pattern. Expected a string that matches "
                      f"the pattern '{NAME_PATTERN.pattern}'.", at)


def _content_parts(parts: list, role: str, at: str) -> None:
    for j, part in enumerate(parts):
        where = f"{at}[{j}]"
        _typed(part, dict, where)
        if part.get("type") is None:
            raise problem("missing_parameter", f"Missing required parameter: '{where}.type'.", f"{where}.type")
        _one_of(part["type"], PART_TYPES[role], f"{where}.type")
        keys, required = _PART_KEYS[part["type"]]
        _object(part, where, keys, required)
        if part["type"] in ("text", "refusal"):
            _typed(part[part["type"]], str, f"{where}.{part['type']}")
        else:
            _object(part[part["type"]], f"{where}.{part['type']}", *_PART_OBJECTS[part["type"]])


def _tool_calls(calls: Any, at: str) -> None:
    _typed(calls, list, at)
    for k, call in enumerate(calls):
        where = f"{at}[{k}]"
        kind = _object(call, where, {"id", "type", "function", "custom"}, ("id", "type")).get("type")
        _typed(call["id"], str, f"{where}.id")
        _one_of(kind, ("function", "custom"), f"{where}.type")
        fields = ({"name", "arguments"}, ("name", "arguments")) if kind == "function" else ({"name", "input"}, ("name", "input"))
        _object(call, where, {"id", "type", kind}, (kind,))
        _object(call[kind], f"{where}.{kind}", *fields)
        for field in fields[1]:
            _typed(call[kind][field], str, f"{where}.{kind}.{field}")


def check_messages(messages: list[dict[str, Any]]) -> None:
    """Every message has a known role, only its role's keys and content (a string or an array of that role's
    parts); an assistant message may omit content when it carries tool calls; a tool message names its
    `tool_call_id`.

    Raises:
        PydanticCustomError: naming the first offending field, e.g. `messages[1].content`.
    """
    for i, message in enumerate(messages):
        at = f"messages[{i}]"
        role = message.get("role")
        if role is None:
            raise problem("missing_parameter", f"Missing required parameter: '{at}.role'.", f"{at}.role")
        if role not in CHAT_ROLES:
            supported = ", ".join(f"'{r}'" for r in CHAT_ROLES)
            raise problem("invalid_value", f"Invalid value for '{at}.role': {role!r}. Supported values are: {supported}.",
                          f"{at}.role")
        _object(message, at, MESSAGE_KEYS[role])
        _typed(message.get("name"), str, f"{at}.name")
        if role == "assistant":
            if message.get("tool_calls") is not None:
                _tool_calls(message["tool_calls"], f"{at}.tool_calls")
            if message.get("function_call") is not None:
                _object(message["function_call"], f"{at}.function_call", {"name", "arguments"}, ("name", "arguments"))
            _typed(message.get("refusal"), str, f"{at}.refusal")
        content = message.get("content")
        if content is None:
            if role == "assistant" and (message.get("tool_calls") or message.get("function_call")):
                continue
            raise problem("missing_parameter", f"Missing required parameter: '{at}.content'.", f"{at}.content")
        if not isinstance(content, (str, list)):
            raise problem("invalid_type", f"Invalid type for '{at}.content': expected a string or an array of content "
                          f"parts, but got {json_type(content)} instead.", f"{at}.content")
        if isinstance(content, list):
            _content_parts(content, role, f"{at}.content")
        if role == "tool":
            if message.get("tool_call_id") in (None, ""):
                raise problem("missing_parameter", f"Missing required parameter: '{at}.tool_call_id'.", f"{at}.tool_call_id")
            _typed(message["tool_call_id"], str, f"{at}.tool_call_id")


def _check_tool(tool: Any, at: str) -> None:
    kind = _object(tool, at, {"type", "function", "custom"}, ("type",))["type"]
    _one_of(kind, ("function", "custom"), f"{at}.type")
    _object(tool, at, {"type", kind}, (kind,))
    keys = {"name", "description", "parameters", "strict"} if kind == "function" else {"name", "description", "format"}
    spec = _object(tool[kind], f"{at}.{kind}", keys, ("name",))
    _name(spec["name"], f"{at}.{kind}.name")
    _typed(spec.get("description"), str, f"{at}.{kind}.description")
    if kind == "function":
        _typed(spec.get("parameters"), dict, f"{at}.function.parameters")
        _typed(spec.get("strict"), bool, f"{at}.function.strict")
    else:
        _typed(spec.get("format"), dict, f"{at}.custom.format")


def check_tools(tools: list | None, tool_choice: Any, parallel_tool_calls: bool | None) -> None:
    """`tools` well formed and not empty; `tool_choice` "none", "auto", "required" or a named tool among
    `tools` (or OpenAI's allowed_tools form); neither it nor `parallel_tool_calls` without tools.

    Raises:
        PydanticCustomError: naming the offending field (`tools[0].function.name`, `tool_choice`).
    """
    if tools is not None:
        if not tools:
            raise problem("empty_array", "Invalid 'tools': empty array. Expected an array with minimum length 1, but got "
                          "an empty array instead.", "tools")
        for i, tool in enumerate(tools):
            _check_tool(tool, f"tools[{i}]")
    for field, value in (("tool_choice", tool_choice), ("parallel_tool_calls", parallel_tool_calls)):
        if value is not None and not tools:
            raise problem("invalid_value", f"Invalid value for '{field}': '{field}' is only allowed when 'tools' are specified.",
                          field)
    if tool_choice is None or isinstance(tool_choice, str):
        if tool_choice is not None:
            _one_of(tool_choice, ("none", "auto", "required"), "tool_choice")
        return
    kind = _object(tool_choice, "tool_choice", {"type", "function", "custom", "allowed_tools"}, ("type",))["type"]
    _one_of(kind, ("function", "custom", "allowed_tools"), "tool_choice.type")
    _object(tool_choice, "tool_choice", {"type", kind}, (kind,))
    if kind == "allowed_tools":
        spec = _object(tool_choice[kind], f"tool_choice.{kind}", {"mode", "tools"}, ("mode", "tools"))
        _one_of(spec["mode"], ("auto", "required"), f"tool_choice.{kind}.mode")
        _typed(spec["tools"], list, f"tool_choice.{kind}.tools")
        return
    name = _object(tool_choice[kind], f"tool_choice.{kind}", {"name"}, ("name",))["name"]
    _typed(name, str, f"tool_choice.{kind}.name")
    if not any(t["type"] == kind and t[kind]["name"] == name for t in tools):
        raise problem("invalid_value", f"Invalid value for 'tool_choice': {kind} {name!r} not found in 'tools'.", "tool_choice")


def check_response_format(response_format: dict) -> None:
    """{"type": "text"}, {"type": "json_object"} or {"type": "json_schema", "json_schema": {"name", "description",
    "schema", "strict"}} with a valid name.

    Raises:
        PydanticCustomError: naming the offending field (`response_format.json_schema.name`).
    """
    kind = _object(response_format, "response_format", {"type", "json_schema"}, ("type",))["type"]
    _one_of(kind, ("text", "json_object", "json_schema"), "response_format.type")
    if kind != "json_schema":
        _object(response_format, "response_format", {"type"})
        return
    at = "response_format.json_schema"
    spec = _object(_object(response_format, "response_format", {"type", "json_schema"}, ("json_schema",))["json_schema"],
                   at, {"name", "description", "schema", "strict"}, ("name",))
    _name(spec["name"], f"{at}.name")
    _typed(spec.get("description"), str, f"{at}.description")
    _typed(spec.get("schema"), dict, f"{at}.schema")
    _typed(spec.get("strict"), bool, f"{at}.strict")
