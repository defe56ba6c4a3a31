"""Request bodies as strict JSON, read the same way by the engine server and the gateway.

    body = parse_json_object(await request.body())    # dict, or ValidationProblem: 400 naming the field

A body must be one UTF-8 JSON object, and what it holds must be something every later step can carry:
- numbers finite (Python's json reads NaN, Infinity and 1e309 as floats; strict JSON has none of them);
- strings and keys valid Unicode: a lone UTF-16 surrogate (`"\\udfff"`, or its bytes) cannot be encoded as
  UTF-8, so no provider, tokenizer or database could take it;
- no NUL character (`"\\u0000"`) anywhere, free text included: PostgreSQL cannot store one in a text or JSONB
  value (a request-log row, a key or policy name, a tool-call trace, an eval cache entry) nor compare one in a
  query, and a request must never be served and billed without its row. One rule for every field means no
  stored field can be forgotten; a client that needs the character sends it escaped in its own text.
Each refusal names the client's field path (`messages[0].content`, `metadata` for one of its keys) and never
echoes the bad text. Nesting is bounded before parsing by `protocol/boundary.py`.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from protocol.chat_fields import json_type
from protocol.errors import ValidationProblem

_SURROGATE = re.compile("[\ud800-\udfff]")


def text_problem(text: str) -> str | None:
    """Why the string `text` cannot be carried (a NUL, a lone surrogate), with its character index, or None."""
    at = text.find("\x00")
    if at >= 0:
        return f"holds a NUL character (\\u0000) at character {at}, which cannot be stored; remove it"
    lone = _SURROGATE.search(text)
    if lone is not None:
        return (f"holds a lone UTF-16 surrogate (\\u{ord(lone.group()):04x}) at character {lone.start()}, which "
                "is not Unicode text and cannot be encoded as UTF-8; send valid text")
    return None


def _child(path: str, key: str | int) -> str:
    return f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}" if path else key


def value_problem(value: Any) -> tuple[str | None, str] | None:
    """The first value in parsed JSON, in document order, that no later step can carry: (its field path, or
    None for a key of the body itself; a message naming it) — or None when everything is fine.

    Keys are checked before the path descends through them, so a returned path is always clean text. The walk
    uses its own stack: depth costs no recursion.
    """
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            why = text_problem(item)
            if why is not None:
                return path, f"Invalid '{path}': the string {why}."
        elif isinstance(item, float) and not math.isfinite(item):
            return path, f"{path}: JSON numbers must be finite (no NaN, Infinity or values beyond 1.8e308)."
        elif isinstance(item, dict):
            for key in item:
                why = text_problem(key)
                if why is not None:
                    where = f"'{path}'" if path else "the request body"
                    return path or None, f"Invalid key in {where}: the key {why}."
            stack.extend((_child(path, key), child) for key, child in reversed(item.items()))
        elif isinstance(item, list):
            stack.extend((_child(path, index), child) for index, child in reversed(list(enumerate(item))))
    return None


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """A request body that must be one JSON object of values that can be carried (module docstring).

    Args:
        raw: the body as received; its nesting already bounded (`protocol.boundary.RequestBoundary`).
    Raises:
        ValidationProblem: 400 naming the position of a syntax error or of bytes that are not UTF-8, saying the
            body is not an object, or naming the field of a non-finite number, a NUL or a lone surrogate.
    """
    try:
        # UTF-8 only, as OpenAI's API (a leading BOM dropped, as json.loads does); "surrogatepass" lets an
        # encoded surrogate through, to be named by its field below
        text = raw.decode("utf-8-sig", "surrogatepass")
    except UnicodeDecodeError as exc:
        raise ValidationProblem(f"We could not parse the JSON body of your request: it must be UTF-8 encoded JSON "
                                f"(byte {exc.start} is not UTF-8).") from None
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValidationProblem(f"We could not parse the JSON body of your request: {exc.msg} at line {exc.lineno} "
                                f"column {exc.colno} (character {exc.pos}).") from None
    except ValueError as exc:  # an integer of more than 4,300 digits (sys.get_int_max_str_digits)
        raise ValidationProblem(f"We could not parse the JSON body of your request: {exc}.") from None
    if not isinstance(body, dict):
        raise ValidationProblem(f"The request body must be a JSON object, not {json_type(body)}.")
    found = value_problem(body)
    if found is not None:
        raise ValidationProblem(found[1], param=found[0])
    return body
