"""GSM8K: grade-school math word problems; the answer is the final number.

Source: Cobbe et al. 2021, "Training Verifiers to Solve Math Word Problems". Data:
`<data_dir>/gsm8k/{train,test}.jsonl`, rows {question, answer}; the answer is a worked solution whose
last line is "#### <number>" (calculator annotations "<<48/2=24>>" inline, removed from our shots).

    suite = make_suite("gsm8k", data_dir, shots=8, style="completion")
    items = suite.load("test")                   # 1,319 items, ids "gsm8k/test/0" ..

Styles:
- "completion": shots "Question: ...\\nAnswer: <worked solution>\\n#### n" separated by blank lines, then
  "Question: <q>\\nAnswer:"; generation stops at "\\n\\nQuestion:".
- "chat": the shots become user/assistant turns; the user turn asks for step-by-step reasoning ending
  with a line "#### <number>".

Few-shot examples come from the train split, drawn with `seed` per item (the same item always gets the
same shots) and never the item itself. Grade: `graders.extract_number` of the reply equals the gold
number within 1e-6.
"""

from __future__ import annotations

import functools
import json
import random
import re
from pathlib import Path
from typing import Any

from evals.base import Answer, Grade, Item, PromptStyle, Suite
from evals.graders import extract_number, numbers_equal, parse_number
from evals.targets import Target

CHAT_INSTRUCTION = ("Solve the following math problem. Reason step by step, then give the final answer "
                    "on its own last line in the form \"#### <number>\".")
# A base model often starts the next question after one newline, not two.
STOP = ["\n\nQuestion:", "\nQuestion:"]
_CALC = re.compile(r"<<[^>]*>>")


def gold_number(answer: str) -> float:
    """The number after "####" in a GSM8K answer ("#### 1,000" -> 1000.0). Raises ValueError if absent."""
    _, sep, tail = answer.rpartition("####")
    value = parse_number(tail) if sep else None
    if value is None:
        raise ValueError(f"no '#### <number>' in the GSM8K answer {answer[-80:]!r}")
    return value


def clean_solution(answer: str) -> str:
    """A worked solution without the calculator annotations ("48/2 = <<48/2=24>>24" -> "48/2 = 24")."""
    return _CALC.sub("", answer).strip()


class GSM8K(Suite):
    """GSM8K with greedy decoding; `shots` worked examples from the train split (default: 0 in chat style,
    4 in completion style, where a base model needs the examples to learn the answer format)."""

    name = "gsm8k"
    splits = ("train", "test")
    default_shots = 0
    completion_shots = 4
    # GSM8K's worked solutions run to about 200 tokens; longer replies are loops of small models.
    sampling = {"temperature": 0.0, "max_tokens": 320}

    def __init__(self, data_dir: Path, *, shots: int | None = None, style: PromptStyle = "chat", **kwargs: Any):
        if shots is None and style == "completion":
            shots = self.completion_shots
        super().__init__(data_dir, shots=shots, style=style, **kwargs)

    def _path(self, split: str) -> Path:
        return self.data_dir / "gsm8k" / f"{split}.jsonl"

    def _rows(self, split: str) -> list[dict[str, str]]:
        if split not in self.splits:
            raise ValueError(f"gsm8k has the splits {self.splits}, not {split!r}")
        path = self._path(split)
        if not path.is_file():
            raise FileNotFoundError(f"GSM8K data not found: {path}")
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]

    def load(self, split: str) -> list[Item]:
        """Items of `split` ("train" or "test"); reference = the gold number (float).

        Raises:
            FileNotFoundError: the split's file is missing (the message names it).
            ValueError: an unknown split, or a row without "#### <number>".
        """
        return [Item(id=f"gsm8k/{split}/{i}", prompt=row["question"], reference=gold_number(row["answer"]),
                     metadata={"split": split, "index": i, "solution": row["answer"]})
                for i, row in enumerate(self._rows(split))]

    @functools.cached_property
    def train_rows(self) -> list[dict[str, str]]:
        """The train split's rows (read once, for few-shot examples)."""
        return self._rows("train")

    def shots_for(self, item: Item) -> list[tuple[str, str]]:
        """(question, cleaned worked solution) pairs from train, seeded by (seed, item id), without the item."""
        if self.shots <= 0:
            return []
        rng = random.Random(f"{self.seed}:{item.id}")
        exclude = item.metadata.get("index") if item.metadata.get("split") == "train" else None
        pool = [i for i in range(len(self.train_rows)) if i != exclude]
        picks = rng.sample(pool, min(self.shots, len(pool)))
        return [(self.train_rows[i]["question"], clean_solution(self.train_rows[i]["answer"])) for i in picks]

    def request(self, item: Item) -> tuple[PromptStyle, dict[str, Any]]:
        shots = self.shots_for(item)
        if self.style == "completion":
            blocks = [f"Question: {q}\nAnswer: {a}" for q, a in shots]
            prompt = "\n\n".join([*blocks, f"Question: {item.prompt}\nAnswer:"])
            return "completion", {"prompt": prompt, "params": {"stop": STOP}}
        messages: list[dict[str, str]] = []
        for q, a in shots:
            messages += [{"role": "user", "content": f"{CHAT_INSTRUCTION}\n\n{q}"},
                         {"role": "assistant", "content": a}]
        messages.append({"role": "user", "content": f"{CHAT_INSTRUCTION}\n\n{item.prompt}"})
        return "chat", {"messages": messages}

    async def grade(self, item: Item, answer: Answer, judge: Target | None = None) -> Grade:
        """1.0 when the reply's final number equals the gold number; details: extracted, gold."""
        extracted = extract_number(answer.text)
        return Grade(float(numbers_equal(extracted, item.reference)),
                     {"extracted": extracted, "gold": item.reference})
