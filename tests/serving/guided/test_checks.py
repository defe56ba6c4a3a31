"""Schemas the JSON automaton must refuse before any engine work (`serving.guided.checks`): `$ref` cycles that
write nothing, schemas nested past MAX_SCHEMA_DEPTH, recursion with no finite document; the recursion it
decodes within the bound; and the deadline that stops a schema whose parses multiply. The same refusals over
HTTP, and the engine answering afterwards, are in test_engine_watchdog.py and tests/link/test_gateway_local_guards.py.

    LINK_HOME=.link LINK_DATASETS_DIR=../shared/data .venv/bin/python -m pytest -q tests/serving/guided/test_checks.py
"""

from __future__ import annotations

import json
import time

import pytest

from protocol.errors import ValidationProblem
from protocol.openai import ChatCompletionRequest
from serving.errors import SamplingTimeoutError
from serving.frontend.chat_tools import prepare_chat
from serving.guided.automaton import JsonAutomaton, response_format_schema
from serving.guided.schema import MAX_SCHEMA_DEPTH, InvalidSchemaError
from tests.serving.guided_cases import INDIRECT, SELF, TREE, nested, valid

THROUGH_ANYOF = {"$defs": {"a": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/b"}]}, "b": {"$ref": "#/$defs/a"}},
                 "type": "object", "properties": {"x": {"$ref": "#/$defs/a"}}}


def _chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], **fields)


def _json_schema(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


@pytest.mark.parametrize("schema, chain, path", [
    (SELF, "#/$defs/a -> #/$defs/a", "#/$defs/a"),
    (INDIRECT, "#/$defs/a -> #/$defs/b -> #/$defs/a", "#/$defs/a"),
    (THROUGH_ANYOF, "#/$defs/a -> #/$defs/b -> #/$defs/a", "#/$defs/a"),
])
def test_ref_cycles_that_write_nothing_are_refused_naming_the_chain(schema, chain, path):
    start = time.perf_counter()
    with pytest.raises(InvalidSchemaError) as info:
        response_format_schema(_json_schema(schema))
    assert time.perf_counter() - start < 0.1
    assert info.value.path == path and chain in str(info.value)


def test_cycles_are_400s_naming_the_schema_and_the_forced_tool():
    with pytest.raises(ValidationProblem) as info:
        prepare_chat(_chat(response_format=_json_schema(INDIRECT)))
    assert info.value.param == "response_format.json_schema.schema" and "#/$defs/b" in info.value.message
    tools = [{"type": "function", "function": {"name": "ok", "parameters": {"type": "object"}}},
             {"type": "function", "function": {"name": "loop", "parameters": SELF}}]  # not strict: still refused
    for choice in ("required", {"type": "function", "function": {"name": "loop"}}):
        with pytest.raises(ValidationProblem) as info:
            prepare_chat(_chat(tools=tools, tool_choice=choice))
        assert info.value.param == "tools[1].function.parameters" and "#/$defs/a" in info.value.message
    prepare_chat(_chat(tools=tools, tool_choice="auto"))  # not forced: the schema is only shown to the model


@pytest.mark.parametrize("key", ["properties", "items", "anyOf"])
def test_a_schema_300_levels_deep_is_refused_in_well_under_a_second(key):
    schema = nested(300, key)
    parameters = {"type": "object", "properties": {"a": schema}}  # a function's arguments are an object
    for call in (lambda: prepare_chat(_chat(response_format=_json_schema(schema))),
                 lambda: prepare_chat(_chat(tools=[{"type": "function", "function": {"name": "f", "parameters": parameters}}],
                                            tool_choice="required"))):
        start = time.perf_counter()
        with pytest.raises(ValidationProblem) as info:
            call()
        assert time.perf_counter() - start < 0.2
        assert info.value.param in ("response_format.json_schema.schema", "tools[0].function.parameters")
        assert "levels" in info.value.message and "flatten it" in info.value.message


def test_the_depth_bound_is_max_schema_depth_levels_of_subschemas():
    deepest = nested(MAX_SCHEMA_DEPTH)  # 31 objects around a string
    document: object = "x"
    for _ in range(MAX_SCHEMA_DEPTH - 1):
        document = {"a": document}
    assert valid(deepest, json.dumps(document))
    with pytest.raises(InvalidSchemaError, match=f"more than {MAX_SCHEMA_DEPTH} levels of subschemas"):
        JsonAutomaton(nested(MAX_SCHEMA_DEPTH + 1))


def _tree(levels: int) -> dict:
    node = {"v": 0, "children": []}
    for _ in range(levels - 1):
        node = {"v": 0, "children": [node, {"v": 1, "children": []}]}
    return node


def test_recursion_through_items_is_decoded_within_the_depth_bound():
    """A node is an object and its children an array: 16 nodes deep is MAX_SCHEMA_DEPTH (32) containers. Past
    that no node may open, but the children array can still close: never a dead end."""
    auto = JsonAutomaton(TREE)
    assert valid(TREE, json.dumps(_tree(1))) and valid(TREE, json.dumps(_tree(MAX_SCHEMA_DEPTH // 2)))
    assert not valid(TREE, json.dumps(_tree(MAX_SCHEMA_DEPTH // 2 + 1)))
    text = json.dumps(_tree(MAX_SCHEMA_DEPTH // 2))
    deepest = text.index("[]")  # the innermost children array, 32 containers deep
    state = auto.feed(auto.start(), text[:deepest + 1])
    assert auto.feed(state, "{") is None and auto.feed(state, "]") is not None


@pytest.mark.parametrize("schema, path", [
    ({"$defs": {"n": {"type": "object", "properties": {"c": {"$ref": "#/$defs/n"}}, "required": ["c"]}}, "$ref": "#/$defs/n"},
     "#/$defs/n"),
    ({"$defs": {"n": {"type": "array", "items": {"$ref": "#/$defs/n"}, "minItems": 1}}, "$ref": "#/$defs/n"}, "#/$defs/n"),
])
def test_recursion_that_never_ends_has_no_document_and_is_refused(schema, path):
    with pytest.raises(InvalidSchemaError, match="no document of the schema") as info:
        JsonAutomaton(schema)
    assert info.value.path == path


def test_an_optional_branch_that_never_ends_is_never_entered():
    endless = {"$defs": {"n": {"type": "object", "properties": {"c": {"$ref": "#/$defs/n"}}, "required": ["c"],
                               "additionalProperties": False}},
               "type": "object", "properties": {"ok": {"type": "integer"}, "bad": {"$ref": "#/$defs/n"}},
               "additionalProperties": False}
    auto = JsonAutomaton(endless)
    assert valid(endless, '{"ok": 1}') and auto.feed(auto.start(), '{"bad": ') is not None
    assert auto.feed(auto.start(), '{"bad": {') is None


def test_a_deadline_stops_a_schema_whose_parses_multiply():
    """Two array options that both recurse: every `[` doubles the parses, 2^k after k of them. Without a
    deadline 30 of them would take hours; with one, feeding stops within it."""
    doubling = {"$defs": {"a": {"anyOf": [{"type": "array", "items": {"$ref": "#/$defs/a"}},
                                          {"type": "array", "items": {"$ref": "#/$defs/a"}, "maxItems": 9}]}},
                "$ref": "#/$defs/a"}
    auto = JsonAutomaton(doubling)
    assert len(auto.feed(auto.start(), "[" * 8)) == 2 ** 8
    start = time.monotonic()
    with pytest.raises(SamplingTimeoutError):
        auto.feed(auto.start(), "[" * 30, deadline=start + 0.2)
    assert time.monotonic() - start < 5.0   # room for a loaded 2-core machine (3.8 s seen there); without: hours
