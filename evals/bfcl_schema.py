"""BFCL function documents as OpenAI tools, and the produced calls back in BFCL's terms.

The Berkeley Function-Calling Leaderboard (Patil et al., "Gorilla"/BFCL, gorilla.cs.berkeley.edu) writes
function parameters in a JSON-Schema dialect with Python type names. OpenAI's `tools` need JSON Schema
and function names matching ^[A-Za-z0-9_-]{1,64}$, so:

- types: "dict" -> "object", "float" -> "number", "tuple" -> "array", "any" -> no "type" at all;
  the non-standard "optional" flag is dropped (optionality is "required"'s job);
- names: every character outside [A-Za-z0-9_-] becomes "_" ("math.factorial" -> "math_factorial").
  `to_openai_tools` returns the map back (OpenAI name -> BFCL name) and refuses a document where two
  functions would get the same OpenAI name; grading maps produced names back with it.

    tools, names = to_openai_tools(item_functions)
    calls = decode_tool_calls(completion.tool_calls, names)       # [Call("math.factorial", {"number": 5})]

For base models (completion style) we use BFCL's prompting mode instead of `tools`: the functions are
listed in the prompt and the model writes the calls as a Python list, `[math.factorial(number=5)]`,
which `parse_python_calls` reads with `ast` (literal arguments only).
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from typing import Any

_TYPES = {"dict": "object", "float": "number", "tuple": "array"}
_BAD_NAME_CHARS = re.compile(r"[^A-Za-z0-9_-]")


@dataclass(frozen=True)
class Call:
    """One function call: the BFCL function name and its decoded arguments."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


def openai_name(name: str) -> str:
    """A BFCL function name as an OpenAI tool name ("a.b" -> "a_b"), cut to 64 characters."""
    return _BAD_NAME_CHARS.sub("_", name)[:64]


def convert_schema(schema: Any) -> Any:
    """A BFCL parameter schema as JSON Schema (see the module docstring); other keys kept as they are."""
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "type":
            if value != "any":
                out[key] = _TYPES.get(value, value)
        elif key == "optional":
            continue
        elif key == "properties" and isinstance(value, dict):
            out[key] = {name: convert_schema(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties"):
            out[key] = convert_schema(value)
        else:
            out[key] = value
    return out


def to_openai_tools(functions: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """OpenAI `tools` for BFCL function documents, and the map OpenAI name -> BFCL name.

    Raises:
        ValueError: two functions whose OpenAI names collide.
    """
    tools, names = [], {}
    for fn in functions:
        name = openai_name(fn["name"])
        if name in names:
            raise ValueError(f"BFCL functions {names[name]!r} and {fn['name']!r} both become the tool name {name!r}")
        names[name] = fn["name"]
        parameters = convert_schema(fn.get("parameters") or {"type": "dict", "properties": {}})
        tools.append({"type": "function", "function": {"name": name, "description": fn.get("description", ""),
                                                       "parameters": parameters}})
    return tools, names


def decode_tool_calls(tool_calls: list[dict[str, Any]] | None, names: dict[str, str]) -> list[Call]:
    """OpenAI `tool_calls` as `Call`s with BFCL names (unknown names are kept as produced).

    Arguments may be a JSON string (OpenAI's wire form) or an already decoded object.
    Raises:
        ValueError: a call without a function name, or arguments that are not a JSON object.
    """
    calls = []
    for i, tool_call in enumerate(tool_calls or []):
        fn = tool_call.get("function") or {}
        name, raw = fn.get("name"), fn.get("arguments")
        if not isinstance(name, str) or not name:
            raise ValueError(f"tool_calls[{i}] has no function name")
        try:
            arguments = json.loads(raw) if isinstance(raw, str) else ({} if raw is None else raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"tool_calls[{i}] ({name}): arguments are not JSON: {exc}") from None
        if not isinstance(arguments, dict):
            raise ValueError(f"tool_calls[{i}] ({name}): arguments must be a JSON object, got {raw!r}")
        calls.append(Call(names.get(name, name), arguments))
    return calls


# --- BFCL's prompting mode (models without native tool calling) ---------------------------------------

PROMPT_INSTRUCTION = (
    "You are given a question and a set of functions. If the question can be answered by calling one or more "
    "of the functions, reply with the calls only, as a Python list: [func_name1(param1=value1, param2=value2), "
    "func_name2(param=value)]. If none of the functions fits, reply with [].")


def render_prompt(question: str, functions: list[dict[str, Any]]) -> str:
    """A completion-style prompt: the instruction, one JSON function document per line, the question, "Calls:"."""
    docs = "\n".join(json.dumps(fn, ensure_ascii=False) for fn in functions)
    return f"{PROMPT_INSTRUCTION}\n\nFunctions:\n{docs}\n\nQuestion: {question}\nCalls:"


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    raise ValueError(f"not a function name: {ast.unparse(node)}")


def _lists(value: Any) -> Any:
    """Tuples (and sets) as lists, recursively, as they would arrive in JSON."""
    if isinstance(value, (tuple, list, set)):
        return [_lists(v) for v in value]
    if isinstance(value, dict):
        return {k: _lists(v) for k, v in value.items()}
    return value


def parse_python_calls(text: str) -> list[Call]:
    """Calls written as a Python list (or a single call): "[f(a=1), m.g(b='x')]" -> two `Call`s.

    Markdown fences and a trailing remark after the closing bracket are ignored; "[]" or empty text means
    no call. Raises:
        ValueError: text that is not such a list, positional arguments, or non-literal argument values.
    """
    body = re.sub(r"```(?:python)?", "", text).strip()
    if not body:
        return []
    if body.startswith("["):
        depth, end = 0, len(body)
        for i, ch in enumerate(body):  # cut at the bracket that closes the list (strings rarely hold brackets)
            depth += (ch == "[") - (ch == "]")
            if depth == 0:
                end = i + 1
                break
        body = body[:end]
    try:
        tree = ast.parse(body, mode="eval").body
    except SyntaxError as exc:
        raise ValueError(f"not a Python list of calls: {exc.msg}") from None
    nodes = tree.elts if isinstance(tree, (ast.List, ast.Tuple)) else [tree]
    calls = []
    for node in nodes:
        if not isinstance(node, ast.Call):
            raise ValueError(f"not a function call: {ast.unparse(node)}")
        if node.args:
            raise ValueError(f"positional arguments in {ast.unparse(node)}; use name=value")
        try:
            arguments = {kw.arg: _lists(ast.literal_eval(kw.value)) for kw in node.keywords if kw.arg}
        except (ValueError, TypeError, SyntaxError):
            raise ValueError(f"non-literal argument in {ast.unparse(node)}") from None
        calls.append(Call(_dotted(node.func), arguments))
    return calls
