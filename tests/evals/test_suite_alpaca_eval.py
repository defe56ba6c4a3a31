"""The AlpacaEval suite on the real instructions and baseline outputs, end to end with fake target and judge.

    LINK_DATASETS_DIR=../shared/data .venv/bin/python -m pytest -q tests/evals/test_suite_alpaca_eval.py
"""

from __future__ import annotations

import asyncio
import json
import shutil

import pytest

from evals.base import make_suite
from evals.runner import run_eval
from evals.stats import length_controlled_win_rate
from evals.suites.alpaca_eval import available_baselines
from tests.evals.fakes import FakeTarget

MODEL_MARK = "MODEL-OUTPUT"


def _judge(prefers_model) -> FakeTarget:
    """A judge that, from the pairwise prompt, prefers the model's output when prefers_model(instruction)."""
    def answer(text: str) -> str:
        instruction = text.split("[Instruction]\n")[1].split("\n\n[Response A]")[0]
        a = text.split("[Response A]\n")[1].split("\n\n[Response B]")[0]
        model_is_a = a.startswith(MODEL_MARK)
        if prefers_model(instruction):
            return "[[A]]" if model_is_a else "[[B]]"
        return "[[B]]" if model_is_a else "[[A]]"
    return FakeTarget("judge", answer, cost_usd=0.0001)


def test_load_default_baseline(data_dir):
    suite = make_suite("alpaca-eval", data_dir)
    assert "gpt4_1106_preview" in available_baselines(data_dir) and suite.baseline == "gpt4_1106_preview"
    items = suite.load("test")
    records = json.loads((data_dir / "alpaca_eval/results/gpt4_1106_preview/model_outputs.json").read_text())
    assert len(items) == 805 == len(records)
    assert items[10].prompt == records[10]["instruction"] and items[10].reference == records[10]["output"]
    assert items[10].id == "alpaca-eval/test/10" and items[10].metadata["baseline"] == "gpt4_1106_preview"
    other = make_suite("alpaca-eval", data_dir, baseline="gpt4").load("test")
    assert [i.prompt for i in other] == [i.prompt for i in items]  # same instructions, another baseline


def test_baseline_fallback_and_missing_data(tmp_path, data_dir):
    folder = tmp_path / "alpaca_eval" / "results" / "gpt4"
    folder.mkdir(parents=True)
    shutil.copy(data_dir / "alpaca_eval/results/gpt4/model_outputs.json", folder)
    assert make_suite("alpaca-eval", tmp_path).baseline == "gpt4"  # default absent: the first found
    with pytest.raises(FileNotFoundError, match="baselines found: gpt4"):
        make_suite("alpaca-eval", tmp_path, baseline="nope").load("test")


def test_end_to_end_win_rates(data_dir, tmp_path):
    suite = make_suite("alpaca-eval", data_dir, seed=1)
    items = suite.sample(suite.load("test"), 8)
    wins = {item.prompt for k, item in enumerate(items) if k % 4 != 0}  # the model wins 6 of 8
    target = FakeTarget("m", lambda text: f"{MODEL_MARK} {text[:40]}")
    judge = _judge(lambda instruction: instruction in wins)
    result = asyncio.run(run_eval(suite, items, [target], judge=judge, progress=False, out_dir=tmp_path))
    totals = result.totals["m"]
    assert totals["n"] == 8 and totals["errors"] == 0
    assert totals["score"] == pytest.approx(6 / 8) and totals["win_rate"] == pytest.approx(6 / 8)
    assert len(judge.requests) == 16 and totals["judge_cost_usd"] == pytest.approx(16 * 0.0001)
    scores = [result.grades["m"][i.id].score for i in items]
    model_chars = [len(f"{MODEL_MARK} {i.prompt[:40]}".strip()) for i in items]
    baseline_chars = [len(i.reference) for i in items]
    assert [result.grades["m"][i.id].details["model_chars"] for i in items] == model_chars
    assert totals["lc_win_rate"] == pytest.approx(length_controlled_win_rate(scores, model_chars, baseline_chars))
    assert 0.0 <= totals["lc_win_rate"] <= 1.0


def test_position_biased_judge_gives_half(data_dir, tmp_path):
    suite = make_suite("alpaca-eval", data_dir)
    items = suite.load("test")[:4]
    result = asyncio.run(run_eval(suite, items, [FakeTarget("m", "short")], judge=FakeTarget("judge", "[[A]]"),
                                  progress=False, out_dir=tmp_path))
    assert result.totals["m"]["score"] == 0.5
    assert all(g.details["verdicts"] == ["A", "A"] for g in result.grades["m"].values())


def test_unparsable_judge_is_an_error(data_dir, tmp_path):
    suite = make_suite("alpaca-eval", data_dir)
    items = suite.load("test")[:2]
    result = asyncio.run(run_eval(suite, items, [FakeTarget("m", "x")], judge=FakeTarget("judge", "no idea"),
                                  progress=False, out_dir=tmp_path))
    assert result.totals["m"]["errors"] == 2 and result.totals["m"]["lc_win_rate"] is None


def test_completion_style_prompt(data_dir):
    suite = make_suite("alpaca-eval", data_dir, style="completion")
    item = suite.load("test")[0]
    kind, payload = suite.request(item)
    assert kind == "completion" and payload["prompt"] == f"### Instruction:\n{item.prompt}\n\n### Response:\n"
