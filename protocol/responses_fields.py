"""Strict checks of a Responses API request's nested objects (`protocol/responses.py`): input items and their
content parts, function tools, `tool_choice` and `text.format`, as OpenAI's API reference shapes them.

An unknown key, a missing required key, a wrong type or a type this gateway does not serve is a 400 whose `param`
is the client's field path (`input[2].content[0].type`, `tools[0].type`); each check raises a
`PydanticCustomError` carrying that path in `ctx.param` (read by `protocol.errors.describe_errors`). Items the API
returned may be sent back as they are (`id`, `status`, `annotations`, `logprobs` are accepted).
"""

from __future__ import annotations

from typing import Any

from protocol.chat_fields import json_type, problem

FUNCTION_TOOL_KEYS = {"type", "name", "description", "parameters", "strict"}
INPUT_ITEM_TYPES = ("message", "function_call", "function_call_output")
MESSAGE_ROLES = ("user", "assistant", "system", "developer")
# the content part types an input message may carry (which ones each role takes: `check_input_item`)
PART_TYPES = ("input_text", "output_text", "refusal", "input_image")
_ITEM_KEYS = {"message": {"type", "role", "content", "id", "status", "phase"},
              "function_call": {"type", "call_id", "name", "arguments", "id", "status", "namespace"},
              "function_call_output": {"type", "call_id", "output", "id", "status"}}
_PART_KEYS = {"input_text": {"type", "text"}, "output_text": {"type", "text", "annotations", "logprobs"},
              "refusal": {"type", "refusal"}, "input_image": {"type", "image_url", "detail", "file_id"}}


def _supported(values) -> str:
    return ", ".join(f"'{v}'" for v in values)


def _keys(obj: dict, allowed: set[str], required: tuple[str, ...], at: str) -> None:
    for key in obj:
        if key not in allowed:
            raise problem("unknown_parameter", f"Unknown parameter: '{at}.{key}'.", f"{at}.{key}")
    for key in required:
        if obj.get(key) is None:
            raise problem("missing_required_parameter", f"Missing required parameter: '{at}.{key}'.", f"{at}.{key}")


def _string(obj: dict, key: str, at: str) -> None:
    if not isinstance(obj.get(key), str):
        raise problem("invalid_type", f"Invalid type for '{at}.{key}': expected a string, but got "
                      f"{json_type(obj.get(key))} instead.", f"{at}.{key}")


def check_input_item(item: Any, at: str) -> None:
    """One `input` item. Raises a PydanticCustomError naming the field (`input[2].content[0].type`)."""
    if not isinstance(item, dict):
        raise problem("invalid_type", f"Invalid type for '{at}': expected an object, but got {json_type(item)} instead.", at)
    kind = item.get("type", "message")
    if kind not in _ITEM_KEYS:
        raise problem("invalid_value", f"Invalid value: {kind!r}. Supported values are: {_supported(INPUT_ITEM_TYPES)} "
                      "(this gateway serves no other input item type).", f"{at}.type")
    if kind == "function_call":
        _keys(item, _ITEM_KEYS[kind], ("call_id", "name", "arguments"), at)
        for key in ("call_id", "name", "arguments"):
            _string(item, key, at)
        return
    if kind == "function_call_output":
        _keys(item, _ITEM_KEYS[kind], ("call_id", "output"), at)
        _string(item, "call_id", at)
        if isinstance(item["output"], list):
            _check_parts(item["output"], ("input_text",), f"{at}.output")
        elif not isinstance(item["output"], str):
            _string(item, "output", at)
        return
    _keys(item, _ITEM_KEYS["message"], ("role", "content"), at)
    role = item["role"]
    if role not in MESSAGE_ROLES:
        raise problem("invalid_value", f"Invalid value: {role!r}. Supported values are: {_supported(MESSAGE_ROLES)}.",
                      f"{at}.role")
    if isinstance(item["content"], list):
        allowed = ("output_text", "refusal") if role == "assistant" else ("input_text", "input_image") if role == "user" \
            else ("input_text",)
        _check_parts(item["content"], allowed, f"{at}.content")
    elif not isinstance(item["content"], str):
        _string(item, "content", at)


def _check_parts(parts: list, allowed: tuple[str, ...], at: str) -> None:
    for j, part in enumerate(parts):
        where = f"{at}[{j}]"
        if not isinstance(part, dict):
            raise problem("invalid_type", f"Invalid type for '{where}': expected an object, but got {json_type(part)} "
                          "instead.", where)
        if part.get("type") not in allowed:
            raise problem("invalid_value", f"Invalid value: {part.get('type')!r}. Supported values are: "
                          f"{_supported(allowed)}.", f"{where}.type")
        kind = part["type"]
        required = {"input_text": ("text",), "output_text": ("text",), "refusal": ("refusal",), "input_image": ("image_url",)}
        _keys(part, _PART_KEYS[kind], required[kind], where)
        _string(part, required[kind][0], where)


def check_tool(tool: Any, at: str) -> None:
    """One tool: only `{"type": "function", "name", "description", "parameters", "strict"}` is served."""
    if not isinstance(tool, dict):
        raise problem("invalid_type", f"Invalid type for '{at}': expected an object, but got {json_type(tool)} instead.", at)
    if tool.get("type") != "function":
        raise problem("invalid_value", f"Tool type {tool.get('type')!r} is not supported by this gateway: only "
                      "'function' tools ({\"type\": \"function\", \"name\", \"parameters\", ...}) are.", f"{at}.type")
    _keys(tool, FUNCTION_TOOL_KEYS, ("name",), at)
    _string(tool, "name", at)


def check_tool_choice(choice: Any) -> None:
    """"none", "auto", "required" or {"type": "function", "name"}."""
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise problem("invalid_value", f"Invalid value: {choice!r}. Supported values are: 'none', 'auto' and "
                          "'required'.", "tool_choice")
        return
    if choice.get("type") != "function":
        raise problem("invalid_value", f"tool_choice type {choice.get('type')!r} is not supported by this gateway: "
                      "use 'none', 'auto', 'required' or {\"type\": \"function\", \"name\": ...}.", "tool_choice.type")
    _keys(choice, {"type", "name"}, ("name",), "tool_choice")
    _string(choice, "name", "tool_choice")


def check_text_format(fmt: dict) -> None:
    """`text.format`: {"type": "text"}, {"type": "json_object"} or {"type": "json_schema", "name", "schema", ...}."""
    kind = fmt.get("type")
    keys = {"text": {"type"}, "json_object": {"type"},
            "json_schema": {"type", "name", "schema", "description", "strict"}}
    if kind not in keys:
        raise problem("invalid_value", f"Invalid value: {kind!r}. Supported values are: 'text', 'json_object' and "
                      "'json_schema'.", "text.format.type")
    _keys(fmt, keys[kind], ("name", "schema") if kind == "json_schema" else (), "text.format")
