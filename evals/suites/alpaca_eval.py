"""AlpacaEval-style pairwise comparison: 805 instructions, each answer judged against a baseline's recorded output.

Source: Li et al. 2023, "AlpacaEval: An Automatic Evaluator of Instruction-following Models"; length control
after Dubois et al. 2024, "Length-Controlled AlpacaEval: A Simple Way to Debias Automatic Evaluators". Data:
`<data_dir>/alpaca_eval/results/<baseline>/model_outputs.json` (a JSON list of {instruction, dataset, output,
generator}); the instructions are the same for every baseline.

    suite = make_suite("alpaca-eval", data_dir)             # option baseline="gpt4_1106_preview" (the default)
    items = suite.load("test")                              # 805 items, ids "alpaca-eval/test/0" ..
    grade = await suite.grade(items[0], answer, judge)      # 1 win / 0.5 tie / 0 loss, both orders averaged
    suite.summarize(rows)                                   # {"win_rate", "lc_win_rate"}

Grading (`evals.judge.compare_both_orders`, our prompt): the judge sees the model's and the baseline's outputs
in both orders; the score is the mean of the two verdicts (1 model better, 0.5 tie, 0 baseline better).
The win rate is the mean score; the length-controlled win rate is `evals.stats.length_controlled_win_rate` over
the per-item scores and the outputs' lengths in characters (a logistic fit of the preference on the length
difference, read at zero difference).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from evals.base import Answer, Grade, Item, PromptStyle, Suite
from evals.judge import compare_both_orders, judged_score, require_judge
from evals.targets import Target

DEFAULT_BASELINE = "gpt4_1106_preview"


def available_baselines(data_dir: Path) -> list[str]:
    """Model folders with a model_outputs.json under `<data_dir>/alpaca_eval/results`, sorted."""
    results = Path(data_dir) / "alpaca_eval" / "results"
    if not results.is_dir():
        return []
    return sorted(p.name for p in results.iterdir() if (p / "model_outputs.json").is_file())


class AlpacaEval(Suite):
    """AlpacaEval against a recorded baseline; option `baseline` (default gpt4_1106_preview, else the first found)."""

    name = "alpaca-eval"
    splits = ("test",)
    needs_judge = True
    sampling = {"temperature": 0.0, "max_tokens": 1024}

    @property
    def baseline(self) -> str:
        chosen = self.options.get("baseline")
        if chosen:
            return chosen
        found = available_baselines(self.data_dir)
        return DEFAULT_BASELINE if DEFAULT_BASELINE in found or not found else found[0]

    def load(self, split: str = "test") -> list[Item]:
        """The baseline's 805 records; reference = the baseline's output.

        Raises:
            FileNotFoundError: the baseline's model_outputs.json is missing (the message names it and lists those found).
            ValueError: a split other than "test".
        """
        if split not in self.splits:
            raise ValueError(f"alpaca-eval has the split 'test' only, not {split!r}")
        path = self.data_dir / "alpaca_eval" / "results" / self.baseline / "model_outputs.json"
        if not path.is_file():
            found = ", ".join(available_baselines(self.data_dir)) or "none"
            raise FileNotFoundError(f"AlpacaEval baseline outputs not found: {path} (baselines found: {found})")
        rows = json.loads(path.read_text(encoding="utf-8"))
        return [Item(id=f"alpaca-eval/{split}/{i}", prompt=row["instruction"], reference=row["output"],
                     metadata={"index": i, "dataset": row.get("dataset"), "baseline": self.baseline})
                for i, row in enumerate(rows)]

    def request(self, item: Item) -> tuple[PromptStyle, dict[str, Any]]:
        if self.style == "completion":
            prompt = f"### Instruction:\n{item.prompt}\n\n### Response:\n"
            return "completion", {"prompt": prompt, "params": {"stop": ["\n### Instruction:"]}}
        return "chat", {"messages": [{"role": "user", "content": item.prompt}]}

    async def grade(self, item: Item, answer: Answer, judge: Target | None = None) -> Grade:
        """Pairwise against the baseline in both orders; details: verdicts, output lengths (characters), judgments.

        Raises:
            ValueError: no judge. evals.targets.TargetError: a judge call failed.
        """
        judge = require_judge(judge, "alpaca-eval")
        output = answer.text.strip()
        result = await compare_both_orders(judge, item.prompt, output, item.reference)
        details: dict[str, Any] = {"verdicts": list(result.verdicts), "model_chars": len(output),
                                   "baseline_chars": len(item.reference), "baseline": item.metadata.get("baseline"),
                                   "judgments": list(result.judgments)}
        return judged_score(result.score if result.is_parsed else None, details, result.cost_usd, "verdict")

    def summarize(self, rows: list[tuple[Item, Answer, Grade]]) -> dict[str, float | None]:
        """{"win_rate", "lc_win_rate"} over the rows graded without error (None when there are none)."""
        graded = [(g.score, g.details["model_chars"], g.details["baseline_chars"])
                  for _, a, g in rows if not a.error and "error" not in g.details and "model_chars" in g.details]
        if not graded:
            return {"win_rate": None, "lc_win_rate": None}
        from evals.stats import length_controlled_win_rate  # E1's module; imported when needed

        scores, model_chars, baseline_chars = zip(*graded)
        return {"win_rate": sum(scores) / len(scores),
                "lc_win_rate": float(length_controlled_win_rate(scores, model_chars, baseline_chars))}
