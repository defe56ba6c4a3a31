"""JSON Schema (the subset `serving.guided.automaton` enforces) -> a tree of `Node`s; `response_format` -> schema.

Supported: `type` (object, array, string, number, integer, boolean, null, or a list of these),
`properties`, `required`, `additionalProperties` (true, false or a schema), `items`, `minItems`,
`maxItems`, `enum`, `const`, `anyOf`, local `$ref` into `$defs`/`definitions`, and annotations
(`title`, `description`, ...). Any other keyword is refused with its name, since enforcing less than the
schema says would return output that claims to match it and may not.

Depth: a schema nests at most `MAX_SCHEMA_DEPTH` (32) levels of subschemas: the root is level 1, and each
`properties` value, `additionalProperties`, `items`, `anyOf` option and `$ref` is one level below the
schema holding it (a type list's branches stay on its level). Its JSON, `const`, `enum` and annotation
values included, nests at most `MAX_JSON_DEPTH` (128) levels. Deeper ones are refused before any walk of
them could exhaust the stack.

Recursion through `$ref` is allowed where it writes something: a tree node whose `children` are items of
its own schema is fine, since every turn opens an array or object. `serving.guided.checks` refuses the
rest once the tree is built: a `$ref` chain that reaches itself without writing a character
(`{"$defs": {"a": {"$ref": "#/$defs/a"}}}`, or a -> anyOf -> b -> a), and a schema with no document at
most `MAX_SCHEMA_DEPTH` objects and arrays deep (recursion through a required property has no finite
document at all). Both raise `InvalidSchemaError`, which names the place (a JSON pointer such as
`#/$defs/a`) and is refused even where an unsupported keyword would be tolerated.
"""

from __future__ import annotations

import json
from typing import Any

from serving.errors import ServingError

KEYWORDS = {"type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems", "enum", "const",
            "anyOf", "$ref", "$defs", "definitions"}
ANNOTATIONS = {"title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated", "readOnly", "writeOnly"}


MAX_SCHEMA_DEPTH = 32  # levels of subschemas; also the most nested objects and arrays of a document
MAX_JSON_DEPTH = 4 * MAX_SCHEMA_DEPTH  # levels of the schema's JSON (two per `properties` level, and values)


class UnsupportedSchemaError(ServingError):
    """A `response_format` or JSON Schema this automaton cannot enforce (the message names the keyword)."""


class InvalidSchemaError(UnsupportedSchemaError):
    """A schema no automaton can decode: too deep, a `$ref` cycle that writes nothing, or no document within
    the depth bound. `path` is the JSON pointer of the offending place (`#/$defs/a`)."""

    def __init__(self, message: str, path: str):
        super().__init__(message)
        self.path = path


def shown(path: str, keep: int = 4) -> str:
    """A JSON pointer for a message: its first and last `keep` segments when it is long (`path` keeps it all)."""
    parts = path.split("/")
    if len(parts) <= 2 * keep + 1:
        return path
    return "/".join([*parts[:keep], f"...({len(parts) - 2 * keep} more)...", *parts[-keep:]])


class Node:
    """One compiled schema: `kind` is any, object, array, string, number, integer, literals, anyof or ref.

    `path` is where it was compiled (a ref's is the `$ref` text, `#/$defs/NAME`); `height` is the fewest
    nested objects and arrays a document of it needs, set by `serving.guided.checks` (None: more than
    MAX_SCHEMA_DEPTH, or no finite document at all).
    """

    __slots__ = ("kind", "props", "required", "extra", "items", "min_items", "max_items", "texts", "options", "target",
                 "path", "height")

    def __init__(self, kind: str, **fields: Any):
        self.kind, self.props, self.required, self.extra = kind, {}, frozenset(), None
        self.items, self.min_items, self.max_items, self.texts, self.options, self.target = None, 0, None, (), (), None
        self.path, self.height = "#", None
        for name, value in fields.items():
            setattr(self, name, value)


ANY = Node("any", height=0)
ANY_OBJECT = Node("object", extra=ANY, height=1)
ANY_ARRAY = Node("array", items=ANY, height=1)  # shared by every compile: measured here, once


def literals(values: list) -> Node:
    return Node("literals", texts=tuple(dict.fromkeys(json.dumps(v, ensure_ascii=False) for v in values)))


class _Compiler:
    def __init__(self, root: dict):
        self.root, self.refs = root, {}

    def compile(self, s: Any, path: str, level: int = 1) -> Node:
        """The node of subschema `s` found at JSON pointer `path`, `level` subschemas below the root's 1."""
        if s is True or s == {}:
            return ANY
        if level > MAX_SCHEMA_DEPTH:
            raise InvalidSchemaError(f"the schema nests more than {MAX_SCHEMA_DEPTH} levels of subschemas (properties, "
                                     f"items, anyOf, $ref) at {shown(path)}; flatten it", path)
        if not isinstance(s, dict):
            raise UnsupportedSchemaError(f"the schema at {path} must be an object, got {s!r}")
        unknown = sorted(set(s) - KEYWORDS - ANNOTATIONS)
        if unknown:
            raise UnsupportedSchemaError(f"JSON Schema keyword '{unknown[0]}' (at {path}) is not supported for local models; "
                                         f"supported: {', '.join(sorted(KEYWORDS))}")
        below = level + 1
        if "$ref" in s:
            return self.ref(s["$ref"], path, below)
        if "const" in s:
            return literals([s["const"]])
        if "enum" in s:
            if not isinstance(s["enum"], list) or not s["enum"]:
                raise UnsupportedSchemaError(f"enum at {path} must be a non-empty list")
            return literals(s["enum"])
        if "anyOf" in s:
            if not isinstance(s["anyOf"], list) or not s["anyOf"]:
                raise UnsupportedSchemaError(f"anyOf at {path} must be a non-empty list")
            return Node("anyof", path=path, options=tuple(self.compile(x, f"{path}/anyOf/{i}", below)
                                                          for i, x in enumerate(s["anyOf"])))
        kind = s.get("type")
        if isinstance(kind, list):
            return Node("anyof", path=path, options=tuple(self.compile({**s, "type": k}, path, level) for k in kind))
        if kind is None:
            kind = "object" if "properties" in s else "array" if "items" in s else None
        if kind == "object":
            props = s.get("properties", {})
            if not isinstance(props, dict):
                raise UnsupportedSchemaError(f"properties at {path} must be an object")
            extra = s.get("additionalProperties", True)
            node = Node("object", path=path, required=frozenset(s.get("required", ())),
                        props={k: self.compile(v, f"{path}/properties/{k}", below) for k, v in props.items()},
                        extra=None if extra is False else self.compile(extra, f"{path}/additionalProperties", below))
            if node.extra is None and not node.required <= set(node.props):
                raise UnsupportedSchemaError(f"required names properties that additionalProperties=false forbids at {path}")
            return node
        if kind == "array":
            return Node("array", path=path, items=self.compile(s.get("items", True), f"{path}/items", below),
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

    def ref(self, ref: Any, path: str, level: int) -> Node:
        """The node of `$ref` `ref` (met at `path`); its definition is compiled once, at `level`."""
        parts = ref.split("/") if isinstance(ref, str) else []
        if len(parts) != 3 or parts[0] != "#" or parts[1] not in ("$defs", "definitions"):
            raise UnsupportedSchemaError(f"$ref {ref!r} at {path}: only local references '#/$defs/NAME' are supported")
        if ref not in self.refs:  # a placeholder first, so a recursive definition refers to itself
            self.refs[ref] = node = Node("ref", path=ref)
            defs = self.root.get(parts[1])
            target = defs.get(parts[2]) if isinstance(defs, dict) else None
            if target is None:
                raise UnsupportedSchemaError(f"$ref {ref!r} at {path} names no definition")
            node.target = self.compile(target, ref, level)
        return self.refs[ref]


def build_nodes(schema: dict) -> Node:
    """The root `Node` of `schema`, unchecked: `serving.guided.checks.compile_schema` is the entry point, which
    bounds the depth first and measures every node's `height` after.

    Raises:
        UnsupportedSchemaError: a keyword outside the supported subset, or a malformed schema.
    """
    return _Compiler(schema).compile(schema, "#")
