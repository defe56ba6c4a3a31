"""JSON Schema (the subset `serving.guided_json` enforces) -> a tree of `Node`s; `response_format` -> schema.

Supported: `type` (object, array, string, number, integer, boolean, null, or a list of these),
`properties`, `required`, `additionalProperties` (true, false or a schema), `items`, `minItems`,
`maxItems`, `enum`, `const`, `anyOf`, local `$ref` into `$defs`/`definitions` (recursion allowed), and
annotations (`title`, `description`, ...). Any other keyword is refused with its name, since enforcing
less than the schema says would return output that claims to match it and may not.
"""

from __future__ import annotations

import json
from typing import Any

from serving.errors import ServingError

KEYWORDS = {"type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems", "enum", "const",
            "anyOf", "$ref", "$defs", "definitions"}
ANNOTATIONS = {"title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated", "readOnly", "writeOnly"}


class UnsupportedSchemaError(ServingError):
    """A `response_format` or JSON Schema this automaton cannot enforce (the message names the keyword)."""


class Node:
    """One compiled schema: `kind` is any, object, array, string, number, integer, literals, anyof or ref."""

    __slots__ = ("kind", "props", "required", "extra", "items", "min_items", "max_items", "texts", "options", "target")

    def __init__(self, kind: str, **fields: Any):
        self.kind, self.props, self.required, self.extra = kind, {}, frozenset(), None
        self.items, self.min_items, self.max_items, self.texts, self.options, self.target = None, 0, None, (), (), None
        for name, value in fields.items():
            setattr(self, name, value)


ANY = Node("any")
ANY_OBJECT = Node("object", extra=ANY)
ANY_ARRAY = Node("array", items=ANY)


def literals(values: list) -> Node:
    return Node("literals", texts=tuple(dict.fromkeys(json.dumps(v, ensure_ascii=False) for v in values)))


class _Compiler:
    def __init__(self, root: dict):
        self.root, self.refs = root, {}

    def compile(self, s: Any, path: str) -> Node:
        if s is True or s == {}:
            return ANY
        if not isinstance(s, dict):
            raise UnsupportedSchemaError(f"the schema at {path} must be an object, got {s!r}")
        unknown = sorted(set(s) - KEYWORDS - ANNOTATIONS)
        if unknown:
            raise UnsupportedSchemaError(f"JSON Schema keyword '{unknown[0]}' (at {path}) is not supported for local models; "
                                         f"supported: {', '.join(sorted(KEYWORDS))}")
        if "$ref" in s:
            return self.ref(s["$ref"], path)
        if "const" in s:
            return literals([s["const"]])
        if "enum" in s:
            if not isinstance(s["enum"], list) or not s["enum"]:
                raise UnsupportedSchemaError(f"enum at {path} must be a non-empty list")
            return literals(s["enum"])
        if "anyOf" in s:
            if not isinstance(s["anyOf"], list) or not s["anyOf"]:
                raise UnsupportedSchemaError(f"anyOf at {path} must be a non-empty list")
            return Node("anyof", options=tuple(self.compile(x, f"{path}/anyOf/{i}") for i, x in enumerate(s["anyOf"])))
        kind = s.get("type")
        if isinstance(kind, list):
            return Node("anyof", options=tuple(self.compile({**s, "type": k}, path) for k in kind))
        if kind is None:
            kind = "object" if "properties" in s else "array" if "items" in s else None
        if kind == "object":
            props = s.get("properties", {})
            if not isinstance(props, dict):
                raise UnsupportedSchemaError(f"properties at {path} must be an object")
            extra = s.get("additionalProperties", True)
            node = Node("object", props={k: self.compile(v, f"{path}/properties/{k}") for k, v in props.items()},
                        required=frozenset(s.get("required", ())),
                        extra=None if extra is False else self.compile(extra, f"{path}/additionalProperties"))
            if node.extra is None and not node.required <= set(node.props):
                raise UnsupportedSchemaError(f"required names properties that additionalProperties=false forbids at {path}")
            return node
        if kind == "array":
            return Node("array", items=self.compile(s.get("items", True), f"{path}/items"),
                        min_items=s.get("minItems", 0), max_items=s.get("maxItems"))
        if kind in ("string", "number", "integer"):
            return Node(kind)
        if kind == "boolean":
            return literals([True, False])
        if kind == "null":
            return literals([None])
        if kind is None:
            return ANY
        raise UnsupportedSchemaError(f"unknown type {kind!r} at {path}")

    def ref(self, ref: Any, path: str) -> Node:
        parts = ref.split("/") if isinstance(ref, str) else []
        if len(parts) != 3 or parts[0] != "#" or parts[1] not in ("$defs", "definitions"):
            raise UnsupportedSchemaError(f"$ref {ref!r} at {path}: only local references '#/$defs/NAME' are supported")
        if ref not in self.refs:  # a placeholder first, so a recursive definition refers to itself
            self.refs[ref] = node = Node("ref")
            target = self.root.get(parts[1], {}).get(parts[2])
            if target is None:
                raise UnsupportedSchemaError(f"$ref {ref!r} at {path} names no definition")
            node.target = self.compile(target, ref)
        return self.refs[ref]


def response_format_schema(response_format: dict) -> dict | None:
    """The JSON Schema that an OpenAI `response_format` asks for; None for `{"type": "text"}`.

    Raises:
        UnsupportedSchemaError: an unknown type, a json_schema without `schema`, or an unsupported keyword.
    """
    kind = response_format.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise UnsupportedSchemaError("response_format.json_schema.schema must be a JSON Schema object")
        compile_schema(spec["schema"])  # validate now, for a 400 before anything runs
        return spec["schema"]
    raise UnsupportedSchemaError(f"response_format type {kind!r} is not supported; use text, json_object or json_schema")


def compile_schema(schema: dict) -> Node:
    """The root `Node` of `schema`.

    Raises:
        UnsupportedSchemaError: a keyword outside the supported subset, or a malformed schema.
    """
    return _Compiler(schema).compile(schema, "#")
