"""`protocol.json_depth.json_depth` against a recursive reference over the parsed value: random JSON whose
strings hold brackets, quotes, backslashes and non-ASCII text, in UTF-8 and UTF-16, pretty-printed or not;
the early stop past the limit; and texts a parser refuses, never measured shallower than it would go."""

from __future__ import annotations

import json
import random

import pytest

from protocol.json_depth import json_depth

# characters that could fool a scan that ignores strings or escapes
TRICKY = ['[', ']', '{', '}', '"', '\\', '\\"', '\\\\', '[[{', '"]', 'é', '路由', '😀', '\n', 'a']


def ref_depth(value) -> int:
    """The nesting depth of a parsed JSON value: 0 for a scalar, 1 + the deepest child for an array or object."""
    if isinstance(value, dict):
        return 1 + max(map(ref_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(ref_depth, value), default=0)
    return 0


def random_value(rng: random.Random, depth: int):
    kind = rng.choice(["list", "dict", "str", "num", "lit"] if depth < 12 else ["str", "num", "lit"])
    if kind == "list":
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    if kind == "dict":
        return {"".join(rng.choices(TRICKY, k=rng.randint(0, 3))): random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))}
    if kind == "str":
        return "".join(rng.choices(TRICKY, k=rng.randint(0, 6)))
    return rng.random() * 1e6 if kind == "num" else rng.choice([True, False, None])


@pytest.mark.parametrize("seed", range(40))
def test_depth_matches_the_parsed_value(seed):
    rng = random.Random(seed)
    value = random_value(rng, 0)
    expected = ref_depth(value)
    for text in (json.dumps(value), json.dumps(value, ensure_ascii=False, indent=2)):
        assert json.loads(text) == value
        assert json_depth(text.encode("utf-8"), 100) == expected
        assert json_depth(text.encode("utf-16"), 100) == expected  # json.loads reads UTF-16 bytes too


def test_brackets_in_strings_and_escapes_do_not_count():
    assert json_depth(b'{"a": "[[[[{{{{", "b\\"[": ["\\\\", "]]]"]}', 8) == 2
    assert json_depth(b'"[[[[[[[["', 3) == 0
    assert json_depth(b'[["\\\\"], [[["\\""]]]]', 8) == 4


def test_stops_one_past_the_limit():
    deep = b"[" * 100_000 + b"]" * 100_000
    assert json_depth(deep, 64) == 65
    assert json_depth(b"[" * 64 + b"]" * 64, 64) == 64
    assert json_depth(b'{"a":' * 65 + b"1" + b"}" * 65, 64) == 65


@pytest.mark.parametrize("text,reached", [
    (b'[[[["unterminated [[[[[', 4),      # the parser stops in the string, at depth 4
    (b'[[[1, 2 [[[', 6),                   # a syntax error after which nothing parses: counted anyway, an upper bound
    (b']]]][[[', 3),                       # stray closers do not lower the count below zero
])
def test_texts_a_parser_refuses_are_never_measured_shallower(text, reached):
    assert json_depth(text, 64) >= reached
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)
