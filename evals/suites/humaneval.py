"""HumanEval: write a Python function from its signature and docstring; pass@1 by running the unit tests.

Source: Chen et al. 2021, "Evaluating Large Language Models Trained on Code" (164 hand-written
problems). Data: `<data_dir>/human-eval/HumanEval.jsonl.gz`, rows {task_id, prompt, entry_point,
canonical_solution, test}.

    suite = make_suite("humaneval", data_dir, style="completion")
    items = suite.load("test")                   # 164 items, ids "humaneval/test/0" .. "/163"

Styles:
- "completion" sends the prompt (imports, signature, docstring) and expects the function body; it stops
  at the start of the next top-level statement (the paper's stop sequences). Program = prompt + body.
- "chat" asks for the complete function in a ```python block. When the extracted code defines the entry
  point, the program is prompt + "\\n\\n" + code (the prompt's stub, a valid function whose body is its
  docstring, keeps the prompt's imports and helper functions available; the model's `def` replaces it);
  otherwise the code is taken as a body: prompt + code.

Grade: 1.0 when `program + test + "check(<entry_point>)"` exits 0 in `evals.sandbox.run_python`
(options `timeout_s`, default 10, and `memory_mb`, default 1024). Few-shot examples are not used.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import re
from pathlib import Path
from typing import Any

from evals.base import Answer, Grade, Item, PromptStyle, Suite
from evals.sandbox import run_python
from evals.targets import Target

STOP = ["\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#"]
# OpenAI's APIs take at most 4 stop sequences: the server stops at the first four, the grader cuts at all five.
API_STOP = STOP[:4]
CHAT_INSTRUCTION = ("Complete the following Python function. Reply with the complete function, including "
                    "its signature and any imports it needs, in a single ```python code block.")
_MAIN_GUARD = re.compile(r"^if\s+__name__\s*==", re.MULTILINE)
_FENCE = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)(?:```|$)", re.DOTALL | re.IGNORECASE)


def extract_code(text: str, entry_point: str) -> str:
    """The code in a chat reply: the first fenced block that defines `entry_point`, else the first fenced
    block (an unclosed final fence counts), else the whole text; cut before a top-level
    `if __name__ == "__main__":` (example usage would run, since the program is the main module)."""
    blocks = [m.group(1) for m in _FENCE.finditer(text)]
    code = next((b for b in blocks if re.search(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", b, re.MULTILINE)),
                blocks[0] if blocks else text)
    return _MAIN_GUARD.split(code, maxsplit=1)[0]


def truncate_at_stop(completion: str, stops: list[str] = STOP) -> str:
    """`completion` up to the earliest of `stops` (the whole text when none occurs)."""
    cuts = [i for i in (completion.find(stop) for stop in stops) if i >= 0]
    return completion[: min(cuts)] if cuts else completion


def build_program(prompt: str, completion: str, entry_point: str, style: PromptStyle) -> str:
    """The program to test (without the tests): see the module docstring for the two styles."""
    if style == "completion":
        return prompt + truncate_at_stop(completion)
    code = extract_code(completion, entry_point)
    if re.search(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", code, re.MULTILINE):
        return prompt + "\n\n" + code
    return prompt + code


def program_with_tests(program: str, test: str, entry_point: str) -> str:
    """The program followed by HumanEval's `check` function and its call on the entry point."""
    return f"{program}\n\n{test}\n\ncheck({entry_point})\n"


class HumanEval(Suite):
    """HumanEval pass@1 (greedy). Options: `timeout_s` (float, default 10), `memory_mb` (int, default 1024)."""

    name = "humaneval"
    splits = ("test",)
    default_shots = 0
    # The longest canonical solution is 864 characters (under 300 tokens); longer replies are small models looping.
    sampling = {"temperature": 0.0, "max_tokens": 384}

    @property
    def path(self) -> Path:
        return self.data_dir / "human-eval" / "HumanEval.jsonl.gz"

    def load(self, split: str) -> list[Item]:
        """All 164 problems. Raises FileNotFoundError naming the data file, ValueError for another split."""
        if split not in self.splits:
            raise ValueError(f"humaneval has the splits {self.splits}, not {split!r}")
        if not self.path.is_file():
            raise FileNotFoundError(f"HumanEval data not found: {self.path}")
        with gzip.open(self.path, "rt", encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
        return [Item(id=f"humaneval/{split}/{row['task_id'].rsplit('/', 1)[-1]}", prompt=row["prompt"],
                     reference=row["test"],
                     metadata={"task_id": row["task_id"], "entry_point": row["entry_point"],
                               "canonical_solution": row["canonical_solution"]})
                for row in rows]

    def request(self, item: Item) -> tuple[PromptStyle, dict[str, Any]]:
        if self.style == "completion":
            return "completion", {"prompt": item.prompt, "params": {"stop": API_STOP}}
        content = f"{CHAT_INSTRUCTION}\n\n```python\n{item.prompt}```"
        return "chat", {"messages": [{"role": "user", "content": content}]}

    async def grade(self, item: Item, answer: Answer, judge: Target | None = None) -> Grade:
        """pass@1 of the answer's code; details: status ("passed", "failed", "timeout", "error") and stderr tail."""
        entry = item.metadata["entry_point"]
        program = build_program(item.prompt, answer.text, entry, self.style)
        result = await asyncio.to_thread(run_python, program_with_tests(program, item.reference, entry),
                                         float(self.options.get("timeout_s", 10.0)),
                                         int(self.options.get("memory_mb", 1024)))
        return Grade(float(result.passed), {"status": result.status, "stderr": result.stderr[-500:]})
