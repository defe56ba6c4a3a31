"""`response_format` for local models: a JSON Schema subset compiled into a character-level automaton.

    automaton = JsonAutomaton(schema)            # raises UnsupportedSchemaError naming the keyword
    state = automaton.feed(automaton.start(), '{"a": 1')   # None once the text can no longer be valid
    automaton.is_complete(state)                # True when the text is one whole document

The automaton is a pushdown machine over characters. A configuration is an immutable linked stack of
frames, `(frame, parent)`, plus the length of the current whitespace run; a state is a tuple of
configurations, because `anyOf` (and a type list) is followed on every branch at once until the text
rules branches out. Numbers and literals (`true`, enum values) end only when a character arrives that
cannot extend them; that character is then fed to the enclosing frame ("re-feed").

The schema subset is `serving.guided_schema`'s; `{"type": "json_object"}` is the schema `{"type": "object"}`.
Whitespace runs are capped at `MAX_WHITESPACE` characters and numbers at `MAX_NUMBER_CHARS`, so a
constrained model cannot loop on blanks or digits; an endless string still ends at `max_tokens`.
"""

from __future__ import annotations

from serving.guided_schema import ANY_ARRAY, ANY_OBJECT, Node, UnsupportedSchemaError, compile_schema, literals, response_format_schema

__all__ = ["JsonAutomaton", "State", "UnsupportedSchemaError", "response_format_schema"]

MAX_WHITESPACE = 24  # a newline plus indentation of pretty-printed JSON nested 5 levels deep
MAX_NUMBER_CHARS = 32
_WS = " \t\n\r"
_DIGITS = "0123456789"
# JSON number grammar: phase -> {character class -> next phase}; phases in _NUM_END may end the number.
_NUM = {"-": {"0": "0", "1": "int"}, "0": {".": ".", "e": "e"}, "int": {"d": "int", ".": ".", "e": "e"},
        ".": {"d": "frac"}, "frac": {"d": "frac", "e": "e"}, "e": {"+": "sign", "d": "exp"}, "sign": {"d": "exp"},
        "exp": {"d": "exp"}}
_NUM_END = {"0", "int", "frac", "exp"}


State = tuple  # of configurations ((frame, parent), whitespace run)


class JsonAutomaton:
    """Accepts exactly the prefixes of JSON documents that follow `schema` (see the module docstring).

    Raises:
        UnsupportedSchemaError: the schema uses a keyword outside the supported subset.
    """

    def __init__(self, schema: dict):
        self.root = compile_schema(schema)

    def start(self) -> State:
        return (((("val", self.root), (("root",), None)), 0),)

    def feed(self, state: State, text: str) -> State | None:
        """The state after `text`, or None when no continuation of the text can be valid."""
        for c in text:
            nxt = [cfg for old in state for cfg in _step(old, c)]
            if not nxt:
                return None
            state = tuple(nxt) if len(nxt) == 1 else tuple(dict.fromkeys(nxt))
        return state

    def is_complete(self, state: State) -> bool:
        """True when the text fed so far is one whole document (end of output may come now)."""
        for (frame, parent), _ in state:
            if frame[0] == "done":
                return True
            if parent is not None and parent[0][0] == "root" and _can_end(frame):
                return True
        return False


def _can_end(frame: tuple) -> bool:
    return (frame[0] == "num" and frame[2] in _NUM_END) or (frame[0] == "lit" and any(len(t) == frame[2] for t in frame[1]))


def _complete(parent: tuple) -> tuple:
    """The stack after the value on top of `parent` ended."""
    frame, up = parent
    if frame[0] == "root":
        return (("done",), up)
    if frame[0] == "obj":
        return (("obj", frame[1], "after", frame[3]), up)
    return (("arr", frame[1], "after", frame[3] + 1), up)


def _ws(stack: tuple, ws: int) -> list:
    return [(stack, ws + 1)] if ws < MAX_WHITESPACE else []


def _step(cfg: tuple, c: str) -> list:
    stack, ws = cfg
    frame, parent = stack
    kind = frame[0]
    if kind == "val":
        return _ws(stack, ws) if c in _WS else _start(frame[1], parent, c)
    if kind == "str":
        return _string(frame, parent, c)
    if kind in ("num", "lit"):
        nxt = _number(frame, c) if kind == "num" else _literal(frame, c)
        if nxt is not None:
            return [((nxt, parent), 0)]
        return _step((_complete(parent), 0), c) if _can_end(frame) else []
    if kind == "obj":
        return _object(frame, parent, c, ws)
    if kind == "arr":
        return _array(frame, parent, c, ws)
    return _ws(stack, ws) if c in _WS else []  # "done": only (bounded) whitespace may follow the document


def _start(node: Node, parent: tuple, c: str) -> list:
    while node.kind == "ref":
        node = node.target
    kind = node.kind
    if kind == "anyof":
        return [cfg for option in node.options for cfg in _start(option, parent, c)]
    if kind == "any":
        node = {"{": ANY_OBJECT, "[": ANY_ARRAY, '"': _STRING, "t": _TRUE_FALSE, "f": _TRUE_FALSE, "n": _NULL}.get(c)
        if node is None:
            node = _NUMBER if c == "-" or c in _DIGITS else None
        return [] if node is None else _start(node, parent, c)
    if kind == "object":
        return [((("obj", node, "first", frozenset()), parent), 0)] if c == "{" else []
    if kind == "array":
        return [((("arr", node, "first", 0), parent), 0)] if c == "[" else []
    if kind == "string":
        return [((("str", 0, None, ""), parent), 0)] if c == '"' else []
    if kind in ("number", "integer"):
        phase = "-" if c == "-" else "0" if c == "0" else "int" if c in _DIGITS else None
        return [] if phase is None else [((("num", kind == "integer", phase, 1), parent), 0)]
    nxt = _literal(("lit", node.texts, 0), c)
    return [] if nxt is None else [((nxt, parent), 0)]


_TRUE_FALSE, _NULL, _NUMBER, _STRING = literals([True, False]), literals([None]), Node("number"), Node("string")


def _literal(frame: tuple, c: str) -> tuple | None:
    texts, pos = frame[1], frame[2]
    keep = tuple(t for t in texts if len(t) > pos and t[pos] == c)
    return ("lit", keep, pos + 1) if keep else None


def _number(frame: tuple, c: str) -> tuple | None:
    _, integer, phase, size = frame
    cls = "d" if c in _DIGITS else "e" if c in "eE" else "+" if c in "+-" else "." if c == "." else None
    if cls == "d" and phase == "-":
        cls = "0" if c == "0" else "1"
    nxt = _NUM[phase].get(cls)
    # A phase that cannot end the number needs room for the digit that must follow it.
    if nxt is None or size >= MAX_NUMBER_CHARS - (0 if nxt in _NUM_END else 2) or (integer and nxt in (".", "e")):
        return None
    return ("num", integer, nxt, size + 1)


def _string(frame: tuple, parent: tuple, c: str) -> list:
    """frame = ("str", escape, key or None, hex digits): escape 0 plain, 1 after a backslash, 2 in \\uXXXX."""
    _, esc, key, hexd = frame
    add = None
    if esc == 0:
        if c == '"':
            return [(_complete(parent), 0)] if key is None else _key_done(parent, key)
        if c == "\\":  # no escapes in a key that must spell a property name (keeps every prefix completable)
            return [] if key is not None and parent[0][1].extra is None else [((("str", 1, key, ""), parent), 0)]
        if c < " ":
            return []
        add = c
    elif esc == 1:
        if c == "u":
            return [((("str", 2, key, ""), parent), 0)]
        add = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}.get(c)
        if add is None:
            return []
    else:
        if c not in "0123456789abcdefABCDEF":
            return []
        if len(hexd) < 3:
            return [((("str", 2, key, hexd + c), parent), 0)]
        add = chr(int(hexd + c, 16))
    if key is not None:
        key += add
        obj = parent[0][1]
        if obj.extra is None and not any(p.startswith(key) and p not in parent[0][3] for p in obj.props):
            return []
    return [((("str", 0, key, ""), parent), 0)]


def _key_done(parent: tuple, key: str) -> list:
    (_, node, _, seen), up = parent
    if key in seen or (node.extra is None and key not in node.props):
        return []
    return [((("obj", node, "colon", seen | {key}, key), up), 0)]


def _object(frame: tuple, parent: tuple, c: str, ws: int) -> list:
    """frame = ("obj", node, phase, seen keys[, key]); phases first, colon, after, next (value: a child is on top)."""
    node, phase, seen = frame[1], frame[2], frame[3]
    if c in _WS:
        return _ws((frame, parent), ws)
    if c == "}" and phase in ("first", "after"):
        return [(_complete(parent), 0)] if node.required <= seen else []
    if c == '"' and phase in ("first", "next"):
        if node.extra is None and not set(node.props) - seen:
            return []
        return [((("str", 0, "", ""), (("obj", node, "key", seen), parent)), 0)]
    if c == ":" and phase == "colon":
        child = node.props.get(frame[4], node.extra)
        return [((("val", child), (("obj", node, "value", seen), parent)), 0)]
    if c == "," and phase == "after" and (node.extra is not None or set(node.props) - seen):
        return [((("obj", node, "next", seen), parent), 0)]
    return []


def _array(frame: tuple, parent: tuple, c: str, ws: int) -> list:
    """frame = ("arr", node, phase, items so far); phases first, after (value: an item is on top)."""
    node, phase, count = frame[1], frame[2], frame[3]
    if c in _WS:
        return _ws((frame, parent), ws)
    if c == "]":
        return [(_complete(parent), 0)] if count >= node.min_items else []
    full = node.max_items is not None and count >= node.max_items
    if phase == "after":
        return [((("val", node.items), (("arr", node, "value", count), parent)), 0)] if c == "," and not full else []
    return [] if full else _start(node.items, (("arr", node, "value", count), parent), c)
