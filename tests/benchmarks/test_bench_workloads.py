"""The serving benchmark's repetitive and mixed workloads (benchmarks/link_bench/workloads.py) on the real data,
their request shapes as a mix, and `link bench serving --workload ... --save-mix` end to end."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from benchmarks.link_bench.timing import TimedRequest
from benchmarks.link_bench.workloads import burst_plan, load_repetitive, records_to_mix, workload_texts
from cli.app import app
from serving.tuning.traffic import RequestShape, load_mix

runner = CliRunner()


def test_repetitive_prompts_quote_humaneval_code_and_mt_bench_tasks(data_dir):
    texts = load_repetitive(data_dir, seed=0)
    assert len(texts) == 164 + 20  # every HumanEval problem, MT-Bench writing and extraction first turns
    assert texts == load_repetitive(data_dir, seed=0) and texts != load_repetitive(data_dir, seed=1)
    code = [t for t in texts if "def has_close_elements(numbers: List[float], threshold: float) -> bool:" in t]
    assert len(code) == 1 and code[0].startswith("Here is a Python function") and "```python\n" in code[0]
    quoted = [t for t in texts if "Edit the following paragraph to correct any grammatical errors" in t]
    assert len(quoted) == 1 and quoted[0].startswith("Summarize the following task")
    assert workload_texts("mixed", data_dir)[:3] == workload_texts("default", data_dir)[:3]


def test_burst_plan_adds_up_with_sizes_from_1_to_16():
    sizes = burst_plan(100, seed=3)
    assert sum(sizes) == 100 and all(1 <= s <= 16 for s in sizes) and sizes == burst_plan(100, seed=3)
    assert burst_plan(5, seed=0)[-1] <= 5 and sum(burst_plan(5, seed=0)) == 5


def test_records_become_a_mix_level_after_level():
    level1 = [TimedRequest(10, 4, 0.1, 0.01, 0.5, start_s=100.0), TimedRequest(12, 4, 0.1, 0.01, 0.6, start_s=100.2)]
    level2 = [TimedRequest(30, 2, 0.1, 0.01, 0.3, start_s=200.0)]
    # level 2 starts 1 s after level 1's last finish (0.2 + 0.6 = 0.8 s)
    assert records_to_mix([level1, level2]) == [RequestShape(10, 4, 0.0), RequestShape(12, 4, 0.2), RequestShape(30, 2, 1.8)]


@pytest.mark.slow
def test_bench_serving_mixed_workload_saves_a_mix(data_dir, tmp_path):
    mix, out = tmp_path / "mixed.jsonl", tmp_path / "bench.json"
    result = runner.invoke(app, ["bench", "serving", "--workload", "mixed", "--num-prompts", "5", "--max-tokens", "2",
                                 "--prefill-tokens", "0", "--data-dir", str(data_dir), "--save-mix", str(mix), "--json", str(out)])
    assert result.exit_code == 0, result.output
    saved = json.loads(out.read_text())
    assert saved["workload"] == "mixed" and sum(saved["bursts"]) == 5 and saved["bursts"] == burst_plan(5, 0)
    assert [(r["system"], r["concurrency"], r["num_requests"]) for r in saved["rows"]] == [("link", 16, 5)]
    assert saved["prefill"] == [] and saved["num_prefill_prompts"] == 0  # no prefill phase asked for
    assert set(saved["skipped"]) == {"transformers", "llama-cpp"}
    shapes = load_mix(mix)
    assert len(shapes) == 5 and all(s.output_tokens == 2 and s.prompt_tokens > 5 for s in shapes)


@pytest.mark.slow
def test_bench_serving_repetitive_workload_and_an_unknown_one(data_dir):
    result = runner.invoke(app, ["bench", "serving", "--workload", "repetitive", "--system", "link", "--concurrency", "1",
                                 "--num-prompts", "2", "--max-tokens", "2", "--prefill-tokens", "0", "--data-dir", str(data_dir)])
    assert result.exit_code == 0, result.output
    assert "link" in result.output
    bad = runner.invoke(app, ["bench", "serving", "--workload", "nonsense", "--system", "link"])
    assert bad.exit_code == 2 and "unknown workload" in " ".join(bad.output.split())
