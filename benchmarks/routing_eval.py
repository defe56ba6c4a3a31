"""The routers' acceptance numbers, reproduced offline on RouterBench and RouteLLM's recorded outcomes.

    LINK_DATASETS_DIR=../shared/data .venv/bin/python benchmarks/routing_eval.py            # all parts
    .venv/bin/python benchmarks/routing_eval.py --part routerbench --part add-model --json rb.json
    .venv/bin/python benchmarks/routing_eval.py --part routellm

Parts:
- routerbench: kNN, LightGBM and MF trained on the three *_train files and tested on the *_test files (11
  models, recorded per-prompt costs, prompts with an empty cell dropped), next to each single model, the zero
  router (their convex hull), random, best model per task and the oracle; then the mean over 5 re-drawn
  train/test splits of the same test size (RouterBench, Hu et al. 2024: AIQ = area under the non-decreasing
  convex hull of the cost-quality curve over [0, the priciest model's cost], divided by that range).
- signal: what per-prompt signal the RouterBench targets need: synthetic routers that know each task's
  training accuracy per model plus a noisy hint of each test outcome, swept over the hint's strength, with
  their AIQ and AUC in suite (the learned routers' AUC in suite is in the routerbench part).
- agreement (benchmarks/routing_agreement.py): whether a cascade that reads the cheap models' answers could do what the prompt-only routers
  cannot, judged with hindsight on RouterBench's test rows: every set of cheap models (mean cost under a
  quarter of gpt-4's) answers each multiple-choice prompt (ARC, Winogrande); their answer is kept when all
  of them give the same letter, else gpt-4 answers too (every model asked is paid); other prompts (MBPP) go
  to the single model best on that task's test rows. The best of these sets, picked on the test rows
  themselves, bounds what such cascades reach on this data.
- add-model: each learned router trained on 10 of the 11 models, the 11th added from 300 labelled training
  prompts (`Router.add_model`), against a full retrain on all 11 (every model in turn; the acceptance
  model is Yi-34B-Chat, the cheap model that leads on ARC).
- routellm: RouteLLM's gpt-4-1106-preview / Mixtral-8x7B pairs (Ong et al. 2024): GSM8K with 5-fold CV over
  3 seeds, MMLU with 5-fold CV (suite "mmlu", and with each prompt's subject as its suite, which the
  per-subject baseline needs), and MMLU with whole subjects held out; APGR, CPT(50%), CPT(80%); prompts
  read with the choice embeddings (`Featurizer(choice_embeddings=True)`; the first run embeds ~56k MMLU
  stems and choices, about 15 minutes on 2 cores, cached). On GSM8K,
  whose answers are recorded, also "cascade:answer": Mixtral answers first and escalates to gpt-4 when an
  answer checker (`routers.answer_check`, fitted on the training folds' Mixtral answers) doubts it; it pays
  Mixtral on every prompt (MMLU records no answers, so it has no such cascade). "lgbm+words" is the
  LightGBM router that also reads the prompt's words (`LGBMRouter(lexical=True)`, `routers.lexical`), on the
  same folds. --mmlu-seeds re-draws MMLU's folds too (one seed's APGR moves by about 0.004 with the draw).

Router options are the defaults of each class, chosen by cross-validation on training data only
(RouterBench: 5-fold CV on the train files; RouteLLM: the CV folds themselves). Prompts are embedded with
all-MiniLM-L6-v2 through `routers.features.Featurizer` (disk cache; the first run embeds ~20k prompts).
Prints one table per part with each acceptance target and whether it is met; --json writes every report.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

PARTS = ("routerbench", "signal", "agreement", "add-model", "routellm")
LEARNED = ("knn", "lgbm", "mf")
REFERENCE = "gpt-4-1106-preview"
ADD_MODEL = "zero-one-ai/Yi-34B-Chat"
TARGETS = {                      # the routers' acceptance targets
    "aiq": 0.87, "cost_ratio_at_best_accuracy": 0.50, "accuracy_at_25pct_best_cost": 0.86,
    "aiq_over_best_per_task": 0.02, "add_model_aiq_gap": 0.01, "apgr_gsm8k": 0.70, "apgr_mmlu": 0.72, "apgr_mmlu_held_out": 0.65,
}


def load(spec: str, data_dir: Path):
    """A recorded set as `RoutingData` (complete prompts only)."""
    from evals.recorded import load_recorded
    from routers.offline.data import RoutingData

    return RoutingData.from_outcomes(load_recorded(spec, data_dir)).complete_rows()


def _fmt(value: Any, digits: int = 3) -> str:
    return "-" if value is None or (isinstance(value, float) and not np.isfinite(value)) else f"{value:.{digits}f}"


def _check(value: float | None, target: float, higher: bool = True) -> str:
    if value is None or not np.isfinite(value):
        return "MISS (not reached)"
    met = value >= target if higher else value <= target
    return f"{'met' if met else 'MISS'} (target {'>=' if higher else '<='} {target}, {value - target:+.3f})"


# --- RouterBench ----------------------------------------------------------------------------------------

RB_COLUMNS = (("aiq", "AIQ"), ("max_quality", "max acc"), ("accuracy_at_25pct_best_cost", "acc@25%cost"),
              ("accuracy_at_50pct_best_cost", "acc@50%cost"), ("cost_ratio_at_best_accuracy", "cost@gpt4acc"),
              ("auc_within_suite", "AUC in suite"))


def routerbench(data_dir: Path, featurizer, num_splits: int) -> dict[str, Any]:
    from routers.offline.crossval import evaluate_resplits
    from routers.offline.evaluate import evaluate_split
    from routers.offline.settings import EvalSettings

    train, test = load("routerbench:train", data_dir), load("routerbench:test", data_dir)
    settings = EvalSettings(types=LEARNED, baselines=("random", "best-per-task", "oracle"), keep_curves=False,
                            cascade=False)
    features = (featurizer.transform(train.prompts, train.has_tools),
                featurizer.transform(test.prompts, test.has_tools))
    split = evaluate_split(train, test, settings, features=features)
    resplits = evaluate_resplits(train, test, settings, num_splits=num_splits, featurizer=featurizer)
    return {"split": split, "resplits": resplits}


def print_routerbench(result: dict[str, Any]) -> None:
    split, summary = result["split"], result["resplits"]["summary"]
    ref = split["reference"]
    print(f"\nRouterBench: train {split['num_train']} / test {split['num_test']} prompts, "
          f"{len(split['models'])} models; "
          f"reference {ref['model']}: accuracy {ref['accuracy']:.3f} at ${ref['cost_usd'] * 1e3:.3f} per 1k requests")
    print("single models (test): " + ", ".join(f"{m.split('/')[-1]} {v['accuracy']:.3f}@${v['cost_usd'] * 1e3:.2f}"
                                                 for m, v in split["single_models"].items()))
    n = len(result["resplits"]["splits"])
    header = f"{'router':15s}" + "".join(f"{label:>13s}" for _, label in RB_COLUMNS) + f"{f'AIQ {n} splits':>18s}"
    print(header)
    print(f"{'zero router':15s}{_fmt(split['zero_router']['aiq'], 4):>13s}" + " " * 13 * (len(RB_COLUMNS) - 1) +
          f"{_fmt(summary['zero_router']['aiq']['mean'], 4):>11s}±{_fmt(summary['zero_router']['aiq']['std'], 4)}")
    for name, metrics in split["routers"].items():
        row = f"{name:15s}" + "".join(f"{_fmt(metrics.get(key), 4):>13s}" for key, _ in RB_COLUMNS)
        agg = summary.get(name, {}).get("aiq")
        row += f"{_fmt(agg['mean'], 4):>11s}±{_fmt(agg['std'], 4)}" if agg else ""
        print(row)
    print("(cost@gpt4acc: the cheapest operating point reaching gpt-4's accuracy, as a fraction of gpt-4's cost; "
          "AUC in suite: how well the predicted quality ranks a model's right answers above its wrong ones within a "
          "task, 0.5 for best-per-task: the per-prompt signal a router adds)")
    learned = {name: split["routers"][name] for name in LEARNED if name in split["routers"]}
    best = max(learned, key=lambda name: summary[name]["aiq"]["mean"])
    m, s = learned[best], summary[best]
    bpt, bpt_s = split["routers"]["best-per-task"]["aiq"], summary["best-per-task"]["aiq"]["mean"]
    print(f"targets, best learned router = {best} (by mean AIQ over splits):")
    print(f"  AIQ test {m['aiq']:.4f}: {_check(m['aiq'], TARGETS['aiq'])}; "
          f"mean over splits {s['aiq']['mean']:.4f}: {_check(s['aiq']['mean'], TARGETS['aiq'])}")
    for key in ("cost_ratio_at_best_accuracy",):
        values = {n: learned[n].get(key) for n in learned}
        best_n = min(values, key=lambda n: values[n] if values[n] is not None else np.inf)
        print(f"  gpt-4 accuracy at <= 50% of its cost: best {best_n} {_fmt(values[best_n])}: "
              f"{_check(values[best_n], TARGETS[key], higher=False)}")
    values = {n: learned[n].get("accuracy_at_25pct_best_cost") for n in learned}
    best_n = max(values, key=lambda n: values[n] if values[n] is not None else -np.inf)
    print(f"  accuracy at <= 25% of gpt-4's cost: best {best_n} {_fmt(values[best_n])}: "
          f"{_check(values[best_n], TARGETS['accuracy_at_25pct_best_cost'])}")
    print(f"  AIQ over best-per-task: test {m['aiq'] - bpt:+.4f}, splits {s['aiq']['mean'] - bpt_s:+.4f}: "
          f"{_check(s['aiq']['mean'] - bpt_s, TARGETS['aiq_over_best_per_task'])}")


# --- the per-prompt signal the targets need -------------------------------------------------------------

SIGNAL_STRENGTHS = (0.0, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.75, 1.0)


def needed_signal(data_dir: Path, seed: int = 0) -> dict[str, Any]:
    """How much a router must know of each prompt for RouterBench's targets: synthetic routers that know the
    training accuracy of each model on each task (what best-per-task knows) plus a noisy hint of each test
    outcome, logit(q) = logit(task accuracy) + d * (2 * score - 1) + N(0, 1), independently per cell, swept
    over the hint's strength d and measured like the learned routers (AIQ, accuracy at 25% of gpt-4's cost,
    the cost of gpt-4's accuracy) next to their AUC in suite."""
    from routers.features import Features, text_features
    from routers.offline.evaluate import evaluate_split
    from routers.offline.settings import EvalSettings

    train, test = load("routerbench:train", data_dir), load("routerbench:test", data_dir)
    task_accuracy = np.zeros_like(test.scores)
    train_suites, test_suites = np.asarray(train.suites), np.asarray(test.suites)
    for suite in np.unique(test_suites):
        task_accuracy[test_suites == suite] = np.nanmean(train.scores[train_suites == suite], axis=0)
    task_accuracy = np.clip(task_accuracy, 1e-3, 1 - 1e-3)
    rng = np.random.default_rng(seed)
    hinted = {}
    for d in SIGNAL_STRENGTHS:
        logit = np.log(task_accuracy / (1 - task_accuracy)) + d * (2 * test.scores - 1) + rng.normal(size=test.scores.shape)
        hinted[f"hint d={d:g}"] = 1 / (1 + np.exp(-logit))
    blank = (Features(np.zeros((train.num_prompts, 1)), text_features(train.prompts)),
             Features(np.zeros((test.num_prompts, 1)), text_features(test.prompts)))
    settings = EvalSettings(types=(), baselines=("best-per-task",), keep_curves=False, cascade=False)
    return evaluate_split(train, test, settings, features=blank, extra=hinted)


def print_needed_signal(report: dict[str, Any]) -> None:
    print("\nThe per-prompt signal RouterBench's targets need (synthetic routers: each task's training accuracy "
          "plus a noisy hint of each outcome)")
    print(f"{'router':15s}" + "".join(f"{label:>13s}" for _, label in RB_COLUMNS))
    for name, metrics in report["routers"].items():
        print(f"{name:15s}" + "".join(f"{_fmt(metrics.get(key), 4):>13s}" for key, _ in RB_COLUMNS))
    print(f"(targets: AIQ >= {TARGETS['aiq']}, acc@25%cost >= {TARGETS['accuracy_at_25pct_best_cost']}, "
          f"cost@gpt4acc <= {TARGETS['cost_ratio_at_best_accuracy']}; compare the AUC in suite of the learned routers "
          "in the routerbench part)")


# --- answer agreement (benchmarks/routing_agreement.py) --------------------------------------------------

def agreement(data_dir: Path) -> dict[str, Any]:
    from routing_agreement import agreement_bound

    return agreement_bound(load("routerbench:test", data_dir), REFERENCE, TARGETS["cost_ratio_at_best_accuracy"],
                           TARGETS["accuracy_at_25pct_best_cost"])


# --- adding a model -------------------------------------------------------------------------------------

def add_model(data_dir: Path, featurizer, models: list[str] | None) -> dict[str, Any]:
    from routers.offline.crossval import evaluate_add_model
    from routers.offline.settings import EvalSettings

    train, test = load("routerbench:train", data_dir), load("routerbench:test", data_dir)
    features = (featurizer.transform(train.prompts, train.has_tools),
                featurizer.transform(test.prompts, test.has_tools))
    settings = EvalSettings(types=(), baselines=(), keep_curves=True, cascade=False)
    out: dict[str, Any] = {}
    for type_ in LEARNED:
        for model in models or train.models:
            result = evaluate_add_model(train, test, type_, model, num_labelled=300, settings=settings, features=features)
            full_share = float(np.max(np.asarray(result["full"]["curve"]["share"])[:, train.models.index(model)]))
            out.setdefault(type_, {})[model] = {"aiq_full": result["full"]["aiq"], "aiq_added": result["added"]["aiq"],
                                                "aiq_gap": result["aiq_gap"], "max_share": result["new_model_max_share"],
                                                "max_share_full": full_share}
    return out


def print_add_model(result: dict[str, Any]) -> None:
    print("\nAdding a model (RouterBench): train on 10 models, add the 11th from 300 labelled prompts")
    print(f"{'router':7s}{'new model':32s}{'AIQ full':>10s}{'AIQ added':>11s}{'gap':>9s}{'max share':>11s}{'(full)':>8s}")
    for type_, rows in result.items():
        for model, r in rows.items():
            print(f"{type_:7s}{model[-31:]:32s}{r['aiq_full']:>10.4f}{r['aiq_added']:>11.4f}{r['aiq_gap']:>+9.4f}"
                  f"{r['max_share']:>11.3f}{r['max_share_full']:>8.3f}")
        gaps = [abs(r["aiq_gap"]) for r in rows.values()]
        line = f"  {type_}: |gap| mean {np.mean(gaps):.4f}, max {np.max(gaps):.4f}"
        if ADD_MODEL in rows:
            r = rows[ADD_MODEL]
            met = r["max_share"] > 0 and abs(r["aiq_gap"]) <= TARGETS["add_model_aiq_gap"]
            line += (f"; {ADD_MODEL.split('/')[-1]}: max share {r['max_share']:.3f}, |gap| {abs(r['aiq_gap']):.4f}: "
                     f"{'met' if met else 'MISS'} (target: share > 0 and |gap| <= {TARGETS['add_model_aiq_gap']})")
        print(line)


# --- RouteLLM -------------------------------------------------------------------------------------------

def routellm(data_dir: Path, featurizer, gsm8k_seeds: tuple[int, ...], mmlu_seeds: tuple[int, ...] = (0,)
             ) -> dict[str, Any]:
    from routers.features import Featurizer
    from routers.offline.crossval import evaluate_kfold
    from routers.offline.settings import EvalSettings

    # MMLU's choices read as well (routers.features.CHOICE_EMBEDDING_FEATURE_NAMES; GSM8K has none)
    choice_featurizer = Featurizer(featurizer.embedder, choice_embeddings=True)
    settings = EvalSettings(types=LEARNED, baselines=("random", "length", "best-per-task"), keep_curves=False,
                            answer_check=True)
    words = EvalSettings(types=("lgbm",), baselines=(), keep_curves=False, cascade=False,
                         options={"lgbm": {"lexical": True}})
    gsm8k, mmlu = load("routellm-gsm8k", data_dir), load("routellm-mmlu", data_dir)
    runs = {
        "gsm8k": (gsm8k, gsm8k_seeds, None),
        "mmlu": (mmlu, mmlu_seeds, None),
        "mmlu, subject as suite": (mmlu.with_suites(mmlu.groups("subject")), mmlu_seeds, None),
        "mmlu, subjects held out": (mmlu, mmlu_seeds, "subject"),
    }
    out = {}
    for name, (data, seeds, group_by) in runs.items():
        report = evaluate_kfold(data, settings, k=5, seeds=seeds, group_by=group_by, featurizer=choice_featurizer)
        report["summary"]["lgbm+words"] = evaluate_kfold(data, words, k=5, seeds=seeds, group_by=group_by,
                                                         featurizer=choice_featurizer)["summary"]["lgbm"]
        out[name] = {"summary": report["summary"], "seeds": list(seeds), "group_by": group_by,
                     "num_prompts": data.num_prompts}
    return out


def print_routellm(result: dict[str, Any]) -> None:
    print("\nRouteLLM pairs (gpt-4-1106-preview vs Mixtral-8x7B), 5-fold CV: mean (std) over folds")
    names = ["knn", "lgbm", "lgbm+words", "mf", "cascade:answer", "random", "length", "best-per-task"]
    print(f"{'set':26s}{'router':15s}{'APGR':>14s}{'CPT(50%)':>16s}{'CPT(80%)':>16s}")
    for set_name, r in result.items():
        s = r["summary"]
        for name in names:
            if name not in s:
                continue
            label = "per-subject avg" if name == "best-per-task" and "subject as suite" in set_name else name
            cells = "".join(f"{_fmt(s[name][k]['mean']):>8s} ({_fmt(s[name][k]['std'], 3)})" if k in s[name] else f"{'-':>16s}"
                            for k in ("apgr", "cpt50", "cpt80"))
            print(f"{set_name:26s}{label:15s}{cells}")
    targets = (("gsm8k", "apgr_gsm8k"), ("mmlu", "apgr_mmlu"), ("mmlu, subject as suite", "apgr_mmlu"),
               ("mmlu, subjects held out", "apgr_mmlu_held_out"))
    print("targets (best learned router per set):")
    for set_name, key in targets:
        s = result[set_name]["summary"]
        best = max((n for n in (*LEARNED, "lgbm+words", "cascade:answer") if n in s), key=lambda n: s[n]["apgr"]["mean"])
        print(f"  {set_name}: {best} APGR {s[best]['apgr']['mean']:.3f}: {_check(s[best]['apgr']['mean'], TARGETS[key])}")


# --- main -----------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--part", action="append", choices=PARTS, help="parts to run (default: all)")
    parser.add_argument("--data-dir", type=Path, default=Path(os.environ.get("LINK_DATASETS_DIR") or "../shared/data"))
    parser.add_argument("--splits", type=int, default=5, help="re-drawn RouterBench splits")
    parser.add_argument("--gsm8k-seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--mmlu-seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--add-models", nargs="*", default=None,
                        help="models to add in turn (default: all 11; give none for the acceptance model only)")
    parser.add_argument("--json", type=Path, help="write every report here")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from routers.features import Featurizer

    featurizer = Featurizer()
    parts = args.part or list(PARTS)
    out: dict[str, Any] = {}
    start = time.perf_counter()
    if "routerbench" in parts:
        out["routerbench"] = routerbench(args.data_dir, featurizer, args.splits)
        print_routerbench(out["routerbench"])
    if "signal" in parts:
        out["signal"] = needed_signal(args.data_dir)
        print_needed_signal(out["signal"])
    if "agreement" in parts:
        from routing_agreement import print_agreement

        out["agreement"] = agreement(args.data_dir)
        print_agreement(out["agreement"], TARGETS["cost_ratio_at_best_accuracy"], TARGETS["accuracy_at_25pct_best_cost"])
    if "add-model" in parts:
        models = None if args.add_models is None else (args.add_models or [ADD_MODEL])
        out["add_model"] = add_model(args.data_dir, featurizer, models)
        print_add_model(out["add_model"])
    if "routellm" in parts:
        out["routellm"] = routellm(args.data_dir, featurizer, tuple(args.gsm8k_seeds), tuple(args.mmlu_seeds))
        print_routellm(out["routellm"])
    print(f"\n({time.perf_counter() - start:.0f} s)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1, default=float))
    return out


if __name__ == "__main__":
    main()
