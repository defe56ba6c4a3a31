"""Guided decoding's automaton: a JSON Schema subset (or tagged JSON blocks) compiled into a character-level machine.

    automaton = JsonAutomaton(schema)            # raises UnsupportedSchemaError naming the keyword
    state = automaton.feed(automaton.start(), '{"a": 1')   # None once the text can no longer be valid
    automaton.is_complete(state)                # True when the text is one whole document

The automaton is a pushdown machine over characters (its transition function and frames are in
`serving.guided.steps`). A state is a tuple of configurations, because `anyOf` (and a type list, and
a choice of tags) is followed on every branch at once until the text rules branches out. Numbers and
literals (`true`, enum values) end only when a character arrives that cannot extend them; that
character is then fed to the enclosing frame ("re-feed").

Tagged blocks (`JsonAutomaton.tagged`, vLLM's "structural tag"): the output is one to `max_blocks`
blocks, each a structure's `begin` text, a JSON document that follows its schema and its `end` text,
joined by `separator`, optionally with compact whitespace (a run is one space). Forced tool calls use it
(`serving.guided.tool_choice`): begin `<tool_call>\\n{"name": "f", "arguments": `, the parameters schema, end
`}\\n</tool_call>`, compact.

Bounds, so that a constrained model always heads for the end of the document (a small model left free
looped on digits, on ever longer keys and on new members until max_tokens). "Free-form" means a value
the schema does not describe: everything under `json_object`, and undeclared members.

- whitespace: a run between tokens is an optional newline then spaces, `MAX_WHITESPACE` characters in
  all (no tabs, no blank lines): compact and pretty-printed JSON (`indent=2`, `MAX_DEPTH` levels) pass,
  endless blank padding does not. The document starts at its first character; nothing may follow it.
- numbers: at most `MAX_INT_DIGITS` (15) digits before the point (past that, integers lose float
  precision: write 1.5e16), `MAX_FRAC_DIGITS` (20) after it and `MAX_EXP_DIGITS` (3) in the exponent.
- nesting: a free-form value opens no container deeper than `MAX_DEPTH` (8), counting every enclosing
  object and array.
- size: an object takes at most `MAX_MEMBERS` undeclared members (keys of at most `MAX_KEY_CHARS`
  characters), a free-form array at most `MAX_MEMBERS` items, a free-form string at most
  `MAX_STRING_CHARS` characters.

A schema's own nesting, arrays and strings are bounded by the schema alone (a schema string can still
run to `max_tokens`). No bound can dead-end: each leaves a way to close the value. The schema subset is
`serving.guided.schema`'s; `{"type": "json_object"}` is the schema `{"type": "object"}`.
"""

from __future__ import annotations

import json
import time

from serving.errors import SamplingTimeoutError
from serving.guided.checks import compile_schema, response_format_schema
from serving.guided.schema import UnsupportedSchemaError
from serving.guided.steps import (
    MAX_DEPTH, MAX_EXP_DIGITS, MAX_FRAC_DIGITS, MAX_INT_DIGITS, MAX_KEY_CHARS, MAX_MEMBERS, MAX_STRING_CHARS,
    MAX_WHITESPACE, can_end, open_block, step,
)

__all__ = ["JsonAutomaton", "State", "UnsupportedSchemaError", "automaton_for", "response_format_schema", "MAX_DEPTH",
           "MAX_EXP_DIGITS", "MAX_FRAC_DIGITS", "MAX_INT_DIGITS", "MAX_KEY_CHARS", "MAX_MEMBERS", "MAX_STRING_CHARS",
           "MAX_WHITESPACE"]

State = tuple  # of configurations ((frame, parent), whitespace run length); see serving.guided.steps
CHECK_EVERY = 256  # configurations stepped between two deadline checks in `JsonAutomaton.feed`


class JsonAutomaton:
    """Accepts exactly the prefixes of JSON documents that follow `schema` (see the module docstring).

    Raises:
        UnsupportedSchemaError: the schema uses a keyword outside the supported subset.
    """

    def __init__(self, schema: dict):
        self.blocks, self.max_blocks, self._again, self.compact = (("", compile_schema(schema), ""),), 1, (), False

    @classmethod
    def tagged(cls, structures: list[dict], max_blocks: int = 1, separator: str = "\n",
               whitespace: str = "any") -> JsonAutomaton:
        """An automaton over 1..max_blocks blocks `begin + document + end`, any structure each time.

        Args:
            structures: [{"begin": str, "schema": JSON Schema, "end": str}, ...], at least one.
            max_blocks: the most blocks, >= 1.
            separator: the text between blocks ("" writes them back to back); with max_blocks > 1,
                separator + each begin must be non-empty, so that a next block is told from the end.
            whitespace: "any" (the bounded runs of the module docstring) or "compact" (a run is one space,
                no newline: `{"a": 1, "b": [2, 3]}` passes, pretty-printed JSON does not).
        Raises:
            UnsupportedSchemaError: a malformed structure, an unsupported schema keyword, or an unknown whitespace.
        """
        if whitespace not in ("any", "compact"):
            raise UnsupportedSchemaError(f"whitespace must be 'any' or 'compact', got {whitespace!r}")
        if not structures or not all(isinstance(s, dict) and isinstance(s.get("schema"), dict) for s in structures):
            raise UnsupportedSchemaError("a structural tag needs structures [{\"begin\", \"schema\", \"end\"}, ...]")
        marked = all(separator + str(s.get("begin", "")) for s in structures)
        if not isinstance(max_blocks, int) or max_blocks < 1 or (max_blocks > 1 and not marked):
            raise UnsupportedSchemaError(f"max_blocks must be >= 1 (with a separator or begin texts when > 1), got {max_blocks!r}")
        self = cls.__new__(cls)
        self.blocks = tuple((str(s.get("begin", "")), compile_schema(s["schema"]), str(s.get("end", ""))) for s in structures)
        self.max_blocks, self._again = max_blocks, tuple((separator + begin, node, end) for begin, node, end in self.blocks)
        self.compact = whitespace == "compact"
        return self

    def start(self) -> State:
        return tuple(open_block(begin, node, end, self.max_blocks - 1, self._again) for begin, node, end in self.blocks)

    def feed(self, state: State, text: str, deadline: float | None = None) -> State | None:
        """The state after `text`, or None when no continuation of the text can be valid.

        Args:
            deadline: a `time.monotonic()` time. A state of `CHECK_EVERY` configurations or more (an
                ambiguous schema's branches multiply) checks it every `CHECK_EVERY` of them; None: no limit.
        Raises:
            SamplingTimeoutError: the deadline passed.
        """
        for c in text:
            if deadline is None or len(state) < CHECK_EVERY:
                nxt = [cfg for old in state for cfg in step(old, c, self.compact)]
            else:
                nxt = []
                for i in range(0, len(state), CHECK_EVERY):
                    if time.monotonic() > deadline:
                        raise SamplingTimeoutError(f"guided decoding ran past its deadline ({len(state)} parses at once)")
                    nxt.extend(cfg for old in state[i:i + CHECK_EVERY] for cfg in step(old, c, self.compact))
            if not nxt:
                return None
            state = tuple(nxt) if len(nxt) == 1 else tuple(dict.fromkeys(nxt))
        return state

    def is_complete(self, state: State) -> bool:
        """True when the text fed so far is a whole output (end of output may come now)."""
        for (frame, parent), _ in state:
            if frame[0] == "done":
                return True
            if parent is not None and parent[0][0] == "root" and not parent[0][1] and can_end(frame):
                return True
        return False

    def is_closed(self, state: State) -> bool:
        """True when the output is complete on every path and nothing may follow it (no further block)."""
        return bool(state) and all(frame[0] == "done" and frame[1] == 0 for (frame, _), _ in state)

    def forced_char(self, state: State) -> str | None:
        """The one character every path must take next when all are inside fixed text (a tag), else None."""
        chars = {frame[1][frame[2]] if frame[0] == "text" else None for (frame, _), _ in state}
        return next(iter(chars)) if len(chars) == 1 else None


def automaton_for(guided_json: str | None, structural_tag: str | None) -> JsonAutomaton | None:
    """The automaton of a request's `SamplingParams.guided_json` or `.structural_tag` (JSON texts), or None.

    Raises:
        UnsupportedSchemaError: malformed JSON, a malformed tag, or an unsupported schema keyword.
    """
    try:
        if guided_json is not None:
            return JsonAutomaton(json.loads(guided_json))
        if structural_tag is not None:
            tag = json.loads(structural_tag)
            return JsonAutomaton.tagged(tag.get("structures"), tag.get("max_blocks", 1), tag.get("separator", "\n"),
                                        tag.get("whitespace", "any"))
    except (json.JSONDecodeError, AttributeError) as exc:
        raise UnsupportedSchemaError(f"guided decoding spec is not a JSON object: {exc}") from None
    return None
