"""Reports: every number against a hand computation on a small table; the PNG and its Pareto frontier."""

from __future__ import annotations

import json

import pytest
from matplotlib.image import imread

from evals.outcomes import Outcome, OutcomeTable
from evals.plot import FRONTIER_LABEL, pareto_frontier, quality_cost_figure
from evals.report import Report


def _tables() -> list[OutcomeTable]:
    a = [Outcome(f"p{i + 1}", "s", "q", "A", score, cost, tokens, None, latency)
         for i, (score, cost, tokens, latency) in enumerate([(1, 0.01, 10, 1.0), (0, 0.02, 20, 2.0), (1, 0.03, None, 3.0),
                                                             (1, 0.04, 30, 4.0)])]
    b = [Outcome("p1", "s", "q", "B", 0.5), Outcome("p2", "s", "q", "B", 0.25)]
    c = [Outcome("p1", "s", "q", "C", 0.5, 0.03), Outcome("p2", "s", "q", "C", 0.5, 0.03)]
    return [OutcomeTable(a + b), OutcomeTable(c)]


# By hand. A: 3/4 correct, Wilson(3, 4): denominator 1 + 3.8416/4 = 1.9604, centre (0.75 + 0.4802)/1.9604 = 0.627525,
# half 1.96 sqrt(0.046875 + 0.060025)/1.9604 = 0.326889; cost 0.10 USD -> 25 USD per 1,000; latency p50 2.5 s,
# p95 3 + 0.85 * (4 - 3) = 3.85 s (linear interpolation at rank 0.95 * 3); prompt tokens 10 + 20 + 30.
# B: mean 0.375, free; a bootstrap mean of {0.5, 0.25} is 0.25, 0.375 or 0.5, so its 95% interval is [0.25, 0.5].
# C: 0.5 at 30 USD per 1,000, dominated by A (better and cheaper). Frontier: B, then A.
EXPECTED = [
    {"name": "A", "n": 4, "score": 0.75, "ci_low": 0.300636, "ci_high": 0.954414, "cost_usd": 0.10, "cost_per_1k_usd": 25.0,
     "latency_p50_s": 2.5, "latency_p95_s": 3.85, "prompt_tokens": 60, "completion_tokens": None, "suite": "s"},
    {"name": "C", "n": 2, "score": 0.5, "ci_low": 0.5, "ci_high": 0.5, "cost_usd": 0.06, "cost_per_1k_usd": 30.0,
     "latency_p50_s": None, "latency_p95_s": None, "prompt_tokens": None, "completion_tokens": None, "suite": "s"},
    {"name": "B", "n": 2, "score": 0.375, "ci_low": 0.25, "ci_high": 0.5, "cost_usd": 0.0, "cost_per_1k_usd": 0.0,
     "latency_p50_s": None, "latency_p95_s": None, "prompt_tokens": None, "completion_tokens": None, "suite": "s"},
]


def test_summaries_and_json_equal_the_hand_computation():
    report = Report.from_tables(_tables(), title="Small")
    data = report.to_dict()
    assert data["title"] == "Small" and data["pareto_frontier"] == ["B", "A"] and data["suites"] == ["s"]
    assert [s["name"] for s in data["summaries"]] == ["A", "C", "B"]  # best score first
    for got, want in zip(data["summaries"], EXPECTED):
        assert got.keys() == want.keys()
        for key, value in want.items():
            assert got[key] == (value if value is None or isinstance(value, str) else pytest.approx(value, abs=1e-6)), key


def test_markdown_table_equals_the_hand_computation():
    lines = Report.from_tables(_tables(), title="Small").to_markdown(image="report.png").splitlines()
    assert lines[0] == "# Small"
    assert lines[2] == ("| model | n | score | 95% CI | cost (USD) | cost / 1k queries (USD) | latency p50 (s) | "
                        "latency p95 (s) | prompt tokens | completion tokens |")
    assert lines[4:7] == [
        "| A | 4 | 0.750 | [0.301, 0.954] | 0.1 | 25.00 | 2.50 | 3.85 | 60 | - |",
        "| C | 2 | 0.500 | [0.500, 0.500] | 0.06 | 30.00 | - | - | - | - |",
        "| B | 2 | 0.375 | [0.250, 0.500] | 0 | 0 | - | - | - | - |",
    ]
    assert "cheapest first: B, A." in lines[8]
    assert lines[-1] == "![score vs cost per 1,000 queries](report.png)"


def test_markdown_costs_below_a_cent_keep_four_significant_digits():
    # Three calls at $0.00001: $0.00003 in all, 1000 * 0.00003 / 3 = $0.01 per 1,000 queries ("0.0000" hid both);
    # one call at $0.000012345, stored as 1.2344999...e-05: four significant digits round it down (its cost per
    # 1,000, 1000 times that double, lands on the other side of the tie and is not checked).
    table = OutcomeTable([*(Outcome(f"p{i}", "s", "q", "tiny", 1.0, 0.00001) for i in range(3)),
                          Outcome("p0", "s", "q", "odd", 1.0, 0.000012345)])
    rows = {line.split(" | ")[0][2:]: line.split(" | ")[4:6]
            for line in Report.from_tables([table]).to_markdown().splitlines()[4:6]}
    assert rows["tiny"] == ["0.00003", "0.01"] and rows["odd"][0] == "0.00001234"


def test_write_produces_markdown_json_and_a_valid_png(tmp_path):
    report = Report.from_tables(_tables(), title="Small")
    paths = report.write(tmp_path / "out")
    assert {k: p.name for k, p in paths.items()} == {"markdown": "report.md", "json": "report.json", "png": "report.png"}
    assert paths["markdown"].read_text() == report.to_markdown(image="report.png")
    assert json.loads(paths["json"].read_text()) == json.loads(json.dumps(report.to_dict()))
    png = paths["png"].read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR"
    pixels = imread(paths["png"])
    assert pixels.ndim == 3 and pixels.shape[0] > 200 and pixels.shape[1] > 200
    assert pixels.std() > 0  # something was drawn


def test_figure_draws_the_frontier_as_a_step_line_and_keeps_free_models():
    fig = quality_cost_figure(["A", "C", "B"], [25.0, 30.0, 0.0], [0.75, 0.5, 0.375])
    ax = fig.axes[0]
    frontier = [line for line in ax.get_lines() if line.get_label() == FRONTIER_LABEL]
    assert len(frontier) == 1
    # through B and A, then level to the largest cost (C's): the best score reachable at each budget
    assert list(frontier[0].get_xdata()) == [0.0, 25.0, 30.0] and list(frontier[0].get_ydata()) == [0.375, 0.75, 0.75]
    assert frontier[0].get_drawstyle() == "steps-post"
    assert ax.get_xscale() == "symlog"  # B costs 0: a log axis would drop it
    assert sorted(t.get_text() for t in ax.texts) == ["A", "B", "C"]
    paid = quality_cost_figure(["A", "C"], [25.0, 30.0], [0.75, 0.5]).axes[0]
    assert paid.get_xscale() == "log"


def test_pareto_frontier():
    assert pareto_frontier([1, 1, 2, 0, 3], [0.5, 0.6, 0.6, 0.1, 0.9]) == [3, 1, 4]
    assert pareto_frontier([1, 1], [0.5, 0.5]) == [0]
    assert pareto_frontier([], []) == []


def test_from_tables_refuses_duplicates_and_empty_input():
    a = OutcomeTable([Outcome("p1", "s", "q", "A", 1.0)])
    with pytest.raises(ValueError, match="duplicate"):
        Report.from_tables([a, a])
    with pytest.raises(ValueError, match="no outcomes"):
        Report.from_tables([])


def test_runs_of_different_suites_keep_a_row_per_suite_and_model(tmp_path):
    gsm8k = OutcomeTable([Outcome("gsm8k/1", "gsm8k", "q", "m", 1.0, 0.01), Outcome("gsm8k/2", "gsm8k", "q", "m", 1.0, 0.01)])
    mmlu = OutcomeTable([Outcome("mmlu/1", "mmlu", "q", "m", 0.0), Outcome("mmlu/1", "mmlu", "q", "free", 1.0)])
    report = Report.from_tables([gsm8k, mmlu])
    assert [(s.suite, s.name, s.n, s.score) for s in report.summaries] == [
        ("gsm8k", "m", 2, 1.0), ("mmlu", "free", 1, 1.0), ("mmlu", "m", 1, 0.0)]
    lines = report.to_markdown().splitlines()
    assert lines[2].startswith("| suite | model | n |") and lines[4].startswith("| gsm8k | m | 2 | 1.000 |")
    assert report.frontier == ["m (gsm8k)", "free (mmlu)"]  # one frontier per suite
    texts = sorted(t.get_text() for t in quality_cost_figure(
        [report.label(s) for s in report.summaries], [s.cost_per_1k_usd for s in report.summaries],
        [s.score for s in report.summaries], groups=[s.suite for s in report.summaries]).axes[0].texts)
    assert texts == ["free (mmlu)", "m (gsm8k)", "m (mmlu)"]
    # Two tables of one suite still merge into one row per model; a mixed table is one group.
    halves = Report.from_tables([OutcomeTable(list(gsm8k)[:1]), OutcomeTable(list(gsm8k)[1:])])
    assert [(s.suite, s.n) for s in halves.summaries] == [("gsm8k", 2)] and "suite |" not in halves.to_markdown()
    assert Report.from_tables([OutcomeTable([*gsm8k, *mmlu])]).suites == ["mixed"]


def test_the_cost_axis_never_goes_below_zero():
    single = quality_cost_figure(["free"], [0.0], [1.0], ci=[(0.61, 1.0 - 1e-16)]).axes[0]  # a CI a hair off is drawn
    assert single.get_xlim()[0] == 0.0
    mixed = quality_cost_figure(["free", "paid"], [0.0, 2.0], [0.5, 0.7]).axes[0]
    assert mixed.get_xlim()[0] == 0.0 and mixed.get_xscale() == "symlog"
    # all paid: a log axis with room on both sides, so the dearest point and its label stay inside
    paid = quality_cost_figure(["a", "b"], [0.01, 0.04], [0.2, 0.3]).axes[0]
    left, right = paid.get_xlim()
    assert paid.get_xscale() == "log" and left == pytest.approx(0.01 / 1.3) and right == pytest.approx(0.04 * 1.8)
    # labels in cost order alternate above and below their points
    crowd = quality_cost_figure(["a", "b", "c"], [0.0, 0.0, 0.0], [0.5, 0.51, 0.52]).axes[0]
    assert [t.get_va() for t in sorted(crowd.texts, key=lambda t: t.get_text())] == ["bottom", "top", "bottom"]
