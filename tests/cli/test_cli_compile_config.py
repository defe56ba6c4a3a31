"""`link compile tune-config` and the configuration rows of `link compile status` (cli/compile.py)
on a temporary winner table, replaying a tiny mix with the real SmolLM2; and `apply_winner`."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cli.app import app
from kernels.config_winners import ConfigWinner, ConfigWinnerTable
from kernels.winners import Environment
from serving.tuning.traffic import RequestShape, mix_fingerprint, save_mix

MODEL = "smollm2-135m-instruct"


@pytest.fixture
def table(tmp_path, monkeypatch):
    monkeypatch.setenv("LINK_COMPILE_DB", str(tmp_path / "winners.sqlite"))
    return ConfigWinnerTable()


@pytest.mark.slow
def test_tune_config_replays_the_mix_and_status_shows_the_winner(table, tmp_path):
    mix = [RequestShape(24, 3, 0.0), RequestShape(16, 3, 0.0), RequestShape(40, 2, 0.1)]
    path = save_mix(mix, tmp_path / "mix.jsonl")
    result = CliRunner().invoke(app, ["compile", "tune-config", "--mix", str(path), "--budget", "2", "--confirm", "0",
                                      "--speedup", "2", "--no-speculation", "--repeats", "1"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())  # Rich wraps long lines
    assert "default" in text and "tuned" in text and "2 replays" in text
    row = table.get(Environment.current(MODEL), mix_fingerprint(mix))
    assert row is not None and row.num_requests == 3 and row.num_trials == 2 and row.default_tokens_per_s > 0
    # a budget of 2: the default and max_num_batched_tokens=128, the first candidate
    assert row.config in ({}, {"max_num_batched_tokens": 128})
    listed = json.loads(CliRunner().invoke(app, ["compile", "status", "--json", "--configs"]).output)
    assert [(r["model"], r["fingerprint"], r["num_requests"], r["current"]) for r in listed] == [(MODEL, row.fingerprint, 3, True)]
    shown = CliRunner().invoke(app, ["compile", "status"])
    assert shown.exit_code == 0 and "Engine configuration winners" in shown.output


def test_tune_config_refuses_a_bad_mix(table, tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"prompt_tokens": 0, "output_tokens": 1}\n')
    bad = CliRunner().invoke(app, ["compile", "tune-config", "--mix", str(tmp_path / "bad.jsonl")])
    assert bad.exit_code == 2 and "not a request shape" in " ".join(bad.output.split())  # Rich wraps long lines
    missing = CliRunner().invoke(app, ["compile", "tune-config", "--mix", str(tmp_path / "none.jsonl")])
    assert missing.exit_code == 2


@pytest.mark.slow
def test_apply_winner_reconfigures_an_engine_with_the_stored_config(table, smollm2_fp32):
    from benchmarks.config_tuning import apply_winner, stored_config
    from serving.engine.llm_engine import EngineConfig, LLMEngine

    mix = [RequestShape(50, 8, 0.0)] * 4
    assert stored_config(MODEL, mix, table=table) is None
    table.put(Environment.current(MODEL), ConfigWinner(mix_fingerprint(mix), "sig", 4, {"max_num_seqs": 2, "block_size": 32},
                                                       10.0, 1.0, 12.0, 0.9))
    engine = LLMEngine(smollm2_fp32, EngineConfig(tuned_kernels=False))
    assert apply_winner(engine, MODEL, mix, table=table)
    assert engine.config == EngineConfig(tuned_kernels=False, max_num_seqs=2, block_size=32)
    assert not apply_winner(engine, MODEL, mix, table=table)  # already running it
    assert not apply_winner(engine, MODEL, [RequestShape(3000, 500, 0.0)], table=table)  # never tuned
