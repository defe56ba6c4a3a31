"""`benchmarks.link_bench`: the serving benchmark on tiny settings (the real server, real prompts) and its CLI command."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from benchmarks.link_bench import TimedRequest, compute_ratios, load_workload, run_serving_benchmark, summarize
from cli.app import app

runner = CliRunner()


def _check_row(row: dict, max_tokens: int, num_prompts: int, min_rss_mb: float = 100) -> None:
    assert row["num_requests"] == num_prompts == len(row["requests"])
    assert all(r["num_output_tokens"] == max_tokens for r in row["requests"]), row["requests"]
    assert row["num_output_tokens"] == num_prompts * max_tokens
    assert row["output_tokens_per_s"] > 0 and row["requests_per_s"] > 0 and row["decode_tokens_per_s"] > 0
    assert 0 < row["ttft_p50_s"] <= row["ttft_p99_s"] and 0 < row["itl_p50_s"] <= row["itl_p99_s"]
    assert all(0 < r["ttft_s"] < r["latency_s"] for r in row["requests"])
    assert row["duration_s"] >= max(r["latency_s"] for r in row["requests"])
    assert row["peak_rss_mb"] > min_rss_mb  # a loaded model and its KV cache


def test_workload_mixes_both_sets_and_is_seeded(data_dir):
    texts = load_workload(data_dir, seed=0)
    assert len(texts) == 805 + 80 and all(isinstance(t, str) and t for t in texts)
    assert texts == load_workload(data_dir, seed=0) and texts != load_workload(data_dir, seed=1)
    assert "Compose an engaging travel blog post about a recent trip to Hawaii, highlighting cultural experiences and must-see attractions." in texts


def test_summary_and_ratios_on_known_timings():
    # 3 requests of 5 tokens: first token at 0.1 s, then one every 0.05 s.
    records = [TimedRequest(10, 5, 0.1, 0.05, 0.3) for _ in range(3)]
    row = summarize("link", 1, records, wall_s=0.9, peak_rss_mb=500.0)
    assert row["output_tokens_per_s"] == pytest.approx(15 / 0.9) and row["requests_per_s"] == pytest.approx(3 / 0.9)
    assert row["decode_tokens_per_s"] == pytest.approx(1 / 0.05)
    assert row["ttft_p50_s"] == row["ttft_p99_s"] == pytest.approx(0.1)
    base = summarize("transformers", 1, records, wall_s=1.8, peak_rss_mb=500.0)
    top = summarize("link", 4, records, wall_s=0.3, peak_rss_mb=500.0)
    ratios = compute_ratios([row, top, base])
    assert ratios["link c=4 tok/s / transformers c=1 tok/s"] == pytest.approx(6.0)
    assert ratios["link c=1 decode tok/s / transformers c=1 decode tok/s"] == pytest.approx(1.0)


@pytest.mark.slow
def test_link_serving_benchmark_on_tiny_settings(data_dir):
    # 3 prompts: at both levels a client sends its next prompt when its last one ends; a prefill phase of one
    # 32-token prompt (the default, 8 of 512 tokens, took most of this test's time)
    result = run_serving_benchmark("smollm2-135m-instruct", concurrencies=(1, 2), num_prompts=3, max_tokens=4,
                                   systems=("link",), data_dir=data_dir, prefill_tokens=32, num_prefill_prompts=1)
    assert result["errors"] == {} and result["skipped"] == {}
    assert [(r["system"], r["concurrency"]) for r in result["rows"]] == [("link", 1), ("link", 2)]
    for row in result["rows"]:
        _check_row(row, max_tokens=4, num_prompts=3)
    (prefill,) = result["prefill"]
    assert (prefill["system"], prefill["num_requests"], prefill["mean_prompt_tokens"]) == ("link", 1, 32)
    assert prefill["prefill_tokens_per_s"] > 0
    assert all(math.isfinite(x) for x in result["machine"]["load_average_before"] + result["machine"]["load_average_after"])
    json.dumps(result)  # JSON-ready


FAKE_LLAMA_CPP = """
import os, time

class Llama:
    def __init__(self, model_path, n_ctx, n_threads, seed, verbose):
        assert os.path.isfile(model_path) and n_ctx == 4096

    def reset(self):
        pass

    def generate(self, tokens, top_k, top_p, min_p, temp, repeat_penalty, reset):
        assert tokens and top_k == 1 and temp == 0.0 and repeat_penalty == 1.0
        time.sleep(0.01)  # prefill
        while True:
            time.sleep(0.002)
            yield 7
"""


@pytest.mark.slow
def test_llama_cpp_runs_one_request_at_a_time(data_dir, tmp_path, monkeypatch):
    # A stand-in `llama_cpp` module (the real one compiles llama.cpp on install): the plumbing, not the speed.
    (tmp_path / "llama_cpp.py").write_text(FAKE_LLAMA_CPP)
    monkeypatch.syspath_prepend(str(tmp_path))  # spawned workers inherit sys.path
    result = run_serving_benchmark(concurrencies=(1, 4), num_prompts=3, max_tokens=5, systems=("llama-cpp",), data_dir=data_dir,
                                   prefill_tokens=40, num_prefill_prompts=2)
    assert result["errors"] == {} and result["skipped"] == {}
    assert [(r["system"], r["concurrency"]) for r in result["rows"]] == [("llama-cpp", 1)]
    _check_row(result["rows"][0], max_tokens=5, num_prompts=3, min_rss_mb=1)
    assert result["rows"][0]["ttft_p50_s"] >= 0.01 and result["rows"][0]["itl_p50_s"] >= 0.002
    # the fake has no perf counters: prefill falls back to the TTFT, at most 40 tokens / 10 ms of fake prefill
    (prefill,) = result["prefill"]
    assert prefill["num_requests"] == 2 and prefill["mean_prompt_tokens"] == 40 and prefill["timer"] == "ttft"
    assert 0 < prefill["prefill_tokens_per_s"] <= 40 / 0.01
    assert result["memory"]["llama-cpp"]["n_ctx"] == 4096 and result["memory"]["llama-cpp"]["peak_rss_mb"] > 1
    assert result["comparison"] == []  # no link beside it


@pytest.mark.slow
def test_link_and_llama_cpp_interleave_on_a_fresh_home(data_dir, tmp_path, monkeypatch):
    """The comparison in one run: a fresh LINK_HOME, warm-up traffic, decode levels, prefill, memory and ratios."""
    (tmp_path / "llama_cpp.py").write_text(FAKE_LLAMA_CPP)
    monkeypatch.syspath_prepend(str(tmp_path))
    result = run_serving_benchmark(concurrencies=(1, 2), num_prompts=2, max_tokens=4, systems=("link", "llama-cpp"), data_dir=data_dir,
                                   prefill_tokens=64, num_prefill_prompts=2, fresh=True, warmup_s=1)
    assert result["errors"] == {} and result["skipped"] == {}
    assert [(r["system"], r["concurrency"]) for r in result["rows"]] == [("link", 1), ("llama-cpp", 1), ("link", 2)]
    for row in result["rows"]:
        _check_row(row, max_tokens=4, num_prompts=2, min_rss_mb=1)
    assert [w["concurrency"] for w in result["warmup"]] == [1, 2] and all(w["num_requests"] >= 1 for w in result["warmup"])
    assert [(p["system"], p["num_requests"], p["mean_prompt_tokens"]) for p in result["prefill"]] == [("link", 2, 64), ("llama-cpp", 2, 64)]
    link_memory = result["memory"]["link"]
    # SmolLM2-135M's GGUF kept as its blocks (96,576,768 bytes of tensors), or dequantized to float32
    assert link_memory["resident_weight_bytes"] in (96_576_768, 4 * 134_515_008)
    assert link_memory["peak_rss_mb"] * 2**20 > link_memory["resident_weight_bytes"]
    lines = {line["metric"]: line for line in result["comparison"]}
    decode = lines["decode tok/s per stream (c=1)"]
    assert decode["ratio"] == pytest.approx(result["rows"][0]["decode_tokens_per_s"] / result["rows"][1]["decode_tokens_per_s"])
    assert lines["prefill tok/s (64-token prompts)"]["ratio"] > 0
    json.dumps(result)


@pytest.mark.slow
def test_link_engine_runs_in_process_one_request_at_a_time(data_dir, tmp_path, monkeypatch):
    """Our engine measured as llama.cpp is: a worker, one level at concurrency 1, exactly max_tokens tokens
    per request (EOS ignored); with a fake llama.cpp beside it the engine-to-engine ratio is reported."""
    (tmp_path / "llama_cpp.py").write_text(FAKE_LLAMA_CPP)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("LINK_COMPILE_DB", str(tmp_path / "none.sqlite"))  # no stored winners
    result = run_serving_benchmark(concurrencies=(1, 4), num_prompts=2, max_tokens=4, systems=("link-engine", "llama-cpp"),
                                   data_dir=data_dir, prefill_tokens=0)
    assert result["errors"] == {} and result["skipped"] == {} and result["prefill"] == []
    # llama-cpp runs beside link (interleaved), the in-process engine after them
    assert [(r["system"], r["concurrency"]) for r in result["rows"]] == [("llama-cpp", 1), ("link-engine", 1)]
    _check_row(result["rows"][1], max_tokens=4, num_prompts=2, min_rss_mb=1)
    llama, engine = (r["decode_tokens_per_s"] for r in result["rows"])
    assert result["ratios"]["link-engine c=1 decode tok/s / llama-cpp c=1 decode tok/s"] == pytest.approx(engine / llama)


@pytest.mark.slow
def test_bench_serving_command_writes_json(data_dir, tmp_path):
    out = tmp_path / "bench.json"
    result = runner.invoke(app, ["bench", "serving", "--system", "link", "--concurrency", "1", "--num-prompts", "2",
                                 "--max-tokens", "3", "--prefill-tokens", "16", "--prefill-prompts", "1",
                                 "--data-dir", str(data_dir), "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "link" in result.output and "TTFT p50 ms" in result.output
    saved = json.loads(out.read_text())
    assert saved["model"] == "smollm2-135m-instruct" and saved["concurrencies"] == [1]
    assert [(p["system"], p["num_requests"], p["mean_prompt_tokens"]) for p in saved["prefill"]] == [("link", 1, 16)]
    _check_row(saved["rows"][0], max_tokens=3, num_prompts=2)


def test_bench_serving_command_rejects_an_unknown_system():
    result = runner.invoke(app, ["bench", "serving", "--system", "vllm"])
    assert result.exit_code == 2
    assert "unknown systems ['vllm']" in result.output
