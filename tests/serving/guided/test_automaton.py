"""The JSON automaton of guided decoding: against `json.loads` (with the bounds checked independently),
the schema subset, each bound at its limit, no dead ends, and tagged blocks. The guide that samples
through it, and the real models, are in test_guided_decoding.py.

    LINK_HOME=.link LINK_DATASETS_DIR=../shared/data .venv/bin/python -m pytest -q tests/serving/guided/test_automaton.py
"""

from __future__ import annotations

import json
import random
import re

import pytest

from serving.guided import steps
from serving.guided.automaton import (
    MAX_DEPTH, MAX_EXP_DIGITS, MAX_FRAC_DIGITS, MAX_INT_DIGITS, MAX_KEY_CHARS, MAX_MEMBERS, MAX_STRING_CHARS, MAX_WHITESPACE,
    JsonAutomaton, UnsupportedSchemaError, automaton_for, response_format_schema,
)
from tests.serving.guided_cases import PERSON, TREE, valid

def _reject_index(auto: JsonAutomaton, text: str) -> int | None:
    """The index of the first character the automaton refuses, or None."""
    state = auto.start()
    for i, c in enumerate(text):
        state = auto.feed(state, c)
        if state is None:
            return i
    return None


KEY_CHARS = 'aé"\\'


def _random_value(rng: random.Random, depth: int = 0):
    kinds = ["str", "int", "float", "bool", "null"] + (["obj", "arr"] if depth < 3 else [])
    kind = rng.choice(kinds)
    if kind == "obj":
        return {f"k{i}{rng.choice(KEY_CHARS)}": _random_value(rng, depth + 1) for i in range(rng.randint(0, 3))}
    if kind == "arr":
        return [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {"str": lambda: "".join(rng.choice('ab "\\\n\té☃') for _ in range(rng.randint(0, 5))),
            # floats: fixed notation (at most 20 fraction digits) or exponent notation (repr at >= 1e16)
            "int": lambda: rng.randint(-1000, 1000), "float": lambda: rng.uniform(-1e6, 1e6) * rng.choice([1, 1e-9, 1e20]),
            "bool": lambda: rng.random() < 0.5, "null": lambda: None}[kind]()


def _documents(count: int) -> list[str]:
    rng = random.Random(0)
    docs = []
    for i in range(count):
        value = {"root": _random_value(rng), "n": i}
        style = [dict(), dict(indent=2), dict(separators=(",", ":")), dict(ensure_ascii=False)][i % 4]
        docs.append(json.dumps(value, **style))
    return docs


def _strict_loads(text: str):
    def no_duplicates(pairs):
        keys = [k for k, _ in pairs]
        if len(keys) != len(set(keys)):
            raise ValueError("duplicate key")
        return dict(pairs)

    return json.loads(text, object_pairs_hook=no_duplicates, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))


def _within_bounds(text: str) -> bool:
    """The whitespace and number bounds of serving.guided.automaton, checked on the text with its strings emptied."""
    outside = re.sub(r'"(?:[^"\\]|\\.)*"', '""', text)
    if outside != outside.strip():
        return False
    if any(not re.fullmatch(r"\n? *", run) or len(run) > MAX_WHITESPACE for run in re.findall(r"\s+", outside)):
        return False
    limits = (MAX_INT_DIGITS, MAX_FRAC_DIGITS, MAX_EXP_DIGITS)
    return all(len(part or "") <= limit for m in re.finditer(r"-?(\d+)(?:\.(\d+))?(?:[eE][+-]?(\d+))?", outside)
               for part, limit in zip(m.groups(), limits))


def test_every_prefix_of_a_valid_document_is_accepted_and_only_the_whole_is_complete():
    auto = JsonAutomaton({"type": "object"})
    for doc in _documents(60):
        assert _within_bounds(doc), doc
        state = auto.start()
        for i, c in enumerate(doc):
            assert not auto.is_complete(state) or i == len(doc), doc[:i]
            state = auto.feed(state, c)
            assert state is not None, f"refused {doc[:i + 1]!r}"
        assert auto.is_complete(state)


def test_corruptions_are_rejected_no_earlier_than_the_corruption_and_agree_with_json_loads():
    auto, rng = JsonAutomaton({}), random.Random(1)  # any JSON value, as json.loads takes
    num_rejected = 0
    for doc in _documents(40):
        for _ in range(10):
            pos = rng.randrange(len(doc))
            bad = doc[:pos] + rng.choice('{}[]",:0-e. atfn\\x') + doc[pos + 1:]
            try:
                _strict_loads(bad)
                loads_ok, error_pos = _within_bounds(bad), None
            except json.JSONDecodeError as exc:
                loads_ok, error_pos = False, exc.pos
            except ValueError:
                loads_ok, error_pos = False, None
            index = _reject_index(auto, bad)
            complete = index is None and auto.is_complete(auto.feed(auto.start(), bad))
            assert complete == loads_ok, bad
            if index is not None:
                num_rejected += 1
                assert index >= min(pos, len(doc)), (bad, index, pos)  # the text before the change was a valid prefix
                if error_pos is not None and not bad[index].isspace() and not bad[index].isdigit():  # not a bound JSON lacks
                    assert index >= error_pos, (bad, index, error_pos)  # json.loads sees the problem there or earlier
    assert num_rejected > 100


@pytest.mark.parametrize("text", [
    '{"name": "Ann", "age": 31, "kind": "person"}',
    '{"kind":"person","age":-2,"name":"B","score":null,"role":"user","tags":["x","y"],"ok":true,"id":"a7"}',
    '{\n  "name": "C",\n  "age": 0,\n  "kind": "person",\n  "address": {"city": "Rome"},\n  "id": 12,\n  "score": 1.5e3\n}',
])
def test_schema_accepts_valid_instances(text):
    assert valid(PERSON, text) and json.loads(text)


@pytest.mark.parametrize("text", [
    '{"name": "Ann", "age": 31}',                                   # required "kind" missing
    '{"name": "Ann", "age": 31, "kind": "person", "extra": 1}',     # additionalProperties false
    '{"name": "Ann", "age": 3.5, "kind": "person"}',                # integer
    '{"name": "Ann", "age": 31, "kind": "robot"}',                  # const
    '{"name": "Ann", "age": 31, "kind": "person", "role": "root"}', # enum
    '{"name": 1, "age": 31, "kind": "person"}',                     # string
    '{"name": "A", "age": 1, "kind": "person", "tags": ["a", "b", "c", "d"]}',  # maxItems
    '{"name": "A", "age": 1, "kind": "person", "address": {}}',     # nested required
    '{"name": "A", "name": "B", "age": 1, "kind": "person"}',       # duplicate key
    '{"name": "A", "age": 1, "kind": "person"} x',                  # nothing after the document
])
def test_schema_rejects_invalid_instances(text):
    assert not valid(PERSON, text)




@pytest.mark.parametrize("schema, keyword", [
    ({"type": "string", "pattern": "^a"}, "pattern"),
    ({"type": "object", "properties": {"d": {"type": "string", "format": "date"}}}, "format"),
    ({"oneOf": [{"type": "string"}]}, "oneOf"),
    ({"type": "number", "minimum": 0}, "minimum"),
])
def test_unsupported_keywords_are_refused_by_name(schema, keyword):
    with pytest.raises(UnsupportedSchemaError, match=f"'{keyword}'"):
        response_format_schema({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})


def test_response_format_types():
    assert response_format_schema({"type": "text"}) is None
    assert response_format_schema({"type": "json_object"}) == {"type": "object"}
    with pytest.raises(UnsupportedSchemaError, match="not supported"):
        response_format_schema({"type": "yaml"})


# ---------------------------------------------------------------------------------------------
# Bounds: each one at its limit, and never a dead end
# ---------------------------------------------------------------------------------------------

FREE = JsonAutomaton({"type": "object"})  # json_object: every value free-form


def _accepts(auto: JsonAutomaton, text: str) -> bool:
    state = auto.feed(auto.start(), text)
    return state is not None and auto.is_complete(state)


def test_whitespace_is_one_newline_then_spaces_and_never_around_the_document():
    indent = " " * (MAX_WHITESPACE - 1)
    assert _accepts(FREE, '{\n  "a": [1, 2],\n  "b": {}\n}') and _accepts(FREE, '{ "a" : 1 , "b":2 }')
    assert _accepts(FREE, "{\n" + indent + '"a": 1}')
    assert not _accepts(FREE, "{\n" + indent + ' "a": 1}')  # one space too many
    assert not _accepts(FREE, '{\n\n"a": 1}') and not _accepts(FREE, '{\t"a": 1}') and not _accepts(FREE, '{ \n"a": 1}')
    assert FREE.feed(FREE.start(), " ") is None and FREE.feed(FREE.start(), "\n") is None  # starts at its first character
    assert FREE.feed(FREE.start(), "{} ") is None and FREE.feed(FREE.start(), "{}\n") is None


@pytest.mark.parametrize("schema", [{"type": "integer"}, {"type": "number"}, {}])
def test_the_sixteenth_integer_digit_is_refused(schema):
    auto = JsonAutomaton({"type": "object", "properties": {"n": schema}, "required": ["n"], "additionalProperties": False})
    assert MAX_INT_DIGITS == 15
    assert _accepts(auto, '{"n": -' + "9" * 15 + "}")
    assert auto.feed(auto.start(), '{"n": ' + "9" * 16) is None
    assert _reject_index(auto, '{"n": ' + "1" * 16 + "}") == len('{"n": ') + 15


def test_fraction_and_exponent_digits_are_bounded():
    frac, exp = "1" * MAX_FRAC_DIGITS, "9" * MAX_EXP_DIGITS
    assert _accepts(FREE, f'{{"x": 0.{frac}e-{exp}}}') and _accepts(FREE, f'{{"x": 1E+{exp}}}')
    assert FREE.feed(FREE.start(), f'{{"x": 0.{frac}1') is None
    assert FREE.feed(FREE.start(), f'{{"x": 1e{exp}9') is None
    assert json.loads(json.dumps({"x": 0.00012345678901234567}))["x"] == 0.00012345678901234567  # the repr fits: 20 digits
    assert _accepts(FREE, json.dumps({"x": 0.00012345678901234567}))


def test_free_form_nesting_stops_at_max_depth():
    assert MAX_DEPTH == 8
    # The root object is level 1: seven more arrays reach level 8; an eighth is refused, a scalar is not.
    assert _accepts(FREE, '{"a": ' + "[" * 7 + "]" * 7 + "}")
    assert FREE.feed(FREE.start(), '{"a": ' + "[" * 8) is None and FREE.feed(FREE.start(), '{"a": ' + "[" * 7 + "{") is None
    assert _accepts(FREE, '{"a": ' + "[" * 7 + "1" + "]" * 7 + "}")
    # A schema's own nesting is its own bound: nine levels it spells out pass.
    deep: dict = {"type": "integer"}
    for _ in range(9):
        deep = {"type": "array", "items": deep}
    assert _accepts(JsonAutomaton(deep), "[" * 9 + "1" + "]" * 9)


def test_undeclared_members_keys_and_free_form_strings_and_arrays_are_bounded():
    assert _accepts(FREE, json.dumps({f"k{i}": i for i in range(MAX_MEMBERS)}))
    assert not _accepts(FREE, json.dumps({f"k{i}": i for i in range(MAX_MEMBERS + 1)}))
    assert _accepts(FREE, json.dumps({"k" * MAX_KEY_CHARS: 1})) and FREE.feed(FREE.start(), '{"' + "k" * (MAX_KEY_CHARS + 1)) is None
    # At the key limit a key must be new (the last character of a repeat is refused, not the quote after
    # it, which would leave nothing to write), and no escape may start (its character would not fit).
    longest = "k" * MAX_KEY_CHARS
    assert FREE.feed(FREE.start(), f'{{"{longest}": 1, "{longest[:-1]}') is not None
    assert FREE.feed(FREE.start(), f'{{"{longest}": 1, "{longest}') is None
    assert FREE.feed(FREE.start(), '{"' + longest[:-1] + "\\") is not None and FREE.feed(FREE.start(), '{"' + longest + "\\") is None
    assert _accepts(FREE, json.dumps({"s": "x" * MAX_STRING_CHARS})) and not _accepts(FREE, json.dumps({"s": "x" * (MAX_STRING_CHARS + 1)}))
    assert _accepts(FREE, json.dumps({"a": list(range(MAX_MEMBERS))})) and not _accepts(FREE, json.dumps({"a": list(range(MAX_MEMBERS + 1))}))
    # Declared properties, schema strings and schema arrays are not capped: the schema bounds them.
    many = {f"p{i}": {"type": "string"} for i in range(MAX_MEMBERS + 4)}
    auto = JsonAutomaton({"type": "object", "properties": {**many, "xs": {"type": "array", "items": {"type": "integer"}}}})
    value = {**{name: "y" * (MAX_STRING_CHARS + 1) for name in many}, "xs": list(range(MAX_MEMBERS + 1))}
    assert _accepts(auto, json.dumps(value))
    # Undeclared members next to declared ones: MAX_MEMBERS of them, and every required property still fits.
    required = {"type": "object", "properties": many, "required": list(many)}
    value = {**{f"x{i}": 1 for i in range(MAX_MEMBERS)}, **{name: "v" for name in many}}
    assert _accepts(JsonAutomaton(required), json.dumps(value))
    assert not _accepts(JsonAutomaton(required), json.dumps({**value, "x_more": 1}))


# Every character the grammar needs (literals, escapes, \u hex digits, exponents) and few letters, so keys repeat.
ALPHABET = list('{}[]",:-+. \neE019abflnrstu\\') + ["é"]


@pytest.mark.parametrize("schema", [{"type": "object"}, PERSON, {"type": "array", "minItems": 3}, TREE])
def test_no_reachable_state_is_a_dead_end_with_tiny_bounds(schema, monkeypatch):
    """Random walks over every accepted character, with bounds small enough to be hit all the time: each
    state reached either accepts a next character or is a complete document (a recursive schema included,
    nesting against MAX_SCHEMA_DEPTH)."""
    for name, value in [("MAX_MEMBERS", 3), ("MAX_KEY_CHARS", 1), ("MAX_STRING_CHARS", 2), ("MAX_DEPTH", 3), ("MAX_WHITESPACE", 2),
                        ("MAX_SCHEMA_DEPTH", 5)]:
        monkeypatch.setattr(steps, name, value)
    for part in ("int", "frac", "exp"):
        monkeypatch.setitem(steps._NUM_DIGITS, part, 2)
    auto, rng = JsonAutomaton(schema), random.Random(5)
    alphabet = sorted(set(ALPHABET) | set(json.dumps(schema)))  # and the letters of its names and enum values
    num_steps = 0
    for _ in range(60):
        state, text = auto.start(), ""
        for _ in range(200):
            options = [c for c in alphabet if auto.feed(state, c) is not None]
            assert options or auto.is_complete(state), f"dead end after {text!r}"
            if not options or (auto.is_complete(state) and rng.random() < 0.3):
                break
            others = [c for c in options if c not in '}]"']  # mostly keep going, so walks reach the bounds
            c = rng.choice(others if others and rng.random() < 0.85 else options)
            state, text, num_steps = auto.feed(state, c), text + c, num_steps + 1
    assert num_steps > 600


# ---------------------------------------------------------------------------------------------
# Tagged blocks (structural tags: forced tool calls)
# ---------------------------------------------------------------------------------------------

CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": False}


def _block(name: str, schema: dict) -> dict:
    return {"begin": f'<tool_call>\n{{"name": "{name}", "arguments": ', "schema": schema, "end": "}\n</tool_call>"}


def test_a_tagged_block_is_begin_then_a_document_then_end():
    auto = JsonAutomaton.tagged([_block("get_weather", CITY)])
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert _accepts(auto, text) and auto.is_closed(auto.feed(auto.start(), text))
    assert not auto.is_complete(auto.feed(auto.start(), text[:-1]))
    assert _reject_index(auto, text.replace("get_weather", "get_time")) == text.index("weather")
    extra = text.replace('"Paris"}', '"Paris", "x": 1}')
    assert _reject_index(auto, extra) == extra.index(', "x"')  # additionalProperties false
    assert _reject_index(auto, '<tool_call>\n{"name": "get_weather", "arguments": {"town": "Paris"}}') is not None
    assert _reject_index(auto, "Sure! <tool_call>") == 0
    # Inside fixed text the next character is known; inside the document it is not.
    state = auto.start()
    assert auto.forced_char(state) == "<" and auto.forced_char(auto.feed(state, "<tool_call>\n")) == "{"
    assert auto.forced_char(auto.feed(state, text[:text.index('{"city"') + 1])) is None


def test_a_choice_of_tags_and_several_blocks():
    auto = JsonAutomaton.tagged([_block("get_weather", CITY), _block("get_time", {"type": "object"})], max_blocks=2, separator="")
    state = auto.start()
    assert auto.forced_char(auto.feed(state, '<tool_call>\n{"name": "get_')) is None  # "w" or "t"
    one = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    two = one + '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
    after_one = auto.feed(state, one)
    assert auto.is_complete(after_one) and not auto.is_closed(after_one)  # may end, or open a second block
    assert _accepts(auto, two) and auto.is_closed(auto.feed(state, two))
    assert auto.feed(state, two + "<") is None and auto.feed(state, one + "\n") is None
    with pytest.raises(UnsupportedSchemaError, match="max_blocks"):
        JsonAutomaton.tagged([{"begin": "", "schema": {}, "end": ""}], max_blocks=2, separator="")
    with pytest.raises(UnsupportedSchemaError, match="structures"):
        automaton_for(None, json.dumps({"structures": []}))
    with pytest.raises(UnsupportedSchemaError, match="'pattern'"):
        automaton_for(None, json.dumps({"structures": [_block("f", {"type": "string", "pattern": "x"})]}))
