"""The JSON automaton's transition function: one configuration and one character -> the next configurations.

A configuration is `((frame, parent), ws)`: an immutable linked stack of frames and the length of the
whitespace run that ends at this point. Frames (the first element names the kind):

    ("val", node)                            a value of schema `node` starts here
    ("str", escape, key or None, hex, left)  in a string: escape 0/1/2 (plain, after \\, in \\uXXXX),
                                             the key read so far (object keys), \\u digits, characters left (-1: no bound)
    ("num", integer only, phase, digits)     in a number; phase of `_NUM`, digits of that part
    ("lit", texts, pos)                      in a literal (true, null, an enum value): the candidates, position
    ("obj", node, phase, seen keys[, key])   in an object: first, key, colon, value, after, next
    ("arr", node, phase, count)              in an array: first, value, after
    ("text", text, pos, then)                inside fixed text (a tag), `then` the frame that follows it
    ("done", blocks left, reopen)            after a whole block; `reopen` = ((separator + begin, node, end), ...)
    ("root", end, blocks left, reopen)       the bottom of a block's stack (never on top)

The bounds (see `serving.guided.automaton`) live here as constants.
"""

from __future__ import annotations

from serving.guided.schema import ANY, ANY_ARRAY, ANY_OBJECT, MAX_SCHEMA_DEPTH, Node, literals

MAX_INT_DIGITS, MAX_FRAC_DIGITS, MAX_EXP_DIGITS = 15, 20, 3  # 20: every Python repr of a float in [1e-4, 1)
MAX_DEPTH = 8
MAX_WHITESPACE = 1 + 2 * MAX_DEPTH  # a newline and the indentation of MAX_DEPTH levels of 2 spaces
MAX_MEMBERS = 16  # undeclared members of one object; items of one free-form array
MAX_KEY_CHARS = 64  # an undeclared key
MAX_STRING_CHARS = 512  # a free-form string value

_DIGITS = "0123456789"
# JSON number grammar: phase -> {character class -> next phase}; phases in _NUM_END may end the number.
_NUM = {"-": {"0": "0", "1": "int"}, "0": {".": ".", "e": "e"}, "int": {"d": "int", ".": ".", "e": "e"},
        ".": {"d": "frac"}, "frac": {"d": "frac", "e": "e"}, "e": {"+": "sign", "d": "exp"}, "sign": {"d": "exp"},
        "exp": {"d": "exp"}}
_NUM_END = {"0", "int", "frac", "exp"}
_NUM_DIGITS = {"0": 1, "int": MAX_INT_DIGITS, "frac": MAX_FRAC_DIGITS, "exp": MAX_EXP_DIGITS}  # phase -> most digits
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


def open_block(begin: str, node: Node, end: str, left: int, reopen: tuple) -> tuple:
    """The configuration at the start of a block: its begin text, then its document."""
    root = (("root", end, left, reopen), None)
    return (((("text", begin, 0, ("val", node)) if begin else ("val", node)), root), 0)


def can_end(frame: tuple) -> bool:
    """Whether a number or literal on top may end here (the next character is then re-fed)."""
    return (frame[0] == "num" and frame[2] in _NUM_END) or (frame[0] == "lit" and any(len(t) == frame[2] for t in frame[1]))


def step(cfg: tuple, c: str, compact: bool = False) -> list:
    """The configurations after character `c` (none: `c` cannot follow); `compact`: a whitespace run is one space."""
    stack, ws = cfg
    frame, parent = stack
    kind = frame[0]
    if c in " \n" and (kind in ("obj", "arr") or (kind == "val" and parent[0][0] != "root")):
        allowed = (c == " " and ws == 0) if compact else (ws == 0 if c == "\n" else ws < MAX_WHITESPACE)
        return [(stack, ws + 1)] if allowed else []
    if kind == "val":
        return _start(frame[1], parent, c)
    if kind == "str":
        return _string(frame, parent, c)
    if kind in ("num", "lit"):
        nxt = _number(frame, c) if kind == "num" else _literal(frame, c)
        if nxt is not None:
            return [((nxt, parent), 0)]
        return step((_complete(parent), 0), c, compact) if can_end(frame) else []
    if kind == "obj":
        return _object(frame, parent, c)
    if kind == "arr":
        return _array(frame, parent, c)
    if kind == "text":
        _, text, pos, then = frame
        if c != text[pos]:
            return []
        return [(((then if pos + 1 == len(text) else ("text", text, pos + 1, then)), parent), 0)]
    _, left, reopen = frame  # "done": nothing follows, but another block may
    return [cfg for begin, node, end in reopen for cfg in step(open_block(begin, node, end, left - 1, reopen), c, compact)] if left else []


def _complete(parent: tuple) -> tuple:
    """The stack after the value on top of `parent` ended."""
    frame, up = parent
    if frame[0] == "root":
        done = ("done", frame[2], frame[3])
        return (("text", frame[1], 0, done) if frame[1] else done, up)
    if frame[0] == "obj":
        return (("obj", frame[1], "after", frame[3]), up)
    return (("arr", frame[1], "after", frame[3] + 1), up)


def _depth(parent: tuple | None) -> int:
    """Objects and arrays enclosing a value whose parent stack is `parent`."""
    depth = 0
    while parent is not None:
        depth += parent[0][0] in ("obj", "arr")
        parent = parent[1]
    return depth


def _start(node: Node, parent: tuple, c: str) -> list:
    while node.kind == "ref":  # ends: serving.guided.checks refused $ref cycles that write nothing
        node = node.target
    kind = node.kind
    if kind == "anyof":
        return [cfg for option in node.options for cfg in _start(option, parent, c)]
    if kind == "any":
        node = {"{": ANY_OBJECT, "[": ANY_ARRAY, '"': _STRING, "t": _TRUE_FALSE, "f": _TRUE_FALSE, "n": _NULL}.get(c)
        if node is None:
            node = _NUMBER if c == "-" or c in _DIGITS else None
        if node is None or (c in "{[" and _depth(parent) >= MAX_DEPTH):
            return []
        return _start(node, parent, c)
    if kind in ("object", "array"):
        # Only a container whose shortest document still fits under MAX_SCHEMA_DEPTH here opens: a recursive
        # schema cannot nest without end, and never into a branch it could not close (serving.guided.checks).
        if c != ("{" if kind == "object" else "[") or node.height is None or _depth(parent) + node.height > MAX_SCHEMA_DEPTH:
            return []
        return [((("obj", node, "first", frozenset()) if kind == "object" else ("arr", node, "first", 0), parent), 0)]
    if kind == "string":
        return [((("str", 0, None, "", MAX_STRING_CHARS if node is _STRING else -1), parent), 0)] if c == '"' else []
    if kind in ("number", "integer"):
        phase = "-" if c == "-" else "0" if c == "0" else "int" if c in _DIGITS else None
        return [] if phase is None else [((("num", kind == "integer", phase, int(phase != "-")), parent), 0)]
    nxt = _literal(("lit", node.texts, 0), c)
    return [] if nxt is None else [((nxt, parent), 0)]


_TRUE_FALSE, _NULL, _NUMBER, _STRING = literals([True, False]), literals([None]), Node("number"), Node("string")


def _literal(frame: tuple, c: str) -> tuple | None:
    texts, pos = frame[1], frame[2]
    keep = tuple(t for t in texts if len(t) > pos and t[pos] == c)
    return ("lit", keep, pos + 1) if keep else None


def _number(frame: tuple, c: str) -> tuple | None:
    _, integer, phase, digits = frame
    cls = "d" if c in _DIGITS else "e" if c in "eE" else "+" if c in "+-" else "." if c == "." else None
    if cls == "d" and phase == "-":
        cls = "0" if c == "0" else "1"
    nxt = _NUM[phase].get(cls)
    if nxt is None or (integer and nxt in (".", "e")):
        return None
    digits = digits + 1 if nxt == phase else int(nxt in _NUM_DIGITS)
    return None if digits > _NUM_DIGITS.get(nxt, 0) else ("num", integer, nxt, digits)


def _takes_extra(node: Node, seen: frozenset) -> bool:
    """Whether an object may still take an undeclared member (at most MAX_MEMBERS of them)."""
    return node.extra is not None and len(seen.difference(node.props)) < MAX_MEMBERS


def _string(frame: tuple, parent: tuple, c: str) -> list:
    _, esc, key, hexd, left = frame
    add = None
    if esc == 0:
        if c == '"':
            return [(_complete(parent), 0)] if key is None else _key_done(parent, key)
        if left == 0:
            return []
        if c == "\\":  # in a key only when any character may follow (no dead end inside \uXXXX)
            if key is not None and not (_takes_extra(parent[0][1], parent[0][3]) and len(key) < MAX_KEY_CHARS):
                return []
            return [((("str", 1, key, "", left), parent), 0)]
        if c < " ":
            return []
        add = c
    elif esc == 1:
        if c == "u":
            return [((("str", 2, key, "", left), parent), 0)]
        add = _ESCAPES.get(c)
        if add is None:
            return []
    else:
        if c not in "0123456789abcdefABCDEF":
            return []
        if len(hexd) < 3:
            return [((("str", 2, key, hexd + c, left), parent), 0)]
        add = chr(int(hexd + c, 16))
    if key is not None:
        key += add
        obj, seen = parent[0][1], parent[0][3]
        declared = any(p.startswith(key) and p not in seen for p in obj.props)
        # An undeclared key may grow to MAX_KEY_CHARS; at that length it must already be a new key.
        extra = _takes_extra(obj, seen) and (len(key) < MAX_KEY_CHARS or (len(key) == MAX_KEY_CHARS and key not in seen))
        if not (declared or extra):
            return []
    return [((("str", 0, key, "", left - (left > 0)), parent), 0)]


def _key_done(parent: tuple, key: str) -> list:
    (_, node, _, seen), up = parent
    if key in seen or (key not in node.props and not _takes_extra(node, seen)):
        return []
    return [((("obj", node, "colon", seen | {key}, key), up), 0)]


def _object(frame: tuple, parent: tuple, c: str) -> list:
    node, phase, seen = frame[1], frame[2], frame[3]
    more = _takes_extra(node, seen) or bool(set(node.props) - seen)
    if c == "}" and phase in ("first", "after"):
        return [(_complete(parent), 0)] if node.required <= seen else []
    if c == '"' and phase in ("first", "next"):
        return [((("str", 0, "", "", -1), (("obj", node, "key", seen), parent)), 0)] if more else []
    if c == ":" and phase == "colon":
        child = node.props.get(frame[4], node.extra)
        return [((("val", child), (("obj", node, "value", seen), parent)), 0)]
    if c == "," and phase == "after" and more:
        return [((("obj", node, "next", seen), parent), 0)]
    return []


def _array(frame: tuple, parent: tuple, c: str) -> list:
    node, phase, count = frame[1], frame[2], frame[3]
    if c == "]":
        return [(_complete(parent), 0)] if count >= node.min_items else []
    limit = node.max_items if node.max_items is not None else max(MAX_MEMBERS, node.min_items) if node.items is ANY else None
    full = limit is not None and count >= limit
    if phase == "after":
        return [((("val", node.items), (("arr", node, "value", count), parent)), 0)] if c == "," and not full else []
    return [] if full else _start(node.items, (("arr", node, "value", count), parent), c)
