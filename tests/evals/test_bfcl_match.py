"""evals.bfcl_match: every BFCL ground truth rendered as calls is accepted; mutated calls are rejected."""

from __future__ import annotations

import copy
import json
from collections import Counter

import pytest

from evals.bfcl_match import check_call, match_calls, normalize_string, type_ok, value_matches
from evals.bfcl_schema import Call

CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple")
OMIT = object()
# Upstream quirks: the only valid rendering omits these arguments (their accepted values include "").
# parallel_multiple_12 and _26 list arguments that the function does not have; simple_python_307
# accepts True for a string parameter.
OMITTED = {("parallel_multiple_12", "permeability"), ("parallel_multiple_26", "type"), ("simple_python_307", "venue")}


def first_value(options):
    """The first accepted value that is not "" (BFCL's "may be omitted"), rendered; OMIT if only ""."""
    for option in options:
        if not (isinstance(option, str) and option == ""):
            return render(option)
    return OMIT


def render(value):
    if isinstance(value, dict):  # key -> accepted values
        return {k: v for k, v in ((k, first_value(opts)) for k, opts in value.items()) if v is not OMIT}
    if isinstance(value, list):
        return [render(v) for v in value]
    return value


def render_calls(item_id, ground_truth):
    calls = []
    for expected in ground_truth:
        (name, args), = expected.items()
        arguments = {k: first_value(v) for k, v in args.items() if (item_id, k) not in OMITTED}
        calls.append(Call(name, {k: v for k, v in arguments.items() if v is not OMIT}))
    return calls


def load_category(data_dir, category):
    root = data_dir / "bfcl"
    questions = {}
    for line in (root / f"BFCL_v4_{category}.json").read_text().splitlines():
        row = json.loads(line)
        questions[row["id"]] = row["function"]
    return [(a["id"], a["ground_truth"], questions[a["id"]]) for a in
            map(json.loads, (root / "possible_answer" / f"BFCL_v4_{category}.json").read_text().splitlines())]


@pytest.fixture(scope="module")
def all_items(data_dir):
    return {c: load_category(data_dir, c) for c in CATEGORIES}


def test_every_ground_truth_is_accepted(all_items):
    counts = {c: len(items) for c, items in all_items.items()}
    assert counts == {"simple_python": 400, "multiple": 200, "parallel": 200, "parallel_multiple": 200}
    rejected = []
    for items in all_items.values():
        for item_id, truth, functions in items:
            calls = render_calls(item_id, truth)
            for order in (calls, calls[::-1]):  # parallel calls in any order
                result = match_calls(order, truth, functions)
                if not result.ok:
                    rejected.append((item_id, result.reason))
    assert rejected == []


def test_the_quirks_rendered_naively_are_rejected(all_items):
    items = {item_id: (truth, functions) for cat in all_items.values() for item_id, truth, functions in cat}
    reasons = {}
    for item_id, arg in OMITTED:
        truth, functions = items[item_id]
        calls = [Call(n, {k: first_value(v) for k, v in args.items() if first_value(v) is not OMIT})
                 for (n, args), in (e.items() for e in truth)]
        reasons[item_id] = match_calls(calls, truth, functions).reason
    assert "unknown argument 'permeability'" in reasons["parallel_multiple_12"]
    assert "unknown argument 'type'" in reasons["parallel_multiple_26"]
    assert "'venue' = True is not of type 'string'" in reasons["simple_python_307"]


# mutants per kind over the 1,000 items (parallel categories: 400 items with more than one call)
MUTANTS_TRIED = {"name": 1000, "extra arg": 1000, "extra call": 1000, "value": 998, "missing required": 1000,
                 "missing call": 400}


def mutate_value(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 12345
    if isinstance(value, str):
        return value + "zzz"
    if isinstance(value, list):
        return [*value, value[0]] if value else ["zzz"]
    if isinstance(value, dict):
        return {**value, "zzz": 1}
    return None


def test_mutations_are_rejected(all_items):
    missed, tried = [], Counter()
    for items in all_items.values():
        for item_id, truth, functions in items:
            calls = render_calls(item_id, truth)
            schema = {f["name"]: f["parameters"] for f in functions}
            first = calls[0]
            mutants = {
                "name": [Call(first.name + "_x", first.arguments), *calls[1:]],
                "extra arg": [Call(first.name, {**first.arguments, "zzz_unknown": 1}), *calls[1:]],
                "extra call": [*calls, copy.deepcopy(calls[0])],
            }
            # not a boolean where both values are accepted (simple_python_240: full_term_only = ["", true, false])
            changeable = [k for k in sorted(first.arguments) if first.arguments[k] is not None
                          and not isinstance(first.arguments[k], bool)]
            if changeable:
                arg = changeable[0]
                mutants["value"] = [Call(first.name, {**first.arguments, arg: mutate_value(first.arguments[arg])}),
                                    *calls[1:]]
            required = schema[first.name].get("required", [])
            if required:
                mutants["missing required"] = [Call(first.name, {k: v for k, v in first.arguments.items()
                                                                 if k != required[0]}), *calls[1:]]
            if len(calls) > 1:
                mutants["missing call"] = calls[:-1]
            for kind, mutant in mutants.items():
                tried[kind] += 1
                if match_calls(mutant, truth, functions).ok:
                    missed.append((item_id, kind))
    assert missed == []
    assert tried == MUTANTS_TRIED


def test_irrelevance(data_dir):
    rows = [json.loads(line) for line in (data_dir / "bfcl/BFCL_v4_irrelevance.json").read_text().splitlines()]
    assert len(rows) == 240
    for row in rows:
        assert match_calls([], [], row["function"]).ok
        fn = row["function"][0]
        assert not match_calls([Call(fn["name"], {})], [], row["function"]).ok


def test_value_rules():
    assert normalize_string("New York, NY") == normalize_string("new-york ny") == "newyorkny"
    assert normalize_string("it's") == 'it"s'
    assert value_matches(5, 5.0) and value_matches(5.0, 5)
    assert not value_matches(True, 1) and not value_matches(1, True)
    assert not value_matches("5", 5) and not value_matches(5, "5")
    assert value_matches(None, None) and not value_matches(0, None)
    assert value_matches(["A", "b"], ["a", "B"]) and not value_matches(["b", "a"], ["a", "b"])
    assert not value_matches([1, 2], [1, 2, 3])
    pattern = {"name": ["John Doe"], "email": ["j@x.com", ""]}
    assert value_matches({"name": "john doe"}, pattern)
    assert value_matches({"name": "John Doe", "email": "j@x.com"}, pattern)
    assert not value_matches({"email": "j@x.com"}, pattern)  # "name" may not be omitted
    assert not value_matches({"name": "John Doe", "age": 3}, pattern)
    assert value_matches([{"f": "age"}, {"f": "Job"}], [{"f": ["age"]}, {"f": ["job", "work"]}])


def test_types():
    assert type_ok(3, {"type": "integer"}) and not type_ok(3.0, {"type": "integer"})
    assert type_ok(3, {"type": "float"}) and type_ok(3.5, {"type": "number"})
    assert not type_ok(True, {"type": "integer"}) and not type_ok(1, {"type": "boolean"})
    assert type_ok([1, 2], {"type": "tuple"}) and not type_ok((1, 2), {"type": "array"})
    assert type_ok({"a": 1}, {"type": "dict"}) and type_ok("anything", {"type": "any"})
    assert type_ok(None, {"type": "string"})


FUNCS = [{"name": "f", "parameters": {"type": "dict", "properties": {
    "x": {"type": "integer"}, "unit": {"type": "string"}, "data": {"type": "array", "items": {"type": "float"}}},
    "required": ["x"]}}]


def test_check_call_rules():
    expected = {"f": {"x": [1, 2], "unit": ["m", ""]}}
    by_name = {"f": FUNCS[0]}
    assert check_call(Call("f", {"x": 2}), expected, by_name) is None
    assert check_call(Call("f", {"x": 1, "unit": "M"}), expected, by_name) is None
    assert "not of type 'integer'" in check_call(Call("f", {"x": 1.0}), expected, by_name)
    assert "not among" in check_call(Call("f", {"x": 3}), expected, by_name)
    assert "missing required argument 'x'" in check_call(Call("f", {"unit": "m"}), expected, by_name)
    assert "unexpected argument 'data'" in check_call(Call("f", {"x": 1, "data": [1.0]}), expected, by_name)
    assert "missing argument 'unit'" in check_call(Call("f", {"x": 1}), {"f": {"x": [1], "unit": ["m"]}}, by_name)
    # a variable name where the schema wants an array (BFCL's Python answers, e.g. parallel_multiple_21)
    assert check_call(Call("f", {"x": 1, "data": "df['a']"}), {"f": {"x": [1], "data": ["df['a']"]}}, by_name) is None


def test_one_to_one_assignment_beats_greedy():
    truth = [{"f": {"x": [1, 2]}}, {"f": {"x": [1]}}]
    assert match_calls([Call("f", {"x": 1}), Call("f", {"x": 2})], truth, FUNCS).ok
    assert not match_calls([Call("f", {"x": 1}), Call("f", {"x": 1})], [{"f": {"x": [2]}}, {"f": {"x": [1]}}], FUNCS).ok
    assert match_calls([Call("f", {"x": 1})], truth, FUNCS).reason == "expected 2 call(s), got 1"
