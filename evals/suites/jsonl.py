"""A user's own suite: one JSON object per line, graded by a named grader from `evals.graders`.

    make_suite("jsonl", data_dir, path="my_suite.jsonl").load("test")

Row fields:
    id         optional; the item id is "jsonl/<file stem>/<id>" (default: the 1-based line number)
    prompt     a string, or a list of chat messages [{"role", "content"}, ...]
    reference  the gold answer, in the grader's form
    grader     one of `graders.GRADERS`: exact, contains, numeric, choice, regex, json
    max_tokens optional per-row limit, an integer >= 1 (default: the suite's `max_tokens` option, else 512)
    any other field is kept in `Item.metadata`.

A relative `path` is resolved against the working directory first, then `data_dir`. Style "chat" sends
a string prompt as one user turn; style "completion" sends a string as it is and a message list as a
plain "Role: content" transcript ending in "Assistant:".
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from evals.base import Answer, Grade, Item, PromptStyle, Suite
from evals.graders import GRADERS, get_grader
from evals.targets import Target

REQUIRED = ("prompt", "reference", "grader")


def _is_token_limit(value: Any) -> bool:
    """An integer >= 1 (not a bool, not a float): a valid `max_tokens`."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def transcript(messages: list[dict[str, Any]]) -> str:
    """Chat messages as a plain-text prompt for a base model ("User: ...\\n\\nAssistant:")."""
    turns = [f"{str(m.get('role', 'user')).capitalize()}: {m.get('content', '')}" for m in messages]
    return "\n\n".join([*turns, "Assistant:"])


class JSONLSuite(Suite):
    """Rows of a JSONL file (option `path`, required); option `max_tokens` (default 512)."""

    name = "jsonl"
    splits = ("test",)
    default_shots = 0

    @property
    def path(self) -> Path:
        """The suite file. Raises ValueError when the `path` option is missing."""
        raw = self.options.get("path")
        if not raw:
            raise ValueError("the jsonl suite needs a file: pass --path FILE (make_suite(..., path=FILE) in Python)")
        path = Path(raw).expanduser()
        if not path.is_absolute() and not path.exists() and (self.data_dir / path).exists():
            path = self.data_dir / path
        return path

    def load(self, split: str) -> list[Item]:
        """All rows of the file (`split` is ignored: a JSONL suite has one split).

        Raises:
            FileNotFoundError: the file is missing (named).
            ValueError: a file without rows; a line that is not a JSON object, lacks prompt/reference/grader,
                names an unknown grader (the message names the line and the available graders), has a reference
                its grader cannot use or a max_tokens below 1, or repeats an id.
        """
        default = self.options.get("max_tokens")
        if default is not None and not _is_token_limit(default):
            raise ValueError(f"the max_tokens option must be an integer >= 1, got {default!r}")
        path = self.path
        if not path.is_file():
            raise FileNotFoundError(f"JSONL suite file not found: {path}")
        items, seen = [], set()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}: not JSON ({exc})") from None
            if not isinstance(row, dict) or any(k not in row for k in REQUIRED):
                raise ValueError(f"{where}: a row needs the fields {', '.join(REQUIRED)}")
            if row["grader"] not in GRADERS:
                raise ValueError(f"{where}: unknown grader {row['grader']!r}; available: {', '.join(sorted(GRADERS))}")
            try:  # a reference the grader cannot use (no number, not a letter, a broken regex) fails here
                get_grader(row["grader"])("", row["reference"])
            except (ValueError, re.error) as exc:
                raise ValueError(f"{where}: bad reference for the {row['grader']!r} grader: {exc}") from None
            limit = row.get("max_tokens")
            if limit is not None and not _is_token_limit(limit):
                raise ValueError(f"{where}: max_tokens must be an integer >= 1, got {limit!r}")
            prompt = row["prompt"]
            is_messages = isinstance(prompt, list) and all(isinstance(m, dict) for m in prompt)
            if not isinstance(prompt, str) and not is_messages:
                raise ValueError(f"{where}: prompt must be a string or a list of chat messages")
            item_id = f"jsonl/{path.stem}/{row.get('id', number)}"
            if item_id in seen:
                raise ValueError(f"{where}: duplicate id {row.get('id', number)!r}")
            seen.add(item_id)
            text = prompt if isinstance(prompt, str) else next(
                (str(m.get("content", "")) for m in prompt if m.get("role") == "user"), "")
            meta = {k: v for k, v in row.items() if k not in ("id", "prompt", "reference")}
            meta["messages"] = prompt if isinstance(prompt, list) else None
            items.append(Item(id=item_id, prompt=text, reference=row["reference"], metadata=meta))
        if not items:
            raise ValueError(f"no rows in {path}")
        return items

    def request(self, item: Item) -> tuple[PromptStyle, dict[str, Any]]:
        limit = item.metadata.get("max_tokens")  # `is None`, not `or`: a 0 must never become the default
        if limit is None:
            limit = self.options.get("max_tokens")
        params = {"max_tokens": 512 if limit is None else int(limit)}
        messages = item.metadata.get("messages")
        if self.style == "completion":
            return "completion", {"prompt": transcript(messages) if messages else item.prompt, "params": params}
        return "chat", {"messages": messages or [{"role": "user", "content": item.prompt}], "params": params}

    async def grade(self, item: Item, answer: Answer, judge: Target | None = None) -> Grade:
        """The row's grader applied to the reply's text; details: grader."""
        score = get_grader(item.metadata["grader"])(answer.text, item.reference)
        return Grade(float(score), {"grader": item.metadata["grader"]})
