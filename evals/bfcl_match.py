"""AST-style matching of produced function calls against BFCL's `possible_answer`.

After the Berkeley Function-Calling Leaderboard's AST checker (gorilla.cs.berkeley.edu, "BFCL: From
Tool Use to Agentic Evaluation"): a produced call matches an expected one when

1. the function name is the expected one (after mapping OpenAI names back, see `bfcl_schema`);
2. every argument is in the function's schema and in the expected call (no unknown or extra argument);
3. every argument in the schema's "required" list is present;
4. every expected argument is present unless its accepted values include "" (BFCL's "may be omitted");
5. each present argument has the schema's type and equals one of the accepted values:
   - types (of the argument itself; list elements and dict values are checked by value only): integer =
     int; float/number = int or float (an int is accepted for a float); string = str; boolean = bool
     (never 1/0); array/tuple = list; dict = object; "any" or no type = anything; null passes the type
     check and equals only an accepted null. As in BFCL's Python checker, a string is accepted for a
     parameter of another type when the accepted values hold strings: the expected answer then names a
     variable (`x=data['sales']` in parallel_multiple_21);
   - numbers compare by value (5 == 5.0), booleans by value, null only to null;
   - strings compare after BFCL-like normalization (`normalize_string`): lower case, with spaces and
     the characters , . / - _ * ^ removed, and ' read as ";
   - lists compare element by element (same length, same order), recursively;
   - an accepted dict is itself a map key -> accepted values: the produced dict may hold only its keys,
     each equal to one of that key's accepted values, and may omit a key whose values include "".

A whole answer matches when produced and expected calls pair up one-to-one (a bipartite matching, so
parallel calls may come in any order; simple and multiple expect exactly one call). An expected list
that is empty (the irrelevance category) matches only when no call was made.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from evals.bfcl_schema import Call

_STRIP = re.compile(r"[\s,./\-_*^]")


def normalize_string(text: str) -> str:
    """BFCL-like string normalization: lower case, drop whitespace and , . / - _ * ^, ' -> "."""
    return _STRIP.sub("", text).lower().replace("'", '"')


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def type_ok(value: Any, schema: dict[str, Any]) -> bool:
    """Whether `value` (JSON-decoded) has the BFCL schema's type (see the module docstring)."""
    if value is None:
        return True
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    for k in kinds:
        if k in (None, "any"):
            return True
        if k == "integer" and isinstance(value, int) and not isinstance(value, bool):
            return True
        if k in ("float", "number") and _is_number(value):
            return True
        if k == "string" and isinstance(value, str):
            return True
        if k == "boolean" and isinstance(value, bool):
            return True
        if k in ("dict", "object") and isinstance(value, dict):
            return True
        if k in ("array", "tuple") and isinstance(value, list):
            return True
    return False


def value_matches(value: Any, accepted: Any) -> bool:
    """Whether a produced value equals one accepted value (the comparison rules of the module docstring)."""
    if isinstance(accepted, dict):
        if not isinstance(value, dict):
            return False
        if all(isinstance(v, list) for v in accepted.values()):  # key -> accepted values
            if any(k not in accepted for k in value):
                return False
            return all(any(value_matches(value[k], a) for a in options) if k in value else "" in options
                       for k, options in accepted.items())
        return value.keys() == accepted.keys() and all(value_matches(value[k], accepted[k]) for k in accepted)
    if isinstance(accepted, list):
        return isinstance(value, list) and len(value) == len(accepted) and all(
            value_matches(v, a) for v, a in zip(value, accepted))
    if isinstance(accepted, str):
        return isinstance(value, str) and normalize_string(value) == normalize_string(accepted)
    if isinstance(accepted, bool):
        return isinstance(value, bool) and value == accepted
    if _is_number(accepted):
        return _is_number(value) and value == accepted
    if accepted is None:
        return value is None
    return value == accepted


def check_call(call: Call, expected: dict[str, dict[str, list]], functions: dict[str, dict]) -> str | None:
    """None when `call` matches the expected call {name: {arg: [accepted values]}}, else the reason.

    `functions` maps BFCL names to their documents ({"name", "parameters": {"properties", "required"}}).
    """
    (name, accepted_args), = expected.items()
    if call.name != name:
        return f"called {call.name!r}, expected {name!r}"
    parameters = functions.get(name, {}).get("parameters", {})
    properties = parameters.get("properties", {})
    for arg in call.arguments:
        if arg not in properties:
            return f"{name}: unknown argument {arg!r}"
        if arg not in accepted_args:
            return f"{name}: unexpected argument {arg!r}"
    for arg in parameters.get("required", []):
        if arg not in call.arguments:
            return f"{name}: missing required argument {arg!r}"
    for arg, options in accepted_args.items():
        if arg not in call.arguments:
            if "" not in options:
                return f"{name}: missing argument {arg!r}"
            continue
        value = call.arguments[arg]
        is_variable = isinstance(value, str) and any(isinstance(o, str) and o != "" for o in options)
        if not type_ok(value, properties.get(arg, {})) and not is_variable:
            return f"{name}: argument {arg!r} = {value!r} is not of type {properties[arg].get('type')!r}"
        if not any(value_matches(value, option) for option in options):
            return f"{name}: argument {arg!r} = {value!r} is not among {options!r}"
    return None


@dataclass(frozen=True)
class MatchResult:
    """Whether the produced calls match the expected ones; `reason` says why not ("" when they do)."""

    ok: bool
    reason: str = ""


def _perfect_matching(compatible: list[list[bool]]) -> bool:
    """Whether every row (expected call) can be paired with a distinct column (produced call); Kuhn's algorithm."""
    owner: dict[int, int] = {}

    def augment(row: int, seen: set[int]) -> bool:
        for col, ok in enumerate(compatible[row]):
            if ok and col not in seen:
                seen.add(col)
                if col not in owner or augment(owner[col], seen):
                    owner[col] = row
                    return True
        return False

    return all(augment(row, set()) for row in range(len(compatible)))


def match_calls(calls: list[Call], ground_truth: list[dict[str, dict[str, list]]],
                functions: list[dict[str, Any]]) -> MatchResult:
    """Match produced calls against BFCL's ground truth (a list of {name: {arg: [accepted]}}), order-free.

    Args:
        calls: the produced calls, names already mapped back to BFCL names.
        ground_truth: the expected calls; [] means no call should be made (irrelevance).
        functions: the item's BFCL function documents.
    """
    if not ground_truth:
        return MatchResult(not calls, "" if not calls else f"expected no call, got {len(calls)}")
    if len(calls) != len(ground_truth):
        return MatchResult(False, f"expected {len(ground_truth)} call(s), got {len(calls)}")
    by_name = {fn["name"]: fn for fn in functions}
    reasons = [[check_call(call, expected, by_name) for call in calls] for expected in ground_truth]
    compatible = [[r is None for r in row] for row in reasons]
    if _perfect_matching(compatible):
        return MatchResult(True)
    for expected, row in zip(ground_truth, reasons):
        if all(r is not None for r in row):
            name = next(iter(expected))
            same_name = [r for r in row if not r.startswith("called ")]
            return MatchResult(False, same_name[0] if same_name else f"no call to {name!r}")
    return MatchResult(False, "the calls cannot be paired one-to-one with the expected calls")
