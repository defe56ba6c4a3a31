"""`link compile tune|status` (cli/compile.py) on a temporary winner table: tuning the recorded
shapes of the real SmolLM2 (one small rms_norm bucket, so nothing compiles), status as a table and as
JSON, bad input as one line and exit 2; and the kernel metrics collector."""

from __future__ import annotations

import json
import re

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


@pytest.mark.slow
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


@pytest.mark.slow
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


def _status_row(op: str, bucket: str, dtype: str, variant: str, status: str, median_ms: float, baseline_ms: float,
                calls: int) -> dict:
    return {"model": MODEL, "device": "cpu", "torch": torch.__version__, "triton": None, "current": True, "op": op,
            "bucket": bucket, "dtype": dtype, "variant": variant, "status": status, "median_ms": median_ms,
            "baseline_ms": baseline_ms, "speedup": baseline_ms / median_ms, "calls": calls, "message": "",
            "tuned_at": "2026-01-01T00:00:00"}


STATUS_ROWS = [
    _status_row("paged_attention", "16x9x64,1024x16x3x64", "float32", "cpu.bmm_paged_attention", "winner", 0.125, 0.5, 123456),
    _status_row("linear", "16x576,960x576", "bfloat16", "compiled.max-autotune-no-cudagraphs", "rejected", 1.5, 1.2, 420)]
CONFIG_ROWS = [{"model": MODEL, "mix": "serving-default", "num_requests": 64, "config": {"max_num_seqs": 16},
                "label": "max_num_seqs=16, prefill_chunk=256, speculative=ngram k=4", "default_tokens_per_s": 100.0,
                "tokens_per_s": 250.0, "default_ttft_p99_s": 0.5, "ttft_p99_s": 0.4, "speedup": 2.5}]


def _header_cells(output: str, first: str) -> list[str]:
    line = next(line for line in output.splitlines() if line.strip().startswith(first + " "))
    return re.split(r"\s{2,}", line.strip())


def test_status_reads_whole_at_80_columns_and_wide_shows_every_column(monkeypatch):
    import benchmarks.config_tuning as config_tuning
    import benchmarks.kernel_tuning as kernel_tuning

    monkeypatch.setattr(kernel_tuning, "status_rows", lambda model=None: STATUS_ROWS)
    monkeypatch.setattr(config_tuning, "config_rows", lambda model=None: CONFIG_ROWS)
    narrow = CliRunner().invoke(app, ["compile", "status"], env={"COLUMNS": "80"})
    assert narrow.exit_code == 0, narrow.output
    assert "…" not in narrow.output and max(len(line.rstrip()) for line in narrow.output.splitlines()) <= 80
    assert f"Kernel winners of {MODEL}" in narrow.output
    assert _header_cells(narrow.output, "op") == ["op", "bucket", "dtype", "variant", "status", "speedup"]
    assert _header_cells(narrow.output, "mix") == ["mix", "configuration", "tok/s", "TTFT p99", "speedup"]
    assert "4.00x" in narrow.output and "0.80x" in narrow.output  # 0.5 / 0.125 and 1.2 / 1.5

    wide = CliRunner().invoke(app, ["compile", "status", "--wide"], env={"COLUMNS": "80"})
    assert wide.exit_code == 0, wide.output
    assert "…" not in wide.output
    assert _header_cells(wide.output, "op") == ["op", "bucket", "dtype", "variant", "status", "ms", "default ms",
                                                "speedup", "calls"]
    assert _header_cells(wide.output, "mix") == ["mix", "requests", "configuration", "default tok/s", "tok/s",
                                                 "default TTFT", "TTFT p99", "speedup"]
    row = next(line for line in wide.output.splitlines() if "cpu.bmm_paged_attention" in line)  # one line per row
    assert re.split(r"\s{2,}", row.strip()) == ["paged_attention", "16x9x64,1024x16x3x64", "float32",
                                                "cpu.bmm_paged_attention", "winner", "0.125", "0.500", "4.00x", "123456"]
