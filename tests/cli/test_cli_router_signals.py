"""`link router train-checker --signals` and `link router eval --answer-check --answer-signals`: checkers and cascades
that read the signals `link eval run --signals` records (routers/signals.py), on outcome files written here whose
answers only the signals can tell apart.

    .venv/bin/python -m pytest -q tests/cli/test_cli_router_signals.py
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from cli.app import app
from evals.outcomes import Outcome, OutcomeTable

runner = CliRunner()


def test_train_checker_reads_recorded_signals(tmp_path):
    from routers.answer_check import load_answer_checker
    from routers.signals import answer_signals

    rng = np.random.default_rng(0)
    rows, text = [], "It is 42.\n#### 42"
    for i, mean in enumerate(rng.uniform(-2.0, 0.0, 200)):
        signals = answer_signals(text, [float(mean)] * 6, [{"It": float(mean)}] * 6)
        rows.append(Outcome(f"q{i}", "toy", f"What is {i} x 7?", "cheap", float(mean > -1.0), 0.0, response=text,
                            signals=signals))
    data = OutcomeTable(rows).write(tmp_path / "outcomes.jsonl")
    out = tmp_path / "checker.safetensors"
    args = ["router", "train-checker", "--data", str(data), "--model", "cheap", "--out", str(out), "--components", "0"]
    result = runner.invoke(app, [*args, "--signals", "confidence,checks"])
    assert result.exit_code == 0, result.output
    checker = load_answer_checker(out)
    assert checker.signal_families == ("confidence", "checks")
    sure, unsure = (answer_signals(text, [m] * 6, [{"It": m}] * 6) for m in (-0.3, -1.7))
    p = checker.predict(["What is 3 x 7?"] * 2, [text] * 2, [sure, unsure])
    assert p[0] > 0.5 > p[1]
    result = runner.invoke(app, [*args, "--signals", "vibes"])
    assert result.exit_code == 2 and "unknown signal families ['vibes']" in result.output
    plain = OutcomeTable([Outcome(r.prompt_id, r.suite, r.prompt, r.model, r.score, 0.0, response=text) for r in rows])
    result = runner.invoke(app, ["router", "train-checker", "--data", str(plain.write(tmp_path / "plain.jsonl")),
                                 "--model", "cheap", "--out", str(out), "--components", "0", "--signals", "confidence"])
    assert result.exit_code == 2 and "records none for 'cheap'" in result.output


def test_router_eval_replays_a_cascade_whose_checker_reads_the_signals(tmp_path):
    """Identical weak answers, right exactly when the weak model was confident: only the signals can tell them
    apart, so the signal-reading cascade escalates the right prompts; agreement charges the extra samples."""
    from routers.signals import answer_signals

    rng = np.random.default_rng(1)
    rows, text = [], "It is 42.\n#### 42"
    for i, mean in enumerate(rng.uniform(-2.0, 0.0, 300)):
        signals = {**answer_signals(text, [float(mean)] * 6, [{"It": float(mean)}] * 6), "samples_cost_usd": 0.5}
        rows += [Outcome(f"q{i}", "toy", f"Problem number {i}: what is {i} x 7?", "weak", float(mean > -1.0), 1.0,
                         response=text, signals=signals),
                 Outcome(f"q{i}", "toy", f"Problem number {i}: what is {i} x 7?", "strong", 1.0, 10.0, response="42")]
    data = str(OutcomeTable(rows).write(tmp_path / "outcomes.jsonl"))

    def cascade_answer(*extra):
        out = tmp_path / "report.json"
        result = runner.invoke(app, ["router", "eval", "--train", data, "--type", "knn", "--answer-check",
                                     "--cascade-models", "weak,strong", "--json", str(out), *extra])
        assert result.exit_code == 0, result.output
        return json.loads(out.read_text())["kfold"]

    blind, reading = cascade_answer(), cascade_answer("--answer-signals", "confidence")
    oracle = reading["summary"]["cascade:oracle"]["apgr"]["mean"]   # a cascade pays the weak step on every prompt
    assert reading["summary"]["cascade:answer"]["apgr"]["mean"] == pytest.approx(oracle, abs=0.01)
    assert blind["summary"]["cascade:answer"]["apgr"]["mean"] < oracle - 0.15
    charged = cascade_answer("--answer-signals", "confidence,agreement")
    for fold in charged["folds"]:                   # every prompt pays the weak answer and its samples: 1 + 0.5
        assert min(fold["routers"]["cascade:answer"]["curve"]["cost_usd"]) == pytest.approx(1.5)
        assert min(fold["routers"]["cascade:oracle"]["curve"]["cost_usd"]) == pytest.approx(1.0)
    result = runner.invoke(app, ["router", "eval", "--train", data, "--answer-signals", "confidence"])
    assert result.exit_code == 2 and "add --answer-check" in result.output
