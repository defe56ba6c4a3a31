"""Reference numbers for RouterBench, read straight from the CSV files with the csv module (no evals code).

Used by the replay and CLI tests as the independent side of their comparisons.
"""

from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path

FOLDER = Path("routerdc") / "datasets" / "routerbench_zs"
NOT_MODELS = {"", "sample_id", "prompt", "eval_name", "oracle_model_to_route_to"}


def read(data_dir: Path, split: str) -> list[dict[str, str]]:
    csv.field_size_limit(2**31 - 1)
    rows = []
    for name in ("arc_challenge", "mbpp", "winograde"):
        with open(data_dir / FOLDER / f"{name}_{split}.csv", encoding="utf-8", newline="") as f:
            rows.extend(csv.DictReader(f))
    return rows


def models(rows: list[dict[str, str]]) -> list[str]:
    return [k for k in rows[0] if k not in NOT_MODELS and "|" not in k]


def cells(rows: list[dict[str, str]]) -> tuple[dict[tuple[str, str], tuple[float, float]], dict[str, str]]:
    """((sample_id, model) -> (score, cost)) over the filled score cells, and sample_id -> eval_name."""
    out: dict[tuple[str, str], tuple[float, float]] = {}
    task: dict[str, str] = {}
    for row in rows:
        task[row["sample_id"]] = row["eval_name"]
        for m in models(rows):
            if row[m] != "":
                assert (row["sample_id"], m) not in out
                out[(row["sample_id"], m)] = (float(row[m]), float(row[f"{m}|total_cost"]))
    return out, task


def accuracy_and_cost(rows: list[dict[str, str]], model: str) -> tuple[int, float, float]:
    """(number of filled cells, mean score, total cost) of one model."""
    scores = [float(r[model]) for r in rows if r[model] != ""]
    costs = [float(r[f"{model}|total_cost"]) for r in rows if r[model] != ""]
    return len(scores), sum(scores) / len(scores), sum(costs)


def best_per_task_expected(data_dir: Path) -> tuple[int, float, float]:
    """By hand: rank models per eval_name by mean training score (ties: name), then on each test prompt
    charge the first ranked model that has a filled cell. Returns (prompts, accuracy, total cost)."""
    train = read(data_dir, "train")
    sums: dict[tuple[str, str], list[float]] = defaultdict(list)
    for row in train:
        for m in models(train):
            if row[m] != "":
                sums[(row["eval_name"], m)].append(float(row[m]))
    ranking = {task: sorted(models(train), key=lambda m: (-sum(sums[(task, m)]) / len(sums[(task, m)]), m))
               for task in {t for t, _ in sums}}
    test = read(data_dir, "test")
    filled, task = cells(test)
    charged = []
    for sample_id in dict.fromkeys(r["sample_id"] for r in test):
        model = next(m for m in ranking[task[sample_id]] if (sample_id, m) in filled)
        charged.append(filled[(sample_id, model)])
    return len(charged), sum(s for s, _ in charged) / len(charged), sum(c for _, c in charged)
