"""OpenAI's error object, and pydantic errors turned into the client's field path.

    raise ValidationProblem("stop takes at most 4 sequences", param="stop")     # a 400 naming the field
    error_body("Invalid URL (POST /v1/foo)")    # {"error": {"message", "type", "param", "code"}}
    describe_errors(exc.errors())               # ("stop: expected a string or an array of strings, ...", "stop")

Both servers (the engine's, `serving/api/server.py`, and the gateway) answer every refusal with this object and a
4xx status; `param` is the client's field path (`messages[0].content`), as OpenAI names it.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel

from protocol.chat_fields import json_type


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


# A union member's tag in a pydantic error location ("str", "list[str]", a model's class name).
_TYPE_TAG = re.compile(r"^(str|int|float|bool|none|(list|dict|set|tuple|literal|function-\w+)\[.*\]|[A-Z]\w*)$")
_SINGULAR = {"str": "a string", "int": "an integer", "float": "a number", "bool": "a boolean"}
_PLURAL = {"str": "strings", "int": "integers", "float": "numbers", "bool": "booleans"}


def _type_phrase(tag: str, plural: bool = False) -> str:
    """"list[list[int]]" -> "an array of arrays of integers"."""
    if tag.startswith("list[") and tag.endswith("]"):
        return ("arrays of " if plural else "an array of ") + _type_phrase(tag[5:-1], plural=True)
    if tag.startswith("dict["):
        return "objects" if plural else "an object"
    return (_PLURAL if plural else _SINGULAR).get(tag, tag)


def client_param(loc: tuple | list) -> str | None:
    """A pydantic error location -> the client's field path: ("messages", 0, "content") -> "messages[0].content";
    union tags ("stop", "str") and dict-key markers are dropped."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part != "[key]" and not _TYPE_TAG.match(str(part)):
            path += f".{part}" if path else str(part)
    return path or None


def describe_errors(errors: list[dict], skip: int = 0) -> tuple[str, str | None]:
    """Pydantic errors (`ValidationError.errors()`) -> (message, param) of an OpenAI 400.

    Args:
        errors: the errors, in pydantic's order; unknown fields are reported first.
        skip: leading location parts to drop (1 for FastAPI's "body").
    Returns:
        e.g. ("Unrecognized request argument supplied: foo", "foo"), ("stop: expected a string or an array
        of strings, but got an integer", "stop"), ("Missing required parameter: 'messages'.", "messages").
    """
    errors = [{**e, "loc": tuple(e.get("loc", ()))[skip:]} for e in errors]
    if not errors:
        return "invalid request body", None
    extra = [client_param(e["loc"]) for e in errors if e.get("type") == "extra_forbidden"]
    if extra:
        plural = "s" if len(extra) > 1 else ""
        return f"Unrecognized request argument{plural} supplied: {', '.join(map(str, extra))}", extra[0]
    first = errors[0]
    if first.get("type") == "json_invalid":  # FastAPI's body parse error: loc ("body", character offset)
        at = f" at character {first['loc'][-1]}" if first["loc"] and isinstance(first["loc"][-1], int) else ""
        return f"We could not parse the JSON body of your request: {(first.get('ctx') or {}).get('error', 'invalid JSON')}{at}.", None
    if "param" in (first.get("ctx") or {}):
        return first["msg"], first["ctx"]["param"]
    param = client_param(first["loc"])
    if first.get("type") == "missing":
        return f"Missing required parameter: '{param}'.", param
    if first.get("type") == "too_short" and isinstance(first.get("input"), list) and not first["input"]:
        return (f"Invalid '{param}': empty array. Expected an array with minimum length "
                f"{(first.get('ctx') or {}).get('min_length', 1)}, but got an empty array instead."), param
    tag_at = next((i for i, part in enumerate(first["loc"]) if isinstance(part, str) and _TYPE_TAG.match(part)), None)
    if tag_at is not None:  # a union: say which types it takes, unless the value matched one member's shape
        prefix = first["loc"][:tag_at]
        members = [e for e in errors if e["loc"][:tag_at] == prefix and len(e["loc"]) > tag_at]
        deeper = [e for e in members if len(e["loc"]) > tag_at + 1]
        if deeper and len({e["loc"][tag_at] for e in deeper}) == 1:
            first, param = deeper[0], client_param(deeper[0]["loc"])
        else:
            phrases = [_type_phrase(t) for t in dict.fromkeys(str(e["loc"][tag_at]) for e in members)]
            expected = " or ".join([", ".join(phrases[:-1]), phrases[-1]] if len(phrases) > 1 else phrases)
            return f"{param}: expected {expected}, but got {json_type(first.get('input'))}", param
    return f"{param or 'body'}: {first.get('msg', 'invalid value').removeprefix('Value error, ')}", param


def error_body(message: str, type_: str = "invalid_request_error", param: str | None = None, code: str | None = None) -> dict:
    """The OpenAI error object: {"error": {"message", "type", "param", "code"}}."""
    return {"error": ErrorBody(message=message, type=type_, param=param, code=code).model_dump()}


class ValidationProblem(Exception):
    """A request that parses but cannot be served; becomes a 400 OpenAI error."""

    def __init__(self, message: str, param: str | None = None, status_code: int = 400, code: str | None = None,
                 type_: Literal["invalid_request_error", "not_found_error"] = "invalid_request_error"):
        super().__init__(message)
        self.message, self.param, self.status_code, self.code, self.type = message, param, status_code, code, type_
