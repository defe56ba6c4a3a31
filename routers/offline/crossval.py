"""Repeated evaluation: re-drawn train/test splits, k-fold cross-validation, and adding a model.

    report = evaluate_resplits(train, test, settings, num_splits=5)   # the same test size, re-drawn 5 times
    report = evaluate_kfold(data, settings, k=5, seeds=(0, 1, 2), group_by="subject")   # RouteLLM-style CV
    result = evaluate_add_model(train, test, "knn", "gpt-4-1106-preview", num_labelled=300)

One split's AIQ has a standard error of about a point on RouterBench's 946 test prompts, so claims rest on
the mean over splits (`summarize`: mean, standard deviation and count per router and metric).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from routers.base import make_router
from routers.features import Featurizer, Features
from routers.offline.data import RoutingData, kfold_indices, train_test_split
from routers.offline.evaluate import evaluate_split
from routers.offline.measure import COST_FRACTIONS, CPT_FRACTIONS, measure, split_context
from routers.offline.progress import ProgressSteps
from routers.offline.settings import EvalSettings

SUMMARY_KEYS = ("aiq", "max_quality", "accuracy_at_best_cost", "cost_at_best_accuracy", "cost_ratio_at_best_accuracy",
                *(f"accuracy_at_{int(f * 100)}pct_best_cost" for f in COST_FRACTIONS), "auc_within_suite", "apgr",
                *(f"cpt{int(f * 100)}" for f in CPT_FRACTIONS))


def summarize(reports: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float | None]]]:
    """Mean, standard deviation and count over several split reports, per router and metric (metrics
    missing in a split, e.g. a cost never reached, are left out of that metric's mean)."""
    names = list(dict.fromkeys(n for r in reports for n in r["routers"]))
    out: dict[str, dict[str, dict[str, float | None]]] = {}
    for name in [*names, "zero_router"]:
        metrics: dict[str, dict[str, float | None]] = {}
        for key in SUMMARY_KEYS:
            values = [(r["zero_router"] if name == "zero_router" else r["routers"].get(name, {})).get(key) for r in reports]
            values = [v for v in values if v is not None]
            if values:
                metrics[key] = {"mean": float(np.mean(values)), "std": float(np.std(values, ddof=1)) if len(values) > 1 else 0.0,
                                "n": len(values)}
        out[name] = metrics
    refs = [r["reference"] for r in reports]
    out["reference"] = {"accuracy": {"mean": float(np.mean([r["accuracy"] for r in refs]))},
                        "cost_usd": {"mean": float(np.mean([r["cost_usd"] for r in refs]))}}
    return out


def _features_of(featurizer: Featurizer, data: RoutingData) -> Features:
    return featurizer.transform(data.prompts, data.has_tools)


def evaluate_resplits(train: RoutingData, test: RoutingData, settings: EvalSettings = EvalSettings(), *,
                      num_splits: int = 5, featurizer: Featurizer | None = None,
                      steps: ProgressSteps | None = None) -> dict[str, Any]:
    """Pool train and test, re-draw `num_splits` train/test splits of the same test size (stratified by
    suite, seeds settings.seed + i), evaluate each. Returns {"splits": [reports], "summary": summarize(...)}.
    `steps` counts one step per split and learned router."""
    pool = RoutingData.concat([train, test])
    featurizer = featurizer or Featurizer()
    feats = _features_of(featurizer, pool)
    reports = []
    for i in range(num_splits):
        tr, te = train_test_split(pool.num_prompts, test.num_prompts, seed=settings.seed + i, stratify=pool.suites)
        report = evaluate_split(pool.subset(tr), pool.subset(te), settings, features=(feats.subset(tr), feats.subset(te)),
                                featurizer=featurizer,
                                on_router=steps and (lambda t, i=i: steps.step(f"split {i + 1}/{num_splits}, {t}")))
        report["seed"] = settings.seed + i
        reports.append(report)
    return {"splits": reports, "summary": summarize(reports)}


def evaluate_kfold(data: RoutingData, settings: EvalSettings = EvalSettings(), *, k: int = 5,
                   seeds: Sequence[int] = (0,), group_by: str | None = None,
                   featurizer: Featurizer | None = None,
                   progress: Callable[[int, int, str], None] | None = None) -> dict[str, Any]:
    """k-fold cross-validation (RouteLLM's pairs): for each seed, each fold is the test set once.

    Args:
        group_by: "suite" or "subject" to hold whole groups out of training (e.g. MMLU subjects).
        progress: called with (steps done, total steps, label) where a step is one learned router fitted and
            measured on one fold, total = folds x seeds x learned types; first with 0 done while the prompts
            are encoded.
    Returns:
        {"folds": [reports, each with "seed" and "fold"], "summary": summarize(...)}.
    """
    featurizer = featurizer or Featurizer()
    groups = data.groups(group_by) if group_by else None
    splits = [(seed, fold, tr, te) for seed in seeds
              for fold, (tr, te) in enumerate(kfold_indices(data.num_prompts, k, seed=seed, groups=groups))]
    steps = ProgressSteps(len(splits) * len(settings.types), progress)
    steps.start(f"encoding {data.num_prompts} prompts")
    feats = _features_of(featurizer, data)
    reports = []
    for seed, fold, tr, te in splits:
        where = f"fold {fold + 1}/{k}" + (f" of seed {seed}" if len(seeds) > 1 else "")
        report = evaluate_split(data.subset(tr), data.subset(te), settings, featurizer=featurizer,
                                features=(feats.subset(tr), feats.subset(te)),
                                on_router=lambda t, where=where: steps.step(f"{where}, {t}"))
        report.update(seed=seed, fold=fold)
        reports.append(report)
    return {"folds": reports, "summary": summarize(reports)}


# --- adding a model -------------------------------------------------------------------------------------

def evaluate_add_model(train: RoutingData, test: RoutingData, type_: str, new_model: str, *,
                       num_labelled: int = 300, settings: EvalSettings = EvalSettings(),
                       featurizer: Featurizer | None = None,
                       features: tuple[Features, Features] | None = None) -> dict[str, Any]:
    """Train `type_` on every model but `new_model`, add `new_model` from `num_labelled` random training
    prompts (`Router.add_model`, the others untouched), and compare with a full retrain on all models.

    Returns:
        {"added": metrics, "full": metrics, "aiq_gap": full AIQ - added AIQ, "new_model_max_share": the
         largest share of test prompts routed to the new model over the lambda sweep, "num_labelled"}.
    Raises:
        KeyError: `new_model` is not among the models. NotImplementedError: the router cannot add a model.
    """
    if new_model not in train.models:
        raise KeyError(f"{new_model!r} is not among {train.models}")
    if features is None:
        featurizer = featurizer or Featurizer()
        features = (featurizer.transform(train.prompts, train.has_tools),
                    featurizer.transform(test.prompts, test.has_tools))
    train_feats, test_feats = features
    settings = EvalSettings(types=(), baselines=(), options=settings.options, num_lambdas=settings.num_lambdas,
                            pair=settings.pair, seed=settings.seed, keep_curves=True, cascade=False)
    ctx = split_context(train, test, settings)
    options = settings.options.get(type_, {})
    full = make_router(type_, train.models, **options).fit(train, train_feats)
    others = [m for m in train.models if m != new_model]
    router = make_router(type_, others, **options).fit(train.select_models(others), train_feats)
    labelled = np.sort(np.random.default_rng(settings.seed).choice(train.num_prompts, size=num_labelled, replace=False))
    router.add_model(new_model, train.subset(labelled), train_feats.subset(labelled))
    quality = router.predict(test_feats, test.suites)[:, [router.models.index(m) for m in test.models]]
    added, retrained = measure(ctx, quality), measure(ctx, full.predict(test_feats, test.suites))
    j = test.models.index(new_model)
    return {"type": type_, "new_model": new_model, "num_labelled": num_labelled, "added": added, "full": retrained,
            "aiq_gap": retrained["aiq"] - added["aiq"],
            "new_model_max_share": float(np.max(np.asarray(added["curve"]["share"])[:, j]))}
