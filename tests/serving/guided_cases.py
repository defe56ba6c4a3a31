"""Schemas and checks shared by the guided-decoding tests (test_guided_json.py, test_guided_decoding.py)."""

from __future__ import annotations

from serving.guided_json import JsonAutomaton

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"}, "age": {"type": "integer"}, "score": {"type": ["number", "null"]},
        "role": {"enum": ["admin", "user"]}, "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
        "address": {"$ref": "#/$defs/Address"}, "ok": {"type": "boolean"},
        "id": {"anyOf": [{"type": "integer"}, {"type": "string"}]}, "kind": {"const": "person"},
    },
    "required": ["name", "age", "kind"], "additionalProperties": False,
    "$defs": {"Address": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                          "additionalProperties": False}},
}


def valid(schema: dict, text: str) -> bool:
    auto = JsonAutomaton(schema)
    state = auto.feed(auto.start(), text)
    return state is not None and auto.is_complete(state)
