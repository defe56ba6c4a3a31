"""Reports: per model or policy, the score with a 95% CI, cost, cost per 1,000 queries, latency and tokens.

    report = Report.from_tables([OutcomeTable.read("runs/a/outcomes.jsonl"), routed.outcomes], title="GSM8K")
    print(report.to_markdown())
    report.write("report/")     # report.md, report.json, report.png (quality vs cost with the Pareto frontier)

Rows are kept per (suite, model): each table's suite is the one its rows share ("gsm8k"; "mixed" for a table
spanning several, e.g. RouterBench), so runs of different suites never merge into one row, while runs of the same
suite do (a model may span several tables). With several suites the table gets a suite column and each suite its
own Pareto frontier.

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
from link.money import format_usd

REPORT_FILES = {"markdown": "report.md", "json": "report.json", "png": "report.png"}
MIXED_SUITE = "mixed"
_COLUMNS = ("model", "n", "score", "95% CI", "cost (USD)", "cost / 1k queries (USD)", "latency p50 (s)",
            "latency p95 (s)", "prompt tokens", "completion tokens")


@dataclass(frozen=True)
class Summary:
    """One model's or policy's numbers over its outcome rows in one suite (units in the names; None = not recorded)."""

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
    suite: str = ""

    @classmethod
    def of(cls, name: str, rows: Sequence[Outcome], suite: str = "") -> Summary:
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
                   total([r.prompt_tokens for r in rows]), total([r.completion_tokens for r in rows]), suite)


def _fmt(value: float | int | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table_suite(table: OutcomeTable) -> str:
    """The suite every row of `table` shares, else `MIXED_SUITE`."""
    suites = {row.suite for row in table}
    return suites.pop() if len(suites) == 1 else MIXED_SUITE


@dataclass
class Report:
    """Summaries of several models or policies per suite: suites in order of appearance, then best score first
    (then cheapest, then name).

    Attributes:
        title: shown above the table and on the plot.
        summaries: one per (suite, model/policy name) found in the tables.
    """

    title: str = ""
    summaries: list[Summary] = field(default_factory=list)

    @classmethod
    def from_tables(cls, tables: list[OutcomeTable], title: str = "") -> Report:
        """Summarise every (suite, model) of `tables` (a table's suite: `table_suite`; a model may span several
        tables of one suite). Raises ValueError when the same (prompt_id, model) appears twice, or there are no rows."""
        merged = OutcomeTable([row for table in tables for row in table])
        if not len(merged):
            raise ValueError("no outcomes to report")
        groups: dict[tuple[str, str], list[Outcome]] = {}
        for table in tables:
            suite = table_suite(table)
            for row in table:
                groups.setdefault((suite, row.model), []).append(row)
        rank = {suite: i for i, suite in enumerate(dict.fromkeys(suite for suite, _ in groups))}
        summaries = [Summary.of(name, rows, suite) for (suite, name), rows in groups.items()]
        summaries.sort(key=lambda s: (rank[s.suite], -s.score, s.cost_usd, s.name))
        return cls(title, summaries)

    @property
    def suites(self) -> list[str]:
        """The suites of the summaries, in order."""
        return list(dict.fromkeys(s.suite for s in self.summaries))

    def label(self, summary: Summary) -> str:
        """The summary's name, with its suite when the report has several ("m (gsm8k)")."""
        return f"{summary.name} ({summary.suite})" if len(self.suites) > 1 else summary.name

    @property
    def frontier(self) -> list[str]:
        """Labels on the Pareto frontier of score vs cost per 1,000 queries (one frontier per suite), cheapest first."""
        labels = []
        for suite in self.suites:
            group = [s for s in self.summaries if s.suite == suite]
            idx = pareto_frontier([s.cost_per_1k_usd for s in group], [s.score for s in group])
            labels += [self.label(group[i]) for i in idx]
        return labels

    def to_markdown(self, image: str | None = None) -> str:
        """A Markdown report: title, table, frontier line, and `![...](image)` when `image` is given.
        Scores with 3 decimals, USD by the rule of every money amount shown (`web.formatting.format_usd`, without
        "$", which some Markdown renderers read as math: "0.00001234", "12.50"), seconds with 2, tokens as integers;
        "-" where not recorded.
        With several suites a first column names each row's suite."""
        several = len(self.suites) > 1
        columns = ("suite", *_COLUMNS) if several else _COLUMNS
        lines = [f"# {self.title or 'Evaluation report'}", "",
                 "| " + " | ".join(columns) + " |",
                 "| " + " | ".join("---" if c in ("suite", "model") else "---:" for c in columns) + " |"]
        for s in self.summaries:
            names = [s.suite, s.name] if several else [s.name]
            cells = [*(n.replace("|", "\\|") for n in names), str(s.n), f"{s.score:.3f}", f"[{s.ci_low:.3f}, {s.ci_high:.3f}]",
                     format_usd(s.cost_usd, symbol=""), format_usd(s.cost_per_1k_usd, symbol=""),
                     _fmt(s.latency_p50_s, ".2f"), _fmt(s.latency_p95_s, ".2f"), _fmt(s.prompt_tokens, ","),
                     _fmt(s.completion_tokens, ",")]
            lines.append("| " + " | ".join(cells) + " |")
        per_suite = " per suite" if several else ""
        lines += ["", f"Pareto frontier{per_suite} (score vs cost per 1,000 queries), cheapest first: "
                      f"{', '.join(self.frontier)}."]
        if image:
            lines += ["", f"![score vs cost per 1,000 queries]({image})"]
        return "\n".join(lines) + "\n"

    def to_dict(self) -> dict[str, Any]:
        """JSON-able: {"title", "suites", "summaries": [Summary fields...], "pareto_frontier": [labels]}."""
        return {"title": self.title, "suites": self.suites, "summaries": [asdict(s) for s in self.summaries],
                "pareto_frontier": self.frontier}

    def plot(self, path: str | Path) -> Path:
        """Write the quality-cost PNG (see `evals.plot.quality_cost_figure`) to `path`."""
        fig = quality_cost_figure([self.label(s) for s in self.summaries], [s.cost_per_1k_usd for s in self.summaries],
                                  [s.score for s in self.summaries], ci=[(s.ci_low, s.ci_high) for s in self.summaries],
                                  title=self.title, groups=[s.suite for s in self.summaries] if len(self.suites) > 1 else None)
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
