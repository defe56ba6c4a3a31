"""Which schemas the JSON automaton can decode, checked when a schema compiles, before any engine work.

    check_json_depth(schema)    # the raw JSON: InvalidSchemaError past MAX_JSON_DEPTH levels
    check_decodable(root)       # the compiled tree: $ref cycles that write nothing; every node's height
    compile_schema(schema)      # both around `schema.build_nodes`: the entry point of every schema
    response_format_schema(rf)  # the schema an OpenAI `response_format` asks for, compiled to check it

`serving.guided.steps` starts a value by following `$ref`s and `anyOf` options until it reaches a node
that takes the character, so a cycle among those alone (a `$ref` to itself, a -> anyOf -> b -> a) would
never return: `check_decodable` refuses it, naming the chain. Recursion through an object or array
writes a `{` or `[` on every turn, so it is allowed, within the depth bound: each node's `height` is the
fewest nested objects and arrays a document of it needs, and the automaton opens a container of node N at
depth d only when d + N.height <= MAX_SCHEMA_DEPTH. A document can then always be closed within the bound,
and a branch that cannot (recursion through a required property never ends) is never entered. A root
with no height (none at most MAX_SCHEMA_DEPTH, or no finite document at all) is refused.

Heights are a grammar problem with superior functions (object: 1 + the highest required member; array: 1,
or 1 + its items' with minItems > 0; anyOf: the lowest option), solved by Knuth's generalization of
Dijkstra's algorithm (D. E. Knuth, "A generalization of Dijkstra's algorithm", IPL 6(1), 1977): values
settle in increasing order, each node once, so the work is linear in the schema's size.
"""

from __future__ import annotations

from typing import Any

from serving.guided.schema import (MAX_JSON_DEPTH, MAX_SCHEMA_DEPTH, InvalidSchemaError, Node, UnsupportedSchemaError,
                                   build_nodes, shown)

_LEAVES = ("any", "string", "number", "integer", "literals")


def check_json_depth(value: Any, limit: int = MAX_JSON_DEPTH) -> None:
    """Refuse JSON nested more than `limit` objects and arrays deep, without recursing into it.

    Raises:
        InvalidSchemaError: naming the JSON pointer of the first container past the limit.
    """
    stack = [(value, 1, None)]  # (value, depth, trail); a trail is (key, parent's trail), the way back to the root
    while stack:
        value, depth, trail = stack.pop()
        if isinstance(value, dict):
            items = value.items()
        elif isinstance(value, list):
            items = enumerate(value)
        else:
            continue
        if depth > limit:
            path = _pointer(trail)
            raise InvalidSchemaError(f"the schema's JSON nests more than {limit} levels at {shown(path)} (a schema may "
                                     f"nest {MAX_SCHEMA_DEPTH} levels of subschemas); flatten it", path)
        stack.extend((child, depth + 1, (key, trail)) for key, child in items)


def check_decodable(root: Node) -> None:
    """Refuse `$ref` cycles that write nothing, and set every node's `height` (see the module docstring).

    Raises:
        InvalidSchemaError: a cycle of `$ref`s and `anyOf`s (naming its refs), or a root with no document
            at most MAX_SCHEMA_DEPTH objects and arrays deep (naming where every branch goes deeper).
    """
    nodes = _nodes(root)
    _refuse_silent_cycles(nodes)
    _measure(nodes)
    if root.height is None:
        path = _culprit(root)
        raise InvalidSchemaError(f"no document of the schema is at most {MAX_SCHEMA_DEPTH} objects and arrays deep: "
                                 f"at {shown(path)} every choice nests deeper (a $ref that recurses through a required "
                                 "property, or through items with minItems > 0, never ends); make the recursion "
                                 "optional", path)


def _pointer(trail: tuple | None) -> str:
    keys = []
    while trail is not None:
        key, trail = trail
        keys.append(str(key))
    return "/".join(["#", *reversed(keys)])


def _children(node: Node) -> list[Node]:
    kids = [*node.props.values(), node.extra, node.items, node.target, *node.options]
    return [kid for kid in kids if kid is not None]


def _nodes(root: Node) -> list[Node]:
    """Every node reachable from `root`, each once."""
    seen, order, stack = set(), [], [root]
    while stack:
        node = stack.pop()
        if id(node) not in seen:
            seen.add(id(node))
            order.append(node)
            stack.extend(_children(node))
    return order


def _silent(node: Node) -> tuple:
    """The nodes a value of `node` may start as before any character is written."""
    return (node.target,) if node.kind == "ref" else node.options if node.kind == "anyof" else ()


def _refuse_silent_cycles(nodes: list[Node]) -> None:
    """Depth-first search over `_silent` edges (iterative: a long chain must not exhaust the stack)."""
    marks: dict[int, int] = {}  # id -> 1 while on the search path, 2 once finished
    for start in nodes:
        if id(start) in marks:
            continue
        path, todo = [start], [iter(_silent(start))]
        marks[id(start)] = 1
        while todo:
            node = next(todo[-1], None)
            if node is None:
                marks[id(path.pop())] = 2
                todo.pop()
            elif marks.get(id(node)) == 1:
                cycle = path[[id(n) for n in path].index(id(node)):] + [node]
                refs = [n.path for n in cycle if n.kind == "ref"]
                raise InvalidSchemaError(f"$ref {' -> '.join(refs)} comes back to itself before writing any character, "
                                         "so no document can start; recurse only under properties or items", refs[0])
            elif id(node) not in marks:
                marks[id(node)] = 1
                path.append(node)
                todo.append(iter(_silent(node)))


def _measure(nodes: list[Node]) -> None:
    """Set `height` on every node not measured yet: the fewest nested objects and arrays of a document, or None
    above MAX_SCHEMA_DEPTH (the module docstring's algorithm, with one bucket per height)."""
    buckets: list[list[Node]] = [[] for _ in range(MAX_SCHEMA_DEPTH + 1)]
    parents: dict[int, list[Node]] = {}  # id(child) -> the nodes whose height waits on it, once per edge
    waiting: dict[int, int] = {}  # id(object or array) -> its needed children not settled yet
    for node in nodes:
        if node.height is not None:  # shared and measured once (serving.guided.schema.ANY_OBJECT, ...)
            buckets[node.height].append(node)
            continue
        if node.kind in _LEAVES:
            buckets[0].append(node)
            continue
        if node.kind == "object":
            needs = [node.props.get(name, node.extra) for name in node.required]
        elif node.kind == "array":
            if node.max_items is not None and node.max_items < node.min_items:
                continue  # no document: never settles
            needs = [node.items] if node.min_items > 0 else []
        else:  # anyof, ref: settle with their first settled option
            needs = list(_silent(node))
        for child in needs:
            parents.setdefault(id(child), []).append(node)
        if node.kind in ("object", "array"):
            waiting[id(node)] = len(needs)
            if not needs:
                buckets[1].append(node)
    settled: dict[int, int] = {}
    for height, bucket in enumerate(buckets):
        i = 0
        while i < len(bucket):  # grows while read: anyOf and $ref parents settle at their child's height
            node, i = bucket[i], i + 1
            if id(node) in settled:
                continue
            settled[id(node)] = height
            for parent in parents.get(id(node), ()):
                if id(parent) in settled:
                    continue
                if parent.kind in ("anyof", "ref"):
                    bucket.append(parent)
                    continue
                waiting[id(parent)] -= 1  # settled in increasing order: the last one is the highest
                if waiting[id(parent)] == 0 and height < MAX_SCHEMA_DEPTH:
                    buckets[height + 1].append(parent)
    for node in nodes:
        if node.height is None:
            node.height = settled.get(id(node))


def _culprit(node: Node) -> str:
    """Where a node without height goes wrong: follow unmeasured required members, items and options until a
    node repeats (the recursion) or none is left (too deep on its own)."""
    seen = set()
    while id(node) not in seen:
        seen.add(id(node))
        if node.kind == "object":
            nxt = [node.props.get(name, node.extra) for name in sorted(node.required)]
        else:
            nxt = [node.items] if node.kind == "array" else list(_silent(node))
        nxt = [kid for kid in nxt if kid is not None and kid.height is None]
        if not nxt:
            break
        node = nxt[0]
    return node.path


def compile_schema(schema: dict) -> Node:
    """The root `Node` of `schema`, every node's `height` measured.

    Raises:
        InvalidSchemaError: deeper than MAX_SCHEMA_DEPTH / MAX_JSON_DEPTH, a `$ref` cycle that writes
            nothing, or no document within MAX_SCHEMA_DEPTH nested objects and arrays.
        UnsupportedSchemaError: a keyword outside the supported subset, or a malformed schema.
    """
    check_json_depth(schema)
    root = build_nodes(schema)
    check_decodable(root)
    return root


def response_format_schema(response_format: dict) -> dict | None:
    """The JSON Schema that an OpenAI `response_format` asks for; None for `{"type": "text"}`.

    Raises:
        InvalidSchemaError: a schema too deep, with a `$ref` cycle that writes nothing, or with no document
            within the depth bound (`compile_schema`).
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
