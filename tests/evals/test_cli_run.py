"""`link eval run` through typer's CliRunner on `cli.app.app`, against the mock OpenAI server (no real model).

    LINK_DATASETS_DIR=../shared/data .venv/bin/python -m pytest -q tests/evals/test_cli_run.py
"""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from sqlmodel import Session

from cli.app import app
from evals.cache import EvalStore
from evals.outcomes import OutcomeTable
from link.config import parse_config
from link.db.engine import make_db_engine
from link.db.migrate import upgrade
from link.keys import create_key
from tests.link.gateway_launch import MASTER_KEY, gateway_settings, mock_deployment, start_gateway_thread
from tests.link.mock_openai import refused_url, start_mock_thread

runner = CliRunner()


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
    assert "6 of 6 answers from the cache" in second.output and "from the cache" not in first.output
    again = OutcomeTable.read(link_home / "evals" / _run_id(second.output) / "outcomes.jsonl")
    def rows(t):
        return [(r.prompt_id, r.model, r.score, r.cost_usd) for r in t]
    assert rows(again) == rows(table)
    runs = EvalStore().list_runs()
    assert {r["id"] for r in runs} >= {run_id, _run_id(second.output)} and all(r["status"] == "finished" for r in runs)


def test_shards_split_one_sample_into_disjoint_parts(link_home, config_file, data_dir, mock, tmp_path):
    args = ["--suite", "gsm8k", "--limit", 5, "--seed", 7, "--target", "mock", "--config", config_file,
            "--data-dir", data_dir, "--no-progress"]
    def ids(*extra):
        result = _invoke(*args, *extra)
        assert result.exit_code == 0, result.output
        return [r.prompt_id for r in OutcomeTable.read(link_home / "evals" / _run_id(result.output) / "outcomes.jsonl")]
    whole = ids()
    parts = [ids("--shard", f"{k}/3") for k in range(3)]
    assert [len(p) for p in parts] == [2, 2, 1]
    assert sorted(sum(parts, [])) == sorted(whole) and len(set(whole)) == 5
    assert parts[0] == [whole[0], whole[3]]  # items[K::N] of the sample, in its order


def test_items_file_runs_exactly_the_listed_ids(link_home, config_file, data_dir, mock, tmp_path):
    args = ["--suite", "gsm8k", "--seed", 7, "--target", "mock", "--config", config_file, "--data-dir", data_dir,
            "--no-progress"]
    def ids(*extra):
        result = _invoke(*args, *extra)
        assert result.exit_code == 0, result.output
        return [r.prompt_id for r in OutcomeTable.read(link_home / "evals" / _run_id(result.output) / "outcomes.jsonl")]
    sample = ids("--limit", 4)
    # A `link posttrain sft` split file: an object of id lists, one of them chosen as FILE:PART.
    split = tmp_path / "split.json"
    split.write_text(json.dumps({"seed": 0, "train": sample[:3], "val": sample[3:]}))
    assert sorted(ids("--items", f"{split}:train")) == sorted(sample[:3])
    assert ids("--items", f"{split}:val") == sample[3:]
    # A plain list of ids, one per line, with --limit sampling within it.
    listing = tmp_path / "ids.txt"
    listing.write_text("\n".join(sample) + "\n")
    within = ids("--items", listing, "--limit", 2)
    assert len(within) == 2 and set(within) <= set(sample)


@pytest.mark.parametrize("content, suffix, message", [
    ({"train": ["gsm8k/test/nope"]}, ":train", "1 ids are not items of this suite and split (e.g. gsm8k/test/nope)"),
    ({"train": [], "val": []}, "", "name the list to use as FILE:PART, one of train, val"),
    ({"train": [1, 2]}, ":train", "expected a list of item ids"),
])
def test_items_file_errors(link_home, config_file, data_dir, tmp_path, content, suffix, message):
    path = tmp_path / "split.json"
    path.write_text(json.dumps(content))
    result = _invoke("--suite", "gsm8k", "--target", "mock", "--items", f"{path}{suffix}", "--config", config_file,
                     "--data-dir", data_dir, "--no-progress")
    assert result.exit_code == 2 and message in result.output, result.output
    missing = _invoke("--suite", "gsm8k", "--target", "mock", "--items", tmp_path / "absent.json", "--config", config_file,
                      "--data-dir", data_dir, "--no-progress")
    assert missing.exit_code == 2 and "--items file not found" in missing.output, missing.output


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
    (["--suite", "gsm8k", "--target", "mock", "--limit", 0], "--limit must be >= 1, got 0"),
    (["--suite", "gsm8k", "--target", "mock", "--limit", -1], "--limit must be >= 1, got -1"),
    (["--suite", "gsm8k", "--target", "mock", "--concurrency", 0], "--concurrency must be >= 1"),
    (["--suite", "gsm8k", "--target", "mock", "--max-cost", -1], "--max-cost must be >= 0"),
    (["--suite", "gsm8k", "--target", "mock", "--order", "bogus"], "--order must be interleave or by-target"),
    (["--suite", "jsonl", "--target", "mock"], "pass --path FILE"),
    (["--suite", "gsm8k", "--target", "mock", "--shard", "4/4"], "--shard must be K/N with 0 <= K < N"),
    (["--suite", "gsm8k", "--target", "mock", "--shard", "1"], "--shard must be K/N with 0 <= K < N"),
])
def test_clear_one_line_errors(link_home, config_file, data_dir, args, message):
    result = _invoke(*args, "--config", config_file, "--data-dir", data_dir, "--no-progress")
    assert result.exit_code == 2 and message in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1


def test_missing_data_names_the_path(link_home, config_file, tmp_path):
    result = _invoke("--suite", "gsm8k", "--target", "mock", "--config", config_file, "--data-dir", tmp_path / "empty")
    assert result.exit_code == 2 and "not found" in result.output and "gsm8k" in result.output


def test_empty_jsonl_file_is_an_error(link_home, config_file, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    result = _invoke("--suite", "jsonl", "--path", empty, "--target", "mock", "--config", config_file, "--no-progress")
    assert result.exit_code == 2 and f"no rows in {empty}" in result.output.replace("\n", ""), result.output
    assert not (link_home / "evals").exists()


def test_in_process_gateway_runs_once_keys_exist(link_home, config_file, data_dir, mock, monkeypatch):
    monkeypatch.delenv("LINK_MASTER_KEY", raising=False)
    link_home.mkdir(parents=True)
    url = f"sqlite:///{link_home / 'link.db'}"
    upgrade(url)
    with Session(make_db_engine(url)) as session:
        create_key(session, "someone")  # the gateway leaves open mode: a placeholder key would get a 401
    before = mock.stats()["requests"]
    result = _invoke("--suite", "gsm8k", "--limit", 2, "--target", "mock", "--config", config_file,
                     "--data-dir", data_dir, "--no-progress")
    assert result.exit_code == 0, result.output
    assert mock.stats()["requests"] - before == 2 and "errors" in result.output
    totals = json.loads((link_home / "evals" / _run_id(result.output) / "run.json").read_text())["totals"]
    assert totals["mock"]["errors"] == 0
    stale = _invoke("--suite", "gsm8k", "--limit", 2, "--target", "mock", "--config", config_file, "--data-dir", data_dir,
                    "--api-key", "sk-link-eval-open-mode")  # what the gateway was sent before: refused now
    assert stale.exit_code == 2 and "HTTP 401" in stale.output and "drop --api-key" in stale.output, stale.output


def test_base_url_errors_name_the_url_and_the_flag(link_home, data_dir, mock, tmp_path, monkeypatch):
    monkeypatch.delenv("LINK_API_KEY", raising=False)
    refused = refused_url()
    result = _invoke("--suite", "gsm8k", "--limit", 1, "--target", "m", "--base-url", refused, "--data-dir", data_dir)
    assert result.exit_code == 2 and f"error: cannot reach {refused}: connection refused" in result.output, result.output
    config = parse_config({"models": [mock_deployment("mock", mock.api_base)]})
    settings = gateway_settings(f"sqlite:///{tmp_path / 'gw.db'}", tmp_path)  # a master key: no open mode
    gateway = start_gateway_thread(settings, config)
    try:
        args = ["--suite", "gsm8k", "--limit", 1, "--target", "mock", "--base-url", gateway.base_url,
                "--data-dir", data_dir, "--no-progress"]
        refused_key = _invoke(*args)
        assert refused_key.exit_code == 2, refused_key.output
        assert "HTTP 401" in refused_key.output and "pass --api-key KEY (or set LINK_API_KEY)" in refused_key.output
        monkeypatch.setenv("LINK_API_KEY", MASTER_KEY)
        assert _invoke(*args).exit_code == 0
    finally:
        gateway.stop()


def test_summary_table_shows_whole_target_names(link_home, mock, data_dir, tmp_path):
    name = "a-rather-long-deployment-name-for-the-summary"
    config = tmp_path / "long.yaml"
    config.write_text(yaml.safe_dump({"models": [mock_deployment(name, mock.api_base)]}))
    result = _invoke("--suite", "gsm8k", "--limit", 1, "--target", name, "--config", config, "--data-dir", data_dir,
                     "--no-progress")
    assert result.exit_code == 0 and "…" not in result.output, result.output
    row = [line for line in result.output.splitlines() if line.startswith("│")]  # the name folds, never cut
    assert "".join(line.split("│")[1].strip() for line in row) == name
    wide = runner.invoke(app, ["eval", "run", "--suite", "gsm8k", "--limit", "1", "--target", name, "--config", str(config),
                               "--data-dir", str(data_dir), "--no-progress"], env={"COLUMNS": "160"})
    assert f"│ {name} │" in wide.output, wide.output


@pytest.mark.parametrize("signum", ["SIGINT", "SIGTERM"])
def test_a_signal_interrupts_the_run_and_records_it(link_home, data_dir, tmp_path, signum):
    import os
    import signal
    import subprocess
    import sys
    import time

    with start_mock_thread(mode="hang", hang_s=600) as hanging:  # long waits: a loaded CI machine starts Python slowly
        # Python's own SIGINT handler, as in a terminal (a shell's background job would inherit SIG_IGN)
        proc = subprocess.Popen(
            [sys.executable, "-c", "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
             "from cli.app import app; sys.argv = ['link', *sys.argv[1:]]; app()",
             "eval", "run", "--suite", "gsm8k", "--limit", "2", "--target", "mock-model", "--base-url", hanging.api_base,
             "--api-key", "sk-anything", "--data-dir", str(data_dir), "--out", str(tmp_path / "out"), "--no-progress"],
            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
        deadline = time.monotonic() + 300
        while hanging.options.stats["chat"] < 1 and time.monotonic() < deadline:  # a call is in flight
            time.sleep(0.1)
        assert hanging.options.stats["chat"] >= 1, "the run made no call within 300 s"
        proc.send_signal(getattr(signal, signum))
        _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "interrupted: run the same command again to resume" in stderr and "Traceback" not in stderr
    runs = EvalStore(f"sqlite:///{link_home / 'link.db'}").list_runs()
    assert [r["status"] for r in runs] == ["interrupted"]
