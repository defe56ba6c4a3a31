"""Offline evaluation of routers on recorded outcomes, next to the baselines any claim must beat.

    report = evaluate_split(train, test, EvalSettings(types=("knn", "lgbm", "mf")))      # one train/test pair

(Re-drawn splits, k-fold cross-validation and the add-a-model check are in `crossval.py`; the sweeps and
metrics of one split in `measure.py`.)

Each router is fitted on the training prompts, predicts the quality of every model on the test prompts
once, and the decision rule (argmax quality - lambda * expected cost, `decision.choose`) is swept over a
grid of lambdas; each lambda's picks are charged the recorded scores and costs of the test prompts. From
that cost-quality curve come RouterBench's AIQ (over costs from 0 to the priciest column's, as in
RouterBench's code), the accuracy reachable at a fraction of the best single model's cost and the cost of reaching its accuracy;
for a strong/weak pair also RouteLLM's APGR, CPT(50%) and CPT(80%) from its 10-quantile threshold sweep
on the predicted gain. Baselines: each single model (points), the zero router (their convex hull),
random, best model per task (for each lambda, per suite the model maximising training accuracy minus
lambda times cost), prompt length alone, and the oracle (the test scores themselves).

In the same replay (settings.cascade): each learned router's cascade, "cascade:<type>", over the training
set's cost-accuracy frontier (`cascade_eval.efficient_steps`; a pair: weak then strong), escalating while the
router's predicted quality of the step's model is below a threshold; the threshold sweep is its curve, each
point charged only the step that answered (a predicted-quality scorer skips a step before calling it); and
"cascade:oracle", a perfect judge that pays every step it called; with recorded answers (RouteLLM's GSM8K,
RouterBench) and settings.answer_check, "cascade:answer", each step's answer scored by `routers.answer_check.AnswerChecker` fitted on
that step's training answers, paying every step it called. With ensemble columns (settings.ensembles:
outcomes of a Mixture-of-Agents or other multi-call policy, e.g. "link/moa" in `link eval run` outcomes) the
routers and baselines choose among the single models only, and "hybrid:<type>" (a router fitted on every
column) chooses between the single models and the ensembles, like the gateway's `hybrid` policy. Recorded
sets without such a column (RouterBench, RouteLLM) get no hybrid entry.
The report is a JSON-able dict (`routers.offline.plot` draws it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from routers.base import Router, make_router
from routers.features import Featurizer, Features
from routers.offline.cascade_eval import answer_check_gap, cascade_answer_scores, with_sample_costs
from routers.offline.data import RoutingData
from routers.offline.measure import measure, measure_cascade, split_context
from routers.offline.metrics import aiq
from routers.offline.settings import EvalSettings


def _baseline(name: str, models: list[str], seed: int) -> Router:
    """An unfitted baseline router of `routers.baselines`, by its registry name."""
    return make_router(name, models, seed=seed) if name == "random" else make_router(name, models)


# --- one train/test pair --------------------------------------------------------------------------------

def _fitted(type_: str, train: RoutingData, train_feats: Features, settings: EvalSettings) -> Router:
    return make_router(type_, train.models, **settings.options.get(type_, {})).fit(train, train_feats)


def evaluate_split(train: RoutingData, test: RoutingData, settings: EvalSettings = EvalSettings(), *,
                   featurizer: Featurizer | None = None, features: tuple[Features, Features] | None = None,
                   extra: dict[str, np.ndarray] | None = None,
                   on_router: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Fit every router on `train`, measure it on `test` (both complete rows, the same models).

    Args:
        featurizer: reads the prompts (default `Featurizer()`: MiniLM with the disk cache).
        features: precomputed (train, test) features instead.
        extra: more entries, name -> predicted quality [N_test, M] (e.g. a router fitted elsewhere).
        on_router: called with each learned router type once it is fitted and measured (progress).
    Returns:
        {"models", "num_train", "num_test", "reference": {best single model, accuracy, cost_usd}, "cost_range",
         "pair", "ensembles", "single_models": {name: {accuracy, cost_usd}} (ensemble columns too),
         "zero_router": {aiq}, "routers": {name: metrics}}: metrics as in the module docstring; the cascade
         entries also name their "steps"; costs in mean USD per request, shares and CPTs as fractions; with
         settings.answer_check and no "cascade:answer", "not_measured": {"cascade:answer": why, in words}.
    The test columns are put in the training order when both hold the same models in another order.

    Raises:
        ValueError: different models in train and test (naming those on one side only), or missing scores in test.
        KeyError: settings name a model the data lacks.
    """
    test = test.aligned_to(train.models)
    if np.isnan(test.scores).any():
        raise ValueError("the test set has missing scores; use complete_rows()")
    if features is None:
        featurizer = featurizer or Featurizer()
        features = (featurizer.transform(train.prompts, train.has_tools),
                    featurizer.transform(test.prompts, test.has_tools))
    train_feats, test_feats = features
    ctx = split_context(train, test, settings)
    singles = [m for m, single in zip(test.models, ctx.singles) if single]
    acc, mean_cost = np.nanmean(test.scores, axis=0), np.nanmean(test.costs, axis=0)
    report: dict[str, Any] = {
        "models": test.models, "num_train": train.num_prompts, "num_test": test.num_prompts,
        "reference": {"model": test.models[ctx.best], "accuracy": float(acc[ctx.best]),
                      "cost_usd": float(mean_cost[ctx.best])},
        "cost_range": [ctx.c_min, ctx.c_max],
        "pair": None if ctx.pair is None else {"strong": test.models[ctx.pair[0]], "weak": test.models[ctx.pair[1]]},
        "ensembles": list(settings.ensembles),
        "single_models": {m: {"accuracy": float(a), "cost_usd": float(c)} for m, a, c in zip(test.models, acc, mean_cost)},
        "zero_router": {"aiq": aiq(mean_cost[ctx.singles], acc[ctx.singles], ctx.c_min, ctx.c_max)},
        "routers": {},
    }
    single_train = train.select_models(singles)

    def over_singles(quality: np.ndarray) -> np.ndarray:
        """[N, M_singles] -> [N, M] with NaN in the ensemble columns (never chosen)."""
        full = np.full((test.num_prompts, test.num_models), np.nan)
        full[:, ctx.singles] = quality
        return full

    learned = {}
    for type_ in settings.types:
        learned[type_] = over_singles(_fitted(type_, single_train, train_feats, settings).predict(test_feats, test.suites))
        report["routers"][type_] = measure(ctx, learned[type_])
        if on_router is not None:
            on_router(type_)
    for name in settings.baselines:
        if name == "oracle":
            quality = over_singles(test.scores[:, ctx.singles])
        else:
            quality = over_singles(_baseline(name, singles, settings.seed).fit(single_train, train_feats)
                                   .predict(test_feats, test.suites))
        report["routers"][name] = measure(ctx, quality)
    if ctx.steps is not None:
        for type_, quality in learned.items():
            report["routers"][f"cascade:{type_}"] = measure_cascade(ctx, quality[:, ctx.steps])
        report["routers"]["cascade:oracle"] = measure_cascade(ctx, test.scores[:, ctx.steps], pays_rejected=True)
        if settings.answer_check:
            gap = answer_check_gap(train, test, ctx.steps)
            if gap is None:
                embedder = getattr(featurizer, "embedder", None)   # the featurizer's encoder, else the default one
                options = {"embed": getattr(embedder, "embed", None), **settings.options.get("answer", {})}
                answer_scores = cascade_answer_scores(train, test, ctx.steps, **options)
                paying = ctx   # reading the agreement signal pays the cheap steps' extra samples too
                if "agreement" in options.get("signal_families", ()):
                    paying = replace(ctx, test=with_sample_costs(test, ctx.steps[:-1]))
                report["routers"]["cascade:answer"] = measure_cascade(paying, answer_scores, pays_rejected=True)
            else:
                report["not_measured"] = {"cascade:answer": gap}
    if settings.ensembles:
        for type_ in settings.types:
            report["routers"][f"hybrid:{type_}"] = measure(ctx, _fitted(type_, train, train_feats, settings)
                                                           .predict(test_feats, test.suites))
        report["routers"]["hybrid:oracle"] = measure(ctx, test.scores.copy())
    for name, quality in (extra or {}).items():
        report["routers"][name] = measure(ctx, quality)
    return report
