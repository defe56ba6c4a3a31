"""`protocol.strict_json.parse_json_object`, the body reader of the engine server and the gateway: a NUL or a
lone surrogate anywhere (values, keys, escaped or as raw bytes) and non-finite numbers are 400s naming the
field; bytes that are not UTF-8 name their position; the message never echoes the bad text."""

from __future__ import annotations

import json

import pytest

from protocol.errors import ValidationProblem
from protocol.strict_json import parse_json_object

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def refused(raw: bytes) -> ValidationProblem:
    with pytest.raises(ValidationProblem) as info:
        parse_json_object(raw)
    assert info.value.status_code == 400
    return info.value


@pytest.mark.parametrize("patch,param", [
    ({"messages": [{"role": "user", "content": "a\udfffb"}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "\ud800"}]}]}, "messages[0].content[0].text"),
    ({"user": "\udc00"}, "user"),
    ({"model": "m\x00"}, "model"),
    ({"user": "u\x00"}, "user"),
    ({"messages": [{"role": "user", "content": "a\x00b"}]}, "messages[0].content"),  # free text too, by design
    ({"metadata": {"team": "a\x00"}}, "metadata.team"),
    ({"metadata": {"te\x00am": "a"}}, "metadata"),                                  # a key: its object is named
    ({"stop": ["ok", "\udfff"]}, "stop[1]"),
])
def test_nul_and_lone_surrogates_name_their_field(patch, param):
    raw = json.dumps({**CHAT, **patch}).encode()  # ensure_ascii: the characters arrive as \u escapes
    problem = refused(raw)
    assert problem.param == param
    assert "\x00" not in problem.message and all(not 0xD800 <= ord(c) <= 0xDFFF for c in problem.message)
    assert ("NUL" in problem.message) != ("surrogate" in problem.message)


def test_a_key_of_the_body_itself_has_no_param():
    problem = refused(b'{"model": "m", "\\u0000": 1}')
    assert problem.param is None and "request body" in problem.message


def test_a_surrogate_sent_as_raw_bytes_is_named_like_an_escaped_one():
    raw = b'{"model": "m", "user": "x' + "\udfff".encode("utf-8", "surrogatepass") + b'"}'
    assert refused(raw).param == "user"


def test_bytes_that_are_not_utf8_name_their_position():
    problem = refused(b'{"model": "\xff\xfe"}')
    assert "byte 11 is not UTF-8" in problem.message and problem.param is None


def test_valid_text_passes_untouched():
    body = {**CHAT, "user": "路由 😀 \\u0000 as text", "metadata": {"k": "\ufffd"}}
    assert parse_json_object(json.dumps(body).encode()) == body
    assert parse_json_object(b"\xef\xbb\xbf" + json.dumps(body).encode()) == body  # a UTF-8 BOM, as json.loads allows


@pytest.mark.parametrize("raw,param", [(b'{"a": {"b": [1, NaN]}}', "a.b[1]"), (b'{"x": 1e309}', "x"), (b'{"y": -Infinity}', "y")])
def test_non_finite_numbers_name_their_field(raw, param):
    assert refused(raw).param == param


def test_an_integer_beyond_pythons_digit_limit_is_a_parse_error():
    problem = refused(b'{"seed": ' + b"9" * 5000 + b"}")
    assert problem.message.startswith("We could not parse the JSON body") and "4300 digits" in problem.message
