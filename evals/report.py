"""Reports: per model or policy, the score with a 95% CI, cost, cost per 1,000 queries, latency and tokens.

    report = Report.from_tables([OutcomeTable.read("runs/a/outcomes.jsonl"), routed.outcomes], title="GSM8K")
    print(report.to_markdown())
    report.write("report/")     # report.md, report.json, report.png (quality vs cost with the Pareto frontier)

Every number is computed from the outcome rows: score = mean score (CI from `evals.stats.mean_interval`:
Wilson for 0/1 scores, else a seeded bootstrap), cost_usd = the sum of costs, cost_per_1k_usd =
1000 * cost_usd / n, latency p50/p95 = percentiles (linear interpolation) over the rows with a latency,
tokens = sums over the rows that record them (None when none do).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from evals.outcomes import Outcome, OutcomeTable
from evals.plot import pareto_frontier, quality_cost_figure, save_png
from evals.stats import mean_interval

REPORT_FILES = {"markdown": "report.md", "json": "report.json", "png": "report.png"}
_COLUMNS = ("model", "n", "score", "95% CI", "cost (USD)", "cost / 1k queries (USD)", "latency p50 (s)",
            "latency p95 (s)", "prompt tokens", "completion tokens")


@dataclass(frozen=True)
class Summary:
    """One model's or policy's numbers over its outcome rows (units in the names; None = not recorded)."""

    name: str
    n: int
    score: float
    ci_low: float
    ci_high: float
    cost_usd: float
    cost_per_1k_usd: float
    latency_p50_s: float | None
    latency_p95_s: float | None
    prompt_tokens: int | None
    completion_tokens: int | None

    @classmethod
    def of(cls, name: str, rows: Sequence[Outcome]) -> Summary:
        """Summarise `rows` (at least one). Raises ValueError when empty."""
        if not rows:
            raise ValueError(f"no outcomes for {name!r}")
        score, lo, hi = mean_interval([r.score for r in rows])
        cost = math.fsum(r.cost_usd for r in rows)
        latencies = [r.latency_s for r in rows if r.latency_s is not None]
        p50, p95 = (float(v) for v in np.percentile(latencies, [50, 95])) if latencies else (None, None)

        def total(values: list[int | None]) -> int | None:
            known = [v for v in values if v is not None]
            return sum(known) if known else None

        return cls(name, len(rows), score, lo, hi, cost, 1000 * cost / len(rows), p50, p95,
                   total([r.prompt_tokens for r in rows]), total([r.completion_tokens for r in rows]))


def _fmt(value: float | int | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


@dataclass
class Report:
    """Summaries of several models or policies, best score first (then cheapest, then name).

    Attributes:
        title: shown above the table and on the plot.
        summaries: one per model/policy name found in the tables.
    """

    title: str = ""
    summaries: list[Summary] = field(default_factory=list)

    @classmethod
    def from_tables(cls, tables: list[OutcomeTable], title: str = "") -> Report:
        """Summarise every model of `tables` (a model may span several tables).
        Raises ValueError when the same (prompt_id, model) appears twice, or there are no rows."""
        merged = OutcomeTable([row for table in tables for row in table])
        if not len(merged):
            raise ValueError("no outcomes to report")
        by_model: dict[str, list[Outcome]] = {}
        for row in merged:
            by_model.setdefault(row.model, []).append(row)
        summaries = [Summary.of(name, rows) for name, rows in by_model.items()]
        summaries.sort(key=lambda s: (-s.score, s.cost_usd, s.name))
        return cls(title, summaries)

    @property
    def frontier(self) -> list[str]:
        """Names on the Pareto frontier of score vs cost per 1,000 queries, cheapest first."""
        idx = pareto_frontier([s.cost_per_1k_usd for s in self.summaries], [s.score for s in self.summaries])
        return [self.summaries[i].name for i in idx]

    def to_markdown(self, image: str | None = None) -> str:
        """A Markdown report: title, table, frontier line, and `![...](image)` when `image` is given.
        Scores with 3 decimals, USD with 4, seconds with 2, tokens as integers; "-" where not recorded."""
        lines = [f"# {self.title or 'Evaluation report'}", "",
                 "| " + " | ".join(_COLUMNS) + " |",
                 "| --- | " + " | ".join("---:" for _ in _COLUMNS[1:]) + " |"]
        for s in self.summaries:
            cells = [s.name.replace("|", "\\|"), str(s.n), f"{s.score:.3f}", f"[{s.ci_low:.3f}, {s.ci_high:.3f}]",
                     f"{s.cost_usd:.4f}", f"{s.cost_per_1k_usd:.4f}", _fmt(s.latency_p50_s, ".2f"),
                     _fmt(s.latency_p95_s, ".2f"), _fmt(s.prompt_tokens, ","), _fmt(s.completion_tokens, ",")]
            lines.append("| " + " | ".join(cells) + " |")
        lines += ["", f"Pareto frontier (score vs cost per 1,000 queries), cheapest first: {', '.join(self.frontier)}."]
        if image:
            lines += ["", f"![score vs cost per 1,000 queries]({image})"]
        return "\n".join(lines) + "\n"

    def to_dict(self) -> dict[str, Any]:
        """JSON-able: {"title", "summaries": [Summary fields...], "pareto_frontier": [names]}."""
        return {"title": self.title, "summaries": [asdict(s) for s in self.summaries], "pareto_frontier": self.frontier}

    def plot(self, path: str | Path) -> Path:
        """Write the quality-cost PNG (see `evals.plot.quality_cost_figure`) to `path`."""
        fig = quality_cost_figure([s.name for s in self.summaries], [s.cost_per_1k_usd for s in self.summaries],
                                  [s.score for s in self.summaries], ci=[(s.ci_low, s.ci_high) for s in self.summaries],
                                  title=self.title)
        return save_png(fig, path)

    def write(self, out_dir: str | Path) -> dict[str, Path]:
        """Write report.md (linking the PNG), report.json and report.png into `out_dir`; returns
        {"markdown": path, "json": path, "png": path}."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        paths = {kind: out / name for kind, name in REPORT_FILES.items()}
        self.plot(paths["png"])
        paths["markdown"].write_text(self.to_markdown(image=REPORT_FILES["png"]), encoding="utf-8")
        paths["json"].write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")
        return paths
