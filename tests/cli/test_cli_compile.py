"""`link compile tune|status` (cli/compile.py) on a temporary winner table: tuning the recorded
shapes of the real SmolLM2 (one small rms_norm bucket, so nothing compiles), status as a table and as
JSON, bad input as one line and exit 2; and the kernel metrics collector."""

from __future__ import annotations

import json

import pytest
import torch
from prometheus_client import CollectorRegistry, generate_latest
from typer.testing import CliRunner

import kernels
from cli.app import app
from kernels.metrics import KernelCollector
from kernels.recorder import Bucket
from kernels.variants import Variant
from kernels.winners import Environment, Result, WinnerTable

MODEL = "smollm2-135m-instruct"
BUCKET = Bucket("rms_norm", ((2, 576),), "float32")


@pytest.fixture
def table(tmp_path, monkeypatch):
    monkeypatch.setenv("LINK_COMPILE_DB", str(tmp_path / "winners.sqlite"))
    kernels.reset()
    yield WinnerTable()
    kernels.reset()


def test_tune_recorded_then_status(table, monkeypatch):
    import kernels.tuner as tuner_module

    exact = Variant("rms_norm", "copy-of-reference", lambda x, w, eps, *, offset=0.0: kernels.ref.ref_rms_norm(x, w, eps, offset=offset))
    monkeypatch.setattr(tuner_module, "variants", lambda op: [exact] if op == "rms_norm" else [])
    table.add_counts(MODEL, {BUCKET: 420})
    result = CliRunner().invoke(app, ["compile", "tune", "--workload", "recorded", "--budget-s", "30"])
    assert result.exit_code == 0, result.output
    assert "1 tuned" in result.output
    rows = {r.variant: r for r in table.results(Environment.current(MODEL))}
    assert set(rows) >= {"copy-of-reference"} and rows["copy-of-reference"].median_ms > 0
    status = CliRunner().invoke(app, ["compile", "status", "--json"])
    assert status.exit_code == 0, status.output
    listed = json.loads(status.output)
    assert {(r["op"], r["bucket"], r["model"], r["current"]) for r in listed} == {("rms_norm", "2x576", MODEL, True)}
    assert "Kernel winners" in CliRunner().invoke(app, ["compile", "status"]).output


def test_tune_refuses_an_unknown_workload_and_missing_counts(table):
    bad = CliRunner().invoke(app, ["compile", "tune", "--workload", "nonsense"])
    assert bad.exit_code == 2 and "unknown workload" in bad.output
    empty = CliRunner().invoke(app, ["compile", "tune", "--workload", "recorded"])
    assert empty.exit_code == 2 and "no recorded shapes" in empty.output
    for levels in ("0,16", "", "4,x"):
        wrong = CliRunner().invoke(app, ["compile", "tune", "--concurrency", levels])
        assert wrong.exit_code == 2 and "--concurrency" in wrong.output and "Traceback" not in wrong.output, wrong.output
    few = CliRunner().invoke(app, ["compile", "tune", "--concurrency", "1,16", "--num-prompts", "10"])
    assert few.exit_code == 2 and "too few" in few.output and "18" in few.output, few.output   # 2 + 16


def test_metrics_show_recorded_calls_and_winner_speedups(table):
    env = Environment.current("")
    table.put(env, Result(BUCKET, "fast", "winner", median_ms=1.0, baseline_ms=2.5))
    recorder = kernels.ShapeRecorder()
    previous = kernels.attach_recorder(recorder)
    try:
        for _ in range(3):
            kernels.dispatch("rms_norm", torch.randn(2, 576), torch.ones(576), 1e-5)
        kernels.install(BUCKET, "fast", kernels.registered("rms_norm"))
        kernels.apply_pending()
        registry = CollectorRegistry()
        registry.register(KernelCollector())
        text = generate_latest(registry).decode()
    finally:
        kernels.attach_recorder(previous)
    assert 'link_kernel_calls_total{bucket="2x576",dtype="float32",model="",op="rms_norm"} 3.0' in text
    assert 'link_kernel_winner_speedup{bucket="2x576",dtype="float32",op="rms_norm",variant="fast"} 2.5' in text


def test_tuner_speedup_property():
    assert Result(BUCKET, "v", "winner", median_ms=2.0, baseline_ms=3.0).speedup == 1.5
    assert Result(BUCKET, "v", "rejected").speedup is None
