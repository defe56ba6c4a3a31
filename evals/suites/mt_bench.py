"""MT-Bench: 80 two-turn questions over 8 categories, each turn rated 1-10 by a judge model.

Source: Zheng et al. 2023, "Judging LLM-as-a-Judge with MT-Bench and Chatbot Arena". Data:
`<data_dir>/mt-bench/mt_bench/question.jsonl` (rows {question_id, category, turns: [t1, t2]}) and
`reference_answer/gpt-4.jsonl` (rows {question_id, choices: [{turns: [r1, r2]}]}, the references used for
math, reasoning and coding).

    suite = make_suite("mt-bench", data_dir)
    items = suite.load("test")                            # 80 items, ids "mt-bench/test/81" ..
    answer = await suite.answer(items[0], target)         # two calls; the second sees the first reply
    grade = await suite.grade(items[0], answer, judge)    # mean of the two ratings / 10

Answering: turn 1 alone, then turn 2 with turn 1 and the model's reply in the history ("chat": messages;
"completion": a "### User:" / "### Assistant:" transcript that stops at the next "### User:"). Greedy, at
most 1,024 new tokens per turn. Grading (`evals.judge`, our prompts): turn 1 rated on its own, turn 2 rated in
the context of the conversation; references are shown for math, reasoning and coding. A turn whose rating
cannot be parsed is left out of the mean; when neither can, the grade is 0 with an error.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from evals.base import Answer, Grade, Item, Suite
from evals.judge import judged_score, multi_turn_messages, rate, require_judge, single_answer_messages
from evals.targets import Target

REFERENCE_CATEGORIES = ("math", "reasoning", "coding")
USER, ASSISTANT = "### User:\n", "### Assistant:\n"


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


class MTBench(Suite):
    """MT-Bench; option `reference_model` picks `reference_answer/<name>.jsonl` (default "gpt-4")."""

    name = "mt-bench"
    splits = ("test",)
    needs_judge = True
    sampling = {"temperature": 0.0, "max_tokens": 1024}

    @property
    def folder(self) -> Path:
        return self.data_dir / "mt-bench" / "mt_bench"

    def load(self, split: str = "test") -> list[Item]:
        """The 80 questions; reference = [r1, r2] for math/reasoning/coding, else None.

        Raises:
            FileNotFoundError: question.jsonl (or the reference file) is missing; the message names the path.
            ValueError: a split other than "test".
        """
        if split not in self.splits:
            raise ValueError(f"mt-bench has the split 'test' only, not {split!r}")
        questions_path = self.folder / "question.jsonl"
        if not questions_path.is_file():
            raise FileNotFoundError(f"MT-Bench questions not found: {questions_path}")
        reference_path = self.folder / "reference_answer" / f"{self.options.get('reference_model', 'gpt-4')}.jsonl"
        if not reference_path.is_file():
            raise FileNotFoundError(f"MT-Bench reference answers not found: {reference_path}")
        references = {r["question_id"]: r["choices"][0]["turns"] for r in _read_jsonl(reference_path)}
        items = []
        for row in _read_jsonl(questions_path):
            qid, category = row["question_id"], row["category"]
            reference = references.get(qid) if category in REFERENCE_CATEGORIES else None
            items.append(Item(id=f"mt-bench/{split}/{qid}", prompt=row["turns"][0], reference=reference,
                              metadata={"question_id": qid, "category": category, "turns": list(row["turns"])}))
        return items

    async def answer(self, item: Item, target: Target) -> Answer:
        """Two calls (one per turn); target errors propagate."""
        turns: list[str] = item.metadata["turns"]
        completions = []
        if self.style == "completion":
            prompt = ""
            for turn in turns:
                prompt += f"{USER}{turn}\n\n{ASSISTANT}"
                completion = await target.complete(prompt, **self.sampling, stop=["\n" + USER.strip(), USER])
                completions.append(completion)
                prompt += completion.text.strip() + "\n\n"
            return Answer(completions)
        messages: list[dict[str, str]] = []
        for turn in turns:
            messages.append({"role": "user", "content": turn})
            completion = await target.chat(list(messages), **self.sampling)
            completions.append(completion)
            messages.append({"role": "assistant", "content": completion.text})
        return Answer(completions)

    async def grade(self, item: Item, answer: Answer, judge: Target | None = None) -> Grade:
        """Mean judge rating over the turns / 10 (see the module docstring).

        Raises:
            ValueError: no judge. evals.targets.TargetError: a judge call failed.
        """
        judge = require_judge(judge, "mt-bench")
        turns: list[str] = item.metadata["turns"]
        replies = [c.text for c in answer.completions]
        if len(replies) != len(turns):
            raise ValueError(f"{item.id}: expected {len(turns)} replies, got {len(replies)}")
        references = item.reference
        ratings: list[float | None] = []
        judgments: list[str] = []
        cost = 0.0
        for k in range(len(turns)):
            if k == 0:
                messages = single_answer_messages(turns[0], replies[0], references[0] if references else None)
            else:
                messages = multi_turn_messages(turns[: k + 1], replies[: k + 1], references[: k + 1] if references else None)
            rating, completion = await rate(judge, messages)
            ratings.append(rating)
            judgments.append(completion.text)
            cost += completion.cost_usd
        parsed = [r for r in ratings if r is not None]
        details: dict[str, Any] = {"ratings": ratings, "category": item.metadata["category"], "judgments": judgments}
        return judged_score(sum(parsed) / len(parsed) / 10.0 if parsed else None, details, cost)
