"""`link eval run` through typer's CliRunner on `link.cli.app`, against the mock OpenAI server (no real model).

    LINK_DATASETS_DIR=../shared/data .venv/bin/python -m pytest -q tests/evals/test_cli_run.py
"""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from evals.cache import EvalStore
from evals.outcomes import OutcomeTable
from link.cli import app
from tests.link.gateway_launch import mock_deployment
from tests.link.mock_openai import start_mock_thread

runner = CliRunner()


@pytest.fixture(scope="module")
def mock():
    with start_mock_thread(mode="ok") as server:
        yield server


@pytest.fixture
def config_file(tmp_path, mock):
    path = tmp_path / "link.yaml"
    path.write_text(yaml.safe_dump({"models": [mock_deployment("mock", mock.api_base), mock_deployment("mock-b", mock.api_base)],
                                    "policies": [{"name": "fb", "type": "fallback", "models": ["mock", "mock-b"]}]}))
    return path


def _invoke(*args):
    return runner.invoke(app, ["eval", "run", *map(str, args)])


def _run_id(output: str) -> str:
    return output.split("run id:")[1].split()[0]


def test_run_writes_outcomes_and_resumes_from_the_cache(link_home, config_file, data_dir, mock, tmp_path):
    args = ["--suite", "gsm8k", "--limit", 3, "--seed", 7, "--target", "mock", "--target", "fb", "--config", config_file,
            "--data-dir", data_dir, "--no-progress"]
    before = mock.stats()["requests"]
    first = _invoke(*args)
    assert first.exit_code == 0, first.output
    assert "mock" in first.output and "fb" in first.output and "completed" in first.output
    assert mock.stats()["requests"] - before == 6  # 3 items x 2 targets
    run_id = _run_id(first.output)
    table = OutcomeTable.read(link_home / "evals" / run_id / "outcomes.jsonl")
    assert len(table) == 6 and table.models == ("mock", "fb")
    # The mock echoes the question: every reply starts "You said:"; costs at the config's prices.
    assert all(r.response.startswith("You said:") and r.cost_usd > 0 for r in table)
    second = _invoke(*args)
    assert second.exit_code == 0, second.output
    assert mock.stats()["requests"] - before == 6  # all answers came from the cache
    again = OutcomeTable.read(link_home / "evals" / _run_id(second.output) / "outcomes.jsonl")
    def rows(t):
        return [(r.prompt_id, r.model, r.score, r.cost_usd) for r in t]
    assert rows(again) == rows(table)
    runs = EvalStore().list_runs()
    assert {r["id"] for r in runs} >= {run_id, _run_id(second.output)} and all(r["status"] == "finished" for r in runs)


def test_base_url_and_out_dir(link_home, data_dir, mock, tmp_path):
    result = _invoke("--suite", "gsm8k", "--limit", 2, "--target", "mock-model", "--base-url", mock.api_base,
                     "--api-key", "sk-anything", "--data-dir", data_dir, "--out", tmp_path / "out", "--no-progress")
    assert result.exit_code == 0, result.output
    table = OutcomeTable.read(tmp_path / "out" / "outcomes.jsonl")
    assert len(table) == 2 and all(r.cost_usd == 0.0 for r in table)  # no cost header, no known prices
    summary = json.loads((tmp_path / "out" / "run.json").read_text())
    assert summary["totals"]["mock-model"]["n"] == 2


def test_judge_suite_through_the_cli(link_home, config_file, data_dir):
    result = _invoke("--suite", "mt-bench", "--limit", 2, "--target", "mock", "--judge", "mock", "--config", config_file,
                     "--data-dir", data_dir, "--no-progress")
    assert result.exit_code == 0, result.output
    # The mock judge only echoes, so no rating parses: each item is counted as an error, the run completes.
    grades_file = link_home / "evals" / _run_id(result.output) / "grades.jsonl"
    grades = [json.loads(line) for line in grades_file.read_text().splitlines()]
    assert len(grades) == 2 and all("no parsable rating" in g["error"] for g in grades)


def test_missing_key_fails_before_anything_runs(link_home, data_dir, mock, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    before = mock.stats()["requests"]
    result = _invoke("--suite", "gsm8k", "--limit", 2, "--target", "openai/gpt-4o", "--data-dir", data_dir)
    assert result.exit_code == 2 and "OPENAI_API_KEY" in result.output
    assert len(result.output.strip().splitlines()) == 1 and mock.stats()["requests"] == before
    assert not (link_home / "evals").exists()


@pytest.mark.parametrize("args, message", [
    (["--suite", "nope", "--target", "mock"], "unknown suite 'nope'"),
    (["--suite", "gsm8k", "--target", "zzz"], "unknown target 'zzz': the gateway serves fb, mock, mock-b"),
    (["--suite", "gsm8k", "--target", "mock", "--style", "weird"], "--style must be"),
    (["--suite", "mt-bench", "--target", "mock"], "pass --judge MODEL"),
    (["--suite", "gsm8k", "--target", "mock", "--split", "validation"], "splits"),
])
def test_clear_one_line_errors(link_home, config_file, data_dir, args, message):
    result = _invoke(*args, "--config", config_file, "--data-dir", data_dir, "--no-progress")
    assert result.exit_code == 2 and message in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1


def test_missing_data_names_the_path(link_home, config_file, tmp_path):
    result = _invoke("--suite", "gsm8k", "--target", "mock", "--config", config_file, "--data-dir", tmp_path / "empty")
    assert result.exit_code == 2 and "not found" in result.output and "gsm8k" in result.output
