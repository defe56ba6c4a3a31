"""Schemas, checks and the toy tokenizer shared by the guided-decoding tests (test_guided_json.py,
test_guided_decoding.py, test_guided_checks.py, and the toy model of toy_model.py)."""

from __future__ import annotations

import time

from serving.guided.automaton import JsonAutomaton

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


# A recursive schema that writes something on every turn: a node's children are items of its own schema.
TREE = {
    "$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"}, "children": {
        "type": "array", "items": {"$ref": "#/$defs/node"}}}, "required": ["v", "children"], "additionalProperties": False}},
    "$ref": "#/$defs/node",
}


# $ref cycles that write nothing: no document can even start.
SELF = {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
INDIRECT = {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}


def nested(depth: int, key: str = "properties") -> dict:
    """`depth` levels of subschemas: required objects (or non-empty arrays, or anyOfs) around a string."""
    schema: dict = {"type": "string"}
    for _ in range(depth - 1):
        schema = {"properties": {"type": "object", "properties": {"a": schema}, "required": ["a"]},
                  "items": {"type": "array", "items": schema, "minItems": 1},
                  "anyOf": {"anyOf": [schema]}}[key]
    return schema


def slowed(step, delay_s: float):
    """The automaton's transition function `step`, sleeping `delay_s` first: guided decoding made slow on purpose."""
    def slow(*args):
        time.sleep(delay_s)
        return step(*args)

    return slow


class CharTokenizer:
    """A toy tokenizer: printable ASCII characters, a few multi-character tokens and an EOS (id 0)."""

    def __init__(self):
        self.vocab = ["</s>"] + [chr(c) for c in range(32, 127)] + ["\n", '{"', '": ', '", "', "true", "12", "name", "}\n", " {", "<tool_call>"]
        self.eos_token_ids = (0,)
        self.vocab_size = len(self.vocab)

    def encode(self, text, add_special_tokens=True):
        return [self.vocab.index(c) for c in text]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(self.vocab[i] for i in ids if not (skip_special_tokens and i == 0))

    def id_to_token(self, token_id):
        return self.vocab[token_id]


def valid(schema: dict, text: str) -> bool:
    auto = JsonAutomaton(schema)
    state = auto.feed(auto.start(), text)
    return state is not None and auto.is_complete(state)
