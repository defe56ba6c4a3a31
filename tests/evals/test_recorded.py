"""The recorded-set loaders against the files themselves (csv/json modules) and the published leaderboards."""

from __future__ import annotations

import ast
import csv
import json
import math
from collections import defaultdict

import pytest

from evals.outcomes import Outcome, OutcomeTable
from evals.prices import estimate_cost_usd, model_price
from evals.recorded import (alpaca_eval_instructions, load_alpaca_eval_lengths, load_alpaca_eval_preferences, load_recorded,
                            load_routellm, load_routerbench, load_source)
from tests.evals import routerbench_csv as ref


@pytest.mark.parametrize("split, num_prompts", [("test", 952), ("train", 2218)])
def test_routerbench_outcomes_are_the_filled_cells_of_the_csv(data_dir, split, num_prompts):
    rows = ref.read(data_dir, split)
    filled, task = ref.cells(rows)
    table = load_routerbench(data_dir, split)
    got = {(o.prompt_id, o.model): (o.score, o.cost_usd) for o in table}
    assert got == filled
    assert len(table.prompt_ids) == num_prompts and len(table.models) == 11
    assert {o.prompt_id: o.suite for o in table} == task
    first = rows[0]
    outcome = next(o for o in table if o.prompt_id == first["sample_id"] and o.model == "gpt-4-1106-preview")
    assert outcome.prompt == ast.literal_eval(first["prompt"])[0]
    assert outcome.response == first["gpt-4-1106-preview|model_response"]


def test_routerbench_holes_are_the_documented_ones(data_dir):
    rows = ref.read(data_dir, "test")
    doubled = [r for r in rows if len(ast.literal_eval(r["prompt"])) == 2]
    assert len(doubled) == 6 and {r["eval_name"] for r in doubled} == {"arc-challenge"}
    for r in doubled:  # only gpt-3.5-turbo-1106 is filled, the list holds one prompt twice
        assert [m for m in ref.models(rows) if r[m] != ""] == ["gpt-3.5-turbo-1106"]
        turns = ast.literal_eval(r["prompt"])
        assert turns[0] == turns[1]
    with pytest.raises(ValueError, match="split"):
        load_routerbench(data_dir, "validation")
    with pytest.raises(FileNotFoundError):
        load_routerbench(data_dir / "nowhere", "test")


def test_routellm_mmlu_scores_and_estimated_costs(data_dir):
    table = load_routellm(data_dir, "mmlu")
    assert len(table.prompt_ids) == 14042 and set(table.models) == {"gpt-4-1106-preview", "mistralai/Mixtral-8x7B-Instruct-v0.1"}
    folder = data_dir / "routellm" / "routellm" / "evals" / "mmlu" / "responses"
    assert len({p.rsplit("/", 1)[0] for p in table.prompt_ids}) == len(list(folder.glob("*.csv"))) == 57
    with open(folder / "mmlu_anatomy.csv", encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    outcome = {(o.prompt_id, o.model): o for o in table}[("routellm-mmlu/anatomy/3", "gpt-4-1106-preview")]
    assert outcome.prompt == rows[3]["prompt"] and outcome.score == (1.0 if rows[3]["gpt-4-1106-preview"] == "True" else 0.0)
    # cost.json: gpt-4-1106-preview at 10 / 30 USD per million tokens; MMLU answers count as 1 token
    assert outcome.cost_usd == pytest.approx((math.ceil(len(rows[3]["prompt"]) / 4) * 10 + 1 * 30) / 1e6)
    wins = sum(o.score for o in table if o.model == "gpt-4-1106-preview")
    assert wins / 14042 == pytest.approx(0.8058, abs=1e-4)


def test_routellm_gsm8k_costs_use_the_recorded_responses(data_dir):
    table = load_routellm(data_dir, "gsm8k")
    path = data_dir / "routellm" / "routellm" / "evals" / "gsm8k" / "gsm8k_responses.csv"
    with open(path, encoding="utf-8", newline="") as f:
        row = list(csv.DictReader(f))[10]
    mixtral = "mistralai/Mixtral-8x7B-Instruct-v0.1"
    outcome = {(o.prompt_id, o.model): o for o in table}[("routellm-gsm8k/10", mixtral)]
    tokens = math.ceil(len(row["prompt"]) / 4) + math.ceil(len(row[f"{mixtral}_response"]) / 4)
    assert outcome.cost_usd == pytest.approx(tokens * 0.6 / 1e6)  # cost.json: mixtral-8x7b-instruct 0.6 / 0.6
    assert outcome.response == row[f"{mixtral}_response"] and outcome.suite == "gsm8k"
    assert len(table) == 2 * 1319
    with pytest.raises(ValueError):
        load_routellm(data_dir, "humaneval")


def test_prices():
    assert estimate_cost_usd("What is 2+2?", "4", (10.0, 30.0)) == pytest.approx((3 * 10 + 1 * 30) / 1e6)
    assert estimate_cost_usd("x" * 40, None, None) == 0.0
    assert model_price("mistralai/Mixtral-8x7B-Instruct-v0.1", None) == (0.6, 0.6)  # the fallback table
    assert model_price("no-such-model", None) is None


def test_alpaca_eval_results_share_the_805_instructions_in_order(data_dir):
    instructions = alpaca_eval_instructions(data_dir)
    assert len(instructions) == 805
    files = sorted((data_dir / "alpaca_eval" / "results").glob("*/model_outputs.json"))
    assert len(files) == 14
    for path in files:
        assert [e["instruction"] for e in json.loads(path.read_text(encoding="utf-8"))] == instructions


@pytest.mark.parametrize("baseline, leaderboard", [
    ("gpt4_1106_preview", "data_AlpacaEval_2/weighted_alpaca_eval_gpt4_turbo_leaderboard.csv"),
    ("text_davinci_003", "data_AlpacaEval/alpaca_eval_gpt4_leaderboard.csv"),
])
def test_alpaca_eval_mean_score_reproduces_the_leaderboard_win_rate(data_dir, baseline, leaderboard):
    table = load_alpaca_eval_preferences(data_dir, baseline)
    with open(data_dir / "alpaca_eval" / "leaderboards" / leaderboard, encoding="utf-8", newline="") as f:
        published = {r[""]: float(r["win_rate"]) for r in csv.DictReader(f)}
    scores = defaultdict(list)
    for o in table:
        scores[o.model].append(o.score)
    checked = [m for m in scores if m in published]
    assert len(checked) >= 50
    for model in checked:
        assert 100 * sum(scores[model]) / len(scores[model]) == pytest.approx(published[model], abs=0.1), model


def test_alpaca_eval_prompts_costs_and_lengths(data_dir):
    table = load_alpaca_eval_preferences(data_dir)
    instructions = alpaca_eval_instructions(data_dir)
    by_key = {(o.prompt_id, o.model): o for o in table}
    assert by_key[("alpaca-eval/0", "gpt4_1106_preview")].prompt == instructions[0]
    assert all(o.response is None and 0 <= o.score <= 1 for o in table)
    assert {o.cost_usd for o in table if o.model == "FuseChat-Gemma-2-9B-Instruct"} == {0.0}  # no known price
    lengths = load_alpaca_eval_lengths(data_dir)
    assert set(lengths) == set(by_key)
    path = data_dir / "alpaca_eval" / "derived" / "alpaca_eval_per_prompt_preferences.csv"
    with open(path, encoding="utf-8", newline="") as f:
        row = next(r for r in csv.DictReader(f) if r["model"] == "gpt-3.5-turbo-1106" and r["generator_1_baseline"] == "gpt4_1106_preview")
    key = (f"alpaca-eval/{row['instruction_index']}", "gpt-3.5-turbo-1106")
    assert lengths[key] == (int(row["output_2_chars"]), int(row["output_1_chars"]))
    # cost.json prices gpt-3.5-turbo-1106 at 1 / 2 USD per million tokens
    prompt = instructions[int(row["instruction_index"])]
    expected = (math.ceil(len(prompt) / 4) * 1 + math.ceil(int(row["output_2_chars"]) / 4) * 2) / 1e6
    assert by_key[key].cost_usd == pytest.approx(expected)
    with pytest.raises(ValueError, match="baseline"):
        load_alpaca_eval_preferences(data_dir, "nobody")


def test_specs_and_sources(data_dir, tmp_path):
    assert len(load_recorded("routerbench", data_dir)) == len(load_routerbench(data_dir, "test"))
    assert len(load_recorded("routerbench", data_dir, split="train")) == len(load_routerbench(data_dir, "train"))
    assert len(load_recorded("routerbench:train", data_dir, split="test")) == len(load_routerbench(data_dir, "train"))
    for bad in ["nothing", "routellm-mmlu:x"]:
        with pytest.raises(ValueError):
            load_recorded(bad, data_dir)
    path = OutcomeTable([Outcome("p", "s", "q", "m", 1.0)]).write(tmp_path / "run" / "outcomes.jsonl")
    assert len(load_source(str(path))) == 1 and len(load_source(str(path.parent))) == 1
    with pytest.raises(FileNotFoundError):
        load_source(str(tmp_path / "missing.jsonl"))
    with pytest.raises(ValueError, match="neither"):
        load_source("not-a-source")


def test_the_local_pool_reattaches_prompt_texts_by_item_id(data_dir, tmp_path, monkeypatch):
    import evals.recorded as recorded

    gsm8k = [json.loads(line) for line in (data_dir / "gsm8k" / "train.jsonl").read_text().splitlines()[:3]]
    shipped = OutcomeTable([Outcome(f"gsm8k/train/{i}", "gsm8k", "", "m", float(i % 2), 0.001,
                                    signals={"key": str(i), "logprob_mean": -0.5}) for i in range(3)]
                           + [Outcome("gsm8k/train/999999", "gsm8k", "", "m", 0.0)])   # not in the data: no text
    shipped.write(tmp_path / "gsm8k-train-0.jsonl.gz", text=False)
    monkeypatch.setattr(recorded, "POOL_DIR", tmp_path)
    table = load_recorded("local-pool:gsm8k", data_dir)
    assert [r.prompt for r in table.rows[:3]] == [row["question"] for row in gsm8k]
    assert table.rows[3].prompt == "" and table.rows[1].signals == {"key": "1", "logprob_mean": -0.5}
    assert [r.score for r in table.rows] == [0.0, 1.0, 0.0, 0.0]
    with pytest.raises(FileNotFoundError, match="no shipped pool outcomes of 'mmlu'"):
        load_recorded("local-pool:mmlu", data_dir)
