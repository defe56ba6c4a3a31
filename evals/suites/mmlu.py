"""MMLU: four-option multiple-choice questions over 57 subjects; the answer is a letter.

Source: Hendrycks et al. 2021, "Measuring Massive Multitask Language Understanding", whose prompt format
we follow: the header "The following are multiple choice questions (with answers) about <subject>.",
then for each shot "<question>\\nA. ..\\nB. ..\\nC. ..\\nD. ..\\nAnswer: X", blank-line separated, and the
question ending in "Answer:". Data: `<data_dir>/mmlu/data/{dev,val,test}/<subject>_<split>.csv`,
headerless rows (question, A, B, C, D, answer letter). Shots are the subject's dev rows, in file order
(the paper's 5-shot setting; the dev split has exactly 5 per subject).

    suite = make_suite("mmlu", data_dir)         # 5-shot
    items = suite.sample(suite.load("test"), 500)   # seeded, across subjects; ids "mmlu/test/anatomy/3"

Styles: "completion" sends the prompt above. "chat" sends the shots as conversation turns (each shot's
question block, ending "Answer:", a user turn answered by an assistant turn holding its letter; then the
item's block), the first user turn opening with the header and an instruction to reply with the letter
only (shots as turns, as lm-evaluation-harness's `--fewshot_as_multiturn` and our GSM8K chat style give
them). Inlining the shots in one user turn instead left instruction-tuned models answering from a
letter prior (qwen2.5-coder-1.5b-instruct: 10/30 right that way, 16/30 in turns and in completion
style, on the same seeded items). The 5-shot numbers that papers and model cards publish for base models
(Hendrycks et al.; Qwen2.5's "MMLU (5-shot)") are the completion setting; `--style completion` asks it
of any served model, chat models included. Option `scoring`:
- "logprob" (default): one token is generated with its top alternatives (completions `logprobs: 5`, chat
  `top_logprobs: 20`, the APIs' maxima) and the answer is the letter most likely as that token
  (`graders.choice_from_logprobs`); when no letter is among them, the reply's text is read as below.
  Small models that always write "A" still rank the options in their distribution, which this reads.
- "generate": a few tokens are generated (stop at a newline) and `graders.extract_choice` reads the letter.
Grade: the letter equals the gold letter (no letter scores 0). Option `subjects` (list of names)
restricts the subjects loaded.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from evals.base import Answer, Grade, Item, PromptStyle, Suite
from evals.graders import choice_from_logprobs, extract_choice
from evals.targets import Target

LETTERS = "ABCD"
CHAT_INSTRUCTION = "Reply with the letter of the correct option (A, B, C or D) only."


def pretty_subject(subject: str) -> str:
    """"high_school_us_history" -> "high school us history" (as in the paper's header)."""
    return subject.replace("_", " ")


def header(subject: str) -> str:
    """The paper's first line: "The following are multiple choice questions (with answers) about <subject>."."""
    return f"The following are multiple choice questions (with answers) about {pretty_subject(subject)}."


def format_question(row: list[str], answer: str | None = None) -> str:
    """One question block: the question, the lettered options and "Answer:" (+ " X" for a shot)."""
    question, *options = row[:5]
    lines = [question.strip(), *(f"{letter}. {option}" for letter, option in zip(LETTERS, options))]
    return "\n".join(lines) + "\nAnswer:" + (f" {answer}" if answer else "")


class MMLU(Suite):
    """MMLU, `shots` dev examples per prompt (default 5), greedy, a few tokens per answer."""

    name = "mmlu"
    splits = ("dev", "val", "test")
    default_shots = 5
    sampling = {"temperature": 0.0, "max_tokens": 4}

    @property
    def root(self) -> Path:
        return self.data_dir / "mmlu" / "data"

    def _read(self, split: str, subject: str) -> list[list[str]]:
        path = self.root / split / f"{subject}_{split}.csv"
        if not path.is_file():
            raise FileNotFoundError(f"MMLU data not found: {path}")
        with path.open(encoding="utf-8", newline="") as f:
            return [row for row in csv.reader(f) if row]

    def subjects(self, split: str = "test") -> list[str]:
        """The subjects with a file in `split` (sorted), or the `subjects` option.

        Raises:
            FileNotFoundError: the split's folder is missing (the message names it).
        """
        folder = self.root / split
        if not folder.is_dir():
            raise FileNotFoundError(f"MMLU data not found: {folder}")
        if "subjects" in self.options:
            return list(self.options["subjects"])
        suffix = f"_{split}.csv"
        return sorted(p.name[: -len(suffix)] for p in folder.glob(f"*{suffix}"))

    def load(self, split: str) -> list[Item]:
        """All questions of `split`, subject by subject (sorted). reference = the gold letter.

        Raises:
            FileNotFoundError: a missing folder or subject file (named).
            ValueError: an unknown split.
        """
        if split not in self.splits:
            raise ValueError(f"mmlu has the splits {self.splits}, not {split!r}")
        items = []
        for subject in self.subjects(split):
            for i, row in enumerate(self._read(split, subject)):
                items.append(Item(id=f"mmlu/{split}/{subject}/{i}", prompt=format_question(row)[: -len("\nAnswer:")],
                                  reference=row[5].strip().upper(),
                                  metadata={"subject": subject, "split": split, "index": i, "row": row[:5]}))
        return items

    def dev_rows(self, subject: str) -> list[list[str]]:
        """The subject's dev rows (the few-shot pool), read once per subject."""
        cache = self.__dict__.setdefault("_dev_rows", {})
        if subject not in cache:
            cache[subject] = self._read("dev", subject)
        return cache[subject]

    def shot_rows(self, item: Item) -> list[list[str]]:
        """The item's shots: its subject's first `shots` dev rows, the item itself left out."""
        own = item.metadata["index"] if item.metadata["split"] == "dev" else None
        rows = [row for i, row in enumerate(self.dev_rows(item.metadata["subject"])) if i != own]
        return rows[: self.shots] if self.shots else []

    def prompt_text(self, item: Item) -> str:
        """The header, the shots and the question, ending in "Answer:"."""
        blocks = [format_question(row, row[5].strip()) for row in self.shot_rows(item)]
        return "\n\n".join([header(item.metadata["subject"]), *blocks, format_question(item.metadata["row"])])

    def chat_messages(self, item: Item) -> list[dict[str, str]]:
        """The chat turns: per shot, a user turn with its question block (ending "Answer:") and an assistant
        turn with its letter; then a user turn with the item's block. The first user turn opens with the
        header and `CHAT_INSTRUCTION` ("<header> <instruction>\\n\\n<block>")."""
        turns = [(format_question(row), row[5].strip()) for row in self.shot_rows(item)]
        turns.append((format_question(item.metadata["row"]), None))
        opening = f"{header(item.metadata['subject'])} {CHAT_INSTRUCTION}\n\n"
        messages = []
        for i, (question, letter) in enumerate(turns):
            messages.append({"role": "user", "content": opening + question if i == 0 else question})
            if letter is not None:
                messages.append({"role": "assistant", "content": letter})
        return messages

    @property
    def scoring(self) -> str:
        """"logprob" or "generate" (option `scoring`). Raises ValueError for another value."""
        scoring = self.options.get("scoring", "logprob")
        if scoring not in ("logprob", "generate"):
            raise ValueError(f"mmlu scoring is 'logprob' or 'generate', not {scoring!r}")
        return scoring

    def request(self, item: Item) -> tuple[PromptStyle, dict[str, Any]]:
        by_logprob = self.scoring == "logprob"
        if self.style == "completion":
            params = {"max_tokens": 1, "logprobs": 5} if by_logprob else {"stop": ["\n"]}
            return "completion", {"prompt": self.prompt_text(item), "params": params}
        params = {"max_tokens": 1, "logprobs": True, "top_logprobs": 20} if by_logprob else {"max_tokens": 32}
        return "chat", {"messages": self.chat_messages(item), "params": params}

    async def grade(self, item: Item, answer: Answer, judge: Target | None = None) -> Grade:
        """1.0 when the answer's letter equals the gold letter; details: extracted, gold, how it was read
        ("logprob" or "text")."""
        letter, read = None, "text"
        if answer.completions and self.scoring == "logprob":
            letter = choice_from_logprobs(answer.completions[-1].top_logprobs, LETTERS)
            read = "logprob" if letter else "text"
        if letter is None:
            letter = extract_choice(answer.text, LETTERS)
        return Grade(float(letter == item.reference), {"extracted": letter, "gold": item.reference, "read": read})
