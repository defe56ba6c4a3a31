"""BFCL: function calling, graded by AST matching of the produced calls against `possible_answer`.

Source: the Berkeley Function-Calling Leaderboard v4 (gorilla.cs.berkeley.edu; Patil et al.). Data under
`<data_dir>/bfcl/`: `BFCL_v4_<file>.json` (JSON lines {id, question: [[messages]], function: [docs]}) and
`possible_answer/BFCL_v4_<file>.json` ({id, ground_truth: [{name: {arg: [accepted values]}}]}).

    suite = make_suite("bfcl", data_dir, categories=["simple", "parallel"])
    items = suite.load("test")          # ids "bfcl/test/simple_python_0", ...; metadata category, functions

Categories (option `categories`, default all five): "simple" (the Python file, 400), "multiple" (one call,
several functions offered, 200), "parallel" (several calls to one function, 200), "parallel_multiple"
(200), "irrelevance" (no function fits: the right answer is no call, 240).

Styles:
- "chat": the question's messages with `tools` converted to OpenAI's form (`bfcl_schema.to_openai_tools`:
  "a.b" becomes "a_b" and is mapped back before grading) and `tool_choice: "auto"`; the calls are read
  from `Completion.tool_calls` (arguments JSON-decoded; unparsable arguments score 0).
- "completion": BFCL's prompting mode: the functions are listed in the prompt and the model writes the
  calls as a Python list, parsed with `ast` (`bfcl_schema.parse_python_calls`); text that does not parse
  scores 0, except in irrelevance, where it counts as no call (as in BFCL).

Grade: 1.0 when `bfcl_match.match_calls` accepts the calls (exact set, order-free); details: reason.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from evals.base import Answer, Grade, Item, PromptStyle, Suite
from evals.bfcl_match import match_calls
from evals.bfcl_schema import decode_tool_calls, parse_python_calls, render_prompt, to_openai_tools
from evals.targets import Target

CATEGORY_FILES = {"simple": "simple_python", "multiple": "multiple", "parallel": "parallel",
                  "parallel_multiple": "parallel_multiple", "irrelevance": "irrelevance"}


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise FileNotFoundError(f"BFCL data not found: {path}")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def question_text(messages: list[dict[str, Any]]) -> str:
    """The user turns' text of a BFCL question (what outcome tables and routers see)."""
    return "\n".join(str(m.get("content", "")) for m in messages if m.get("role") == "user")


class BFCL(Suite):
    """BFCL's single-turn categories; option `categories` (list of names of `CATEGORY_FILES`)."""

    name = "bfcl"
    splits = ("test",)
    default_shots = 0
    sampling = {"temperature": 0.0, "max_tokens": 512}

    @property
    def categories(self) -> list[str]:
        """The selected categories. Raises ValueError naming the known ones for an unknown category."""
        chosen = self.options.get("categories") or list(CATEGORY_FILES)
        chosen = [chosen] if isinstance(chosen, str) else list(chosen)
        unknown = [c for c in chosen if c not in CATEGORY_FILES]
        if unknown:
            raise ValueError(f"unknown BFCL categories {unknown}; known: {', '.join(CATEGORY_FILES)}")
        return chosen

    def load(self, split: str) -> list[Item]:
        """The items of the selected categories, category by category in file order.

        reference: the ground truth calls ([] for irrelevance). metadata: category, messages, functions.
        Raises:
            FileNotFoundError: a category's question or answer file is missing (the message names it).
            ValueError: an unknown split or category, or a question without an answer.
        """
        if split not in self.splits:
            raise ValueError(f"bfcl has the splits {self.splits}, not {split!r}")
        root = self.data_dir / "bfcl"
        items = []
        for category in self.categories:
            stem = f"BFCL_v4_{CATEGORY_FILES[category]}.json"
            rows = _read_jsonl(root / stem)
            answers = {} if category == "irrelevance" else {
                a["id"]: a["ground_truth"] for a in _read_jsonl(root / "possible_answer" / stem)}
            for row in rows:
                if category != "irrelevance" and row["id"] not in answers:
                    raise ValueError(f"BFCL item {row['id']} has no entry in possible_answer/{stem}")
                messages = row["question"][0]
                items.append(Item(id=f"bfcl/{split}/{row['id']}", prompt=question_text(messages),
                                  reference=answers.get(row["id"], []),
                                  metadata={"category": category, "messages": messages, "functions": row["function"]}))
        return items

    def request(self, item: Item) -> tuple[PromptStyle, dict[str, Any]]:
        functions = item.metadata["functions"]
        if self.style == "completion":
            return "completion", {"prompt": render_prompt(item.prompt, functions),
                                  "params": {"stop": ["\n\n", "\nQuestion:"]}}
        tools, _ = to_openai_tools(functions)
        return "chat", {"messages": item.metadata["messages"], "params": {"tools": tools, "tool_choice": "auto"}}

    async def grade(self, item: Item, answer: Answer, judge: Target | None = None) -> Grade:
        """1.0 when the produced calls match the ground truth; details: calls (BFCL names), reason."""
        if not answer.completions:
            return Grade(0.0, {"reason": f"no answer: {answer.error}"})
        irrelevance = item.metadata["category"] == "irrelevance"
        completion = answer.completions[-1]
        try:
            if self.style == "completion":
                calls = parse_python_calls(completion.text)
            else:
                calls = decode_tool_calls(completion.tool_calls, to_openai_tools(item.metadata["functions"])[1])
        except ValueError as exc:
            if irrelevance and self.style == "completion":
                return Grade(1.0, {"reason": f"no parsable call ({exc})", "calls": []})
            return Grade(0.0, {"reason": f"unparsable calls: {exc}", "calls": None})
        result = match_calls(calls, item.reference, item.metadata["functions"])
        return Grade(float(result.ok), {"reason": result.reason,
                                        "calls": [{"name": c.name, "arguments": c.arguments} for c in calls]})
