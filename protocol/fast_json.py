"""JSON on the gateway's hot path: compact bytes out, objects in, with orjson when it is installed (about 3x the
standard library's speed on the small objects of a chat answer), else the standard library with one shared
encoder (json.dumps builds a new encoder per call).

    dumps({"a": 1}) == b'{"a":1}'
    loads(b'{"a": 1}') == {"a": 1}
    JSONBytesResponse({"id": "chatcmpl-1"}, headers={...})   # a Starlette JSONResponse rendered by `dumps`

Both back ends write the same JSON values (RFC 8259). orjson writes non-ASCII text as UTF-8 and the standard
library path does too (ensure_ascii off), so the bytes agree; they differ only on values JSON cannot carry
(NaN, Infinity): orjson writes `null`, the standard library `NaN` as json.dumps does. Integers beyond 64 bits,
which orjson refuses, are written by the standard library. Keys that are numbers or booleans become strings in
both, as json.dumps does.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import JSONResponse

try:
    import orjson
except ImportError:  # pragma: no cover - orjson is a dependency; kept working without it
    orjson = None

_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def dumps(obj: Any) -> bytes:
    """`obj` as compact UTF-8 JSON bytes. Raises TypeError for a value JSON cannot hold."""
    if orjson is not None:
        try:
            return orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS)
        except TypeError:  # an integer beyond 64 bits, which orjson refuses: the standard library writes it
            pass
    return _ENCODER.encode(obj).encode()


def loads(data: bytes | str) -> Any:
    """The JSON value in `data`. Raises ValueError (json.JSONDecodeError or orjson's, a subclass) when it is not JSON."""
    return orjson.loads(data) if orjson is not None else json.loads(data)


def loads_lenient(data: bytes | str) -> Any:
    """As `loads`, but also reads what Python's json module reads beyond RFC 8259 (NaN, Infinity, -Infinity): what
    a careless provider may send, read rather than refused. Raises ValueError when it is not even that."""
    try:
        return loads(data)
    except ValueError:
        return json.loads(data)


class JSONBytesResponse(JSONResponse):
    """A JSONResponse whose body is rendered once by `dumps` (compact, UTF-8)."""

    def render(self, content: Any) -> bytes:
        return dumps(content)
