"""BFCL items as traces: the question, then an assistant turn making the target calls BFCL's grader accepts.

Source: the Berkeley Function-Calling Leaderboard v4 (gorilla.cs.berkeley.edu), read with the evals loader
(`evals.suites.bfcl.BFCL`), tools converted by `evals.bfcl_schema.to_openai_tools` ("a.b" -> "a_b").
`possible_answer` lists accepted values per argument ({name: {arg: [accepted values]}}, "" = may be
omitted); `bfcl_target_calls` picks one concrete call from them such that `evals.bfcl_match.match_calls`
grades it 1.0 (tested on every item of the five categories). Irrelevance items (no function fits) end in
the plain-text answer `BFCL_NO_CALL_ANSWER`.

    traces = read_bfcl("../shared/data")     # -> [Trace(id="bfcl/test/simple_python_0", ...), ...] (1240)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

from posttrain.errors import PosttrainDataError
from posttrain.traces import Trace, check_trace, check_traces

BFCL_CATEGORIES = ("simple", "multiple", "parallel", "parallel_multiple", "irrelevance")
# The assistant's answer on BFCL irrelevance items (no offered function fits): plain text, no call.
BFCL_NO_CALL_ANSWER = "None of the offered functions fits this request."

def _first_given(options: list) -> Any:
    """The first accepted value that is not BFCL's "" (= may be omitted); "" when there is no other."""
    return next((o for o in options if o != ""), "")


def _concrete(accepted: Any) -> Any:
    """A concrete value equal to an accepted one under `evals.bfcl_match.value_matches`: an accepted dict whose
    values are all lists maps keys to accepted values (keys that may be omitted are left out)."""
    if isinstance(accepted, dict) and all(isinstance(v, list) for v in accepted.values()):
        return {k: _concrete(_first_given(opts)) for k, opts in accepted.items() if "" not in opts}
    if isinstance(accepted, dict):
        return {k: _concrete(v) for k, v in accepted.items()}
    if isinstance(accepted, list):
        return [_concrete(a) for a in accepted]
    return accepted


def bfcl_target_calls(ground_truth: list[dict[str, dict[str, list]]], functions: list[dict]) -> list[dict]:
    """OpenAI `tool_calls` that BFCL's grader accepts for `ground_truth` ([{bfcl_name: {arg: [accepted values]}}]).

    Each argument takes its first accepted value; an argument whose accepted values include "" (BFCL: may be
    omitted) is left out unless the function requires it. Names become OpenAI names ("a.b" -> "a_b",
    `evals.bfcl_schema.openai_name`); call ids are "call_0", "call_1", ... (deterministic).
    """
    from evals.bfcl_schema import openai_name

    required = {fn["name"]: set((fn.get("parameters") or {}).get("required", [])) for fn in functions}
    calls = []
    for i, expected in enumerate(ground_truth):
        (name, accepted_args), = expected.items()
        arguments = {arg: _concrete(_first_given(options)) for arg, options in accepted_args.items()
                     if "" not in options or arg in required.get(name, ())}
        calls.append({"id": f"call_{i}", "type": "function",
                      "function": {"name": openai_name(name), "arguments": json.dumps(arguments, ensure_ascii=False)}})
    return calls


def read_bfcl(data_dir: str | Path, categories: Iterable[str] = BFCL_CATEGORIES) -> list[Trace]:
    """BFCL items as traces: the question's messages, then an assistant turn with the target calls.

    Uses the evals loader (`evals.suites.bfcl.BFCL`) and tools (`evals.bfcl_schema.to_openai_tools`).
    Irrelevance items end in the plain-text answer `BFCL_NO_CALL_ANSWER` (no call).

    Args:
        data_dir: the shared data folder holding `bfcl/` (as for `link eval`), or the `bfcl` folder itself.
        categories: among "simple", "multiple", "parallel", "parallel_multiple", "irrelevance".
    Returns:
        Traces with ids "bfcl/test/<BFCL id>" (the eval item ids) and meta {"source": "bfcl", "category",
        "functions" (BFCL documents), "ground_truth"} for grading, in file order.
    Raises:
        PosttrainDataError: an unknown category, or a missing or incomplete BFCL file.
    """
    from evals.bfcl_schema import to_openai_tools
    from evals.suites.bfcl import BFCL

    data_dir, categories = Path(data_dir), list(categories)
    if (data_dir / "BFCL_v4_simple_python.json").is_file() and not (data_dir / "bfcl").is_dir():
        data_dir = data_dir.parent
    try:
        items = BFCL(data_dir, categories=categories).load("test")
    except (FileNotFoundError, ValueError) as exc:
        raise PosttrainDataError(f"cannot read BFCL from {data_dir}: {exc}") from None
    traces = []
    for item in items:
        functions = item.metadata["functions"]
        try:
            tools = to_openai_tools(functions)[0]
        except ValueError as exc:
            raise PosttrainDataError(f"{item.id}: {exc}") from None
        if item.reference:
            answer = {"role": "assistant", "content": None, "tool_calls": bfcl_target_calls(item.reference, functions)}
        else:
            answer = {"role": "assistant", "content": BFCL_NO_CALL_ANSWER}
        trace = Trace(item.id, [*item.metadata["messages"], answer], tools,
                      {"source": "bfcl", "category": item.metadata["category"], "functions": functions,
                       "ground_truth": item.reference})
        check_trace(trace)
        traces.append(trace)
    check_traces(traces, f"BFCL ({', '.join(categories)}) in {data_dir}")
    return traces
