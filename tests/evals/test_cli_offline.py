"""`link eval replay` and `link eval report` through the real CLI app (typer's CliRunner)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cli.app import app
from evals.outcomes import Outcome, OutcomeTable
from tests.evals import routerbench_csv as ref

runner = CliRunner()


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    """Runs, reports and the database live under tmp_path."""
    monkeypatch.setenv("LINK_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("LINK_DATABASE_URL", f"sqlite:///{tmp_path / 'link.db'}")


def _ok(args: list[str]):
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return result


def test_replay_a_model_reproduces_its_recorded_accuracy_and_cost(data_dir):
    result = _ok(["eval", "replay", "routerbench:test", "--policy", "claude-v1", "--data-dir", str(data_dir), "--json"])
    data = json.loads(result.stdout)
    n, accuracy, cost = ref.accuracy_and_cost(ref.read(data_dir, "test"), "claude-v1")
    assert data["policy"] == "claude-v1 (policy)" and data["num_prompts"] == n
    assert data["mean_score"] == pytest.approx(accuracy, abs=1e-12)
    assert data["total_cost_usd"] == pytest.approx(cost, rel=1e-12)
    assert data["pick_share"] == {"claude-v1": 1.0}
    names = [s["name"] for s in data["report"]["summaries"]]
    assert len(names) == 13 and {"oracle", "claude-v1", "claude-v1 (policy)"} <= set(names)


def test_replay_a_users_policy_class_with_options(data_dir, tmp_path):
    options = json.dumps({"data_dir": str(data_dir)})
    result = _ok(["eval", "replay", "routerbench", "--split", "test", "--policy", "tests.evals.best_per_task:BestPerTask",
                  "--options", options, "--data-dir", str(data_dir), "--out", str(tmp_path / "out"), "--json"])
    data = json.loads(result.stdout)
    n, accuracy, cost = ref.best_per_task_expected(data_dir)
    assert (data["policy"], data["num_prompts"], data["num_skipped"]) == ("BestPerTask", n, 0)
    assert data["mean_score"] == pytest.approx(accuracy, abs=1e-12)
    assert data["total_cost_usd"] == pytest.approx(cost, rel=1e-12)
    routed = OutcomeTable.read(tmp_path / "out" / "outcomes.jsonl")
    assert routed.models == ("BestPerTask",) and len(routed) == n
    assert all((tmp_path / "out" / name).is_file() for name in ("report.md", "report.json", "report.png"))


def test_replay_prints_a_table_with_the_policy_the_oracle_and_the_models(tmp_path):
    table = OutcomeTable([Outcome("p1", "s", "q1", "big", 1.0, 0.03), Outcome("p1", "s", "q1", "small", 0.0, 0.001),
                          Outcome("p2", "s", "q2", "big", 1.0, 0.02), Outcome("p2", "s", "q2", "small", 1.0, 0.001)])
    path = table.write(tmp_path / "outcomes.csv")
    result = _ok(["eval", "replay", str(path), "--policy", "cheap", "--policy-type", "fallback", "--models", "small,big"])
    lines = [line for line in result.stdout.splitlines() if line.startswith("│")]  # the table's body rows
    row = {name: next(line for line in lines if f" {name} " in line) for name in ("cheap", "oracle", "big", "small")}
    assert "policy" in row["cheap"] and "0.500" in row["cheap"] and "$0.002 " in row["cheap"]  # small answered both
    assert "oracle" in row["oracle"] and "1.000" in row["oracle"] and "$0.031 " in row["oracle"]  # big on p1, small on p2
    assert "picks: small 100.0%" in result.stdout


@pytest.mark.parametrize("args, message", [
    (["eval", "replay", "routerbench:test:x", "--policy", "claude-v1"], "RouterBench has no split"),
    (["eval", "replay", "nowhere", "--policy", "claude-v1"], "neither an outcome file"),
    (["eval", "replay", "routerbench:test", "--policy", "gpt-5"], "unknown policy 'gpt-5'"),
    (["eval", "replay", "routerbench:test", "--policy", "fixed:claude-v1,claude-v2"], "exactly one"),
    (["eval", "replay", "routerbench:test", "--policy", "x", "--policy-type", "fallback", "--models", "claude-v1,nope"],
     "unknown model"),
    (["eval", "replay", "routerbench:test", "--policy", "claude-v1", "--options", "{bad"],
     "--options is not valid JSON: Expecting property name"),
    (["eval", "replay", "routerbench:test", "--policy", "claude-v1", "--options", "[1]"], "JSON object"),
    (["eval", "report", "no-such-run"], "no eval run 'no-such-run'"),
    (["eval", "report", "missing.jsonl"], "no outcome file"),
])
def test_errors_are_one_clean_line(data_dir, args, message):
    result = runner.invoke(app, [*args, "--data-dir", str(data_dir)])
    assert result.exit_code == 2, result.output
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: ")
    assert message in result.stderr
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def _small_outcomes(tmp_path):
    rows = [Outcome("p1", "s", "q", "m", 1.0, 0.002, latency_s=0.5), Outcome("p2", "s", "q", "m", 0.0, 0.004, latency_s=1.5)]
    return OutcomeTable(rows).write(tmp_path / "small.jsonl")


def test_report_from_a_file_without_saving(tmp_path):
    path = _small_outcomes(tmp_path)
    result = _ok(["eval", "report", str(path), "--out", str(tmp_path / "rep"), "--title", "Tiny", "--no-save"])
    # n = 2, 1 of 2 correct (Wilson(1, 2) = [0.095, 0.905]), 0.006 USD = 3 USD per 1,000, latency p50 1.0 s, p95 1.45 s
    assert "| m | 2 | 0.500 | [0.095, 0.905] | 0.006 | 3.00 | 1.00 | 1.45 | - | - |" in result.stdout
    assert (tmp_path / "rep" / "report.png").is_file() and "stored as report" not in result.stdout


def test_report_of_run_ids_is_stored_in_the_database(tmp_path):
    store_module = pytest.importorskip("evals.cache")
    store = store_module.EvalStore(f"sqlite:///{tmp_path / 'link.db'}")
    store.save_run({"id": "run-a", "suite": "gsm8k", "status": "finished", "outcomes_path": str(_small_outcomes(tmp_path))})
    folder = tmp_path / "home" / "evals" / "run-b"  # a run known only by its folder
    OutcomeTable([Outcome("p1", "s", "q", "other", 1.0)]).write(folder / "outcomes.jsonl")
    result = _ok(["eval", "report", "run-a", "run-b", "--out", str(tmp_path / "rep"), "--title", "Runs", "--json"])
    data = json.loads(result.stdout)
    assert [s["name"] for s in data["summaries"]] == ["other", "m"]
    stored = store.get_report(data["report_id"])
    assert stored["title"] == "Runs" and stored["run_ids"] == ["run-a", "run-b"]
    assert stored["markdown"].startswith("# Runs") and stored["png"][:8] == b"\x89PNG\r\n\x1a\n"
    assert stored["data"]["pareto_frontier"] == data["pareto_frontier"]


def test_report_of_runs_of_different_suites_keeps_them_apart(tmp_path):
    for run_id, suite, score in (("run-g", "gsm8k", 1.0), ("run-m", "mmlu", 0.0)):
        folder = tmp_path / "home" / "evals" / run_id
        OutcomeTable([Outcome(f"{suite}/1", suite, "q", "m", score)]).write(folder / "outcomes.jsonl")
    result = _ok(["eval", "report", "run-g", "run-m", "--out", str(tmp_path / "rep"), "--no-save"])
    lines = result.stdout.splitlines()
    assert lines[0] == "# gsm8k, mmlu: run-g, run-m"  # default title: the suites and the runs
    assert "| gsm8k | m | 1 | 1.000 |" in result.stdout and "| mmlu | m | 1 | 0.000 |" in result.stdout
