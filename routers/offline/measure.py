"""Measuring one router on one test split: its knob sweep charged on the recorded outcomes, and the metrics.

    ctx = split_context(train, test, settings)          # the cost model, the best single model, AIQ's range
    metrics = measure(ctx, quality)                     # a router's lambda sweep: AIQ, accuracy at cost, APGR...
    metrics = measure_cascade(ctx, quality[:, ctx.steps])   # a cascade's threshold sweep, the same metrics

`routers.offline.evaluate` decides what is measured (routers, baselines, cascades, hybrids); the metrics are
those of `routers.offline.metrics` (RouterBench's AIQ, RouteLLM's APGR and CPT), see its docstring.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from routers.decision import CostModel, choose, estimate_prompt_tokens
from routers.offline.calibration import lambda_grid
from routers.offline.cascade_eval import cascade_picks, check_step_order, efficient_steps, threshold_grid
from routers.offline.data import RoutingData
from routers.offline.metrics import (accuracy_at_cost, aiq, apgr, cost_at_accuracy, cost_quality_curve, cpt,
                                     threshold_curve, within_suite_auc)
from routers.offline.settings import EvalSettings

COST_FRACTIONS = (0.25, 0.5)            # accuracy reachable at these fractions of the best model's cost
CPT_FRACTIONS = (0.5, 0.8)


def _lists(x: np.ndarray, digits: int = 8) -> list:
    return np.round(np.asarray(x, dtype=np.float64), digits).tolist()


def _nan_to_none(value: float) -> float | None:
    return None if value is None or not np.isfinite(value) else float(value)


@dataclass
class SplitContext:
    """What every router of one split is measured against (`split_context`)."""

    test: RoutingData
    expected_cost: np.ndarray           # [N, M] USD, the training cost model on the test prompts
    best: int                           # the best single model (test accuracy; ties: cheaper)
    c_min: float                        # AIQ's cost range, USD per request
    c_max: float
    pair: tuple[int, int] | None
    settings: EvalSettings
    singles: np.ndarray | None = None   # [M] bool: a single model's column (False: an ensemble's)
    steps: list[int] | None = None      # the cascade's model columns, cheapest first (None: no cascade)

    def __post_init__(self) -> None:
        if self.singles is None:
            self.singles = np.ones(self.test.num_models, dtype=bool)


def _curve_metrics(ctx: SplitContext, cost: np.ndarray, qual: np.ndarray) -> dict[str, Any]:
    """AIQ and the reference points of one sweep: mean cost [K] USD per request, mean quality [K]."""
    test = ctx.test
    best_acc, best_cost = float(np.nanmean(test.scores[:, ctx.best])), float(np.nanmean(test.costs[:, ctx.best]))
    at_best_acc = cost_at_accuracy(cost, qual, best_acc)
    return {
        "aiq": aiq(cost, qual, ctx.c_min, ctx.c_max),
        "max_quality": float(np.nanmax(qual)),
        "accuracy_at_best_cost": _nan_to_none(accuracy_at_cost(cost, qual, best_cost)),
        "cost_at_best_accuracy": _nan_to_none(at_best_acc),
        "cost_ratio_at_best_accuracy": _nan_to_none(at_best_acc / best_cost) if best_cost > 0 else None,
        **{f"accuracy_at_{int(f * 100)}pct_best_cost": _nan_to_none(accuracy_at_cost(cost, qual, f * best_cost))
           for f in COST_FRACTIONS},
    }


def _pair_metrics(ctx: SplitContext, gain: np.ndarray) -> dict[str, Any]:
    """RouteLLM's APGR and CPTs of a strong-model score `gain` [N] (higher: send to the strong model)."""
    strong, weak = ctx.pair
    test = ctx.test
    s_q, w_q = float(np.nanmean(test.scores[:, strong])), float(np.nanmean(test.scores[:, weak]))
    share, tq = threshold_curve(gain, test.scores, strong, weak, ctx.settings.num_thresholds)
    out: dict[str, Any] = {"apgr": apgr(share, tq, w_q, s_q) if s_q != w_q else None}
    for f in CPT_FRACTIONS:
        out[f"cpt{int(f * 100)}"] = _nan_to_none(cpt(f, share, tq, w_q, s_q))
    if ctx.settings.keep_curves:
        out["threshold_curve"] = {"strong_share": _lists(share), "quality": _lists(tq)}
    return out


def _curve(knob_name: str, knobs: np.ndarray, cost: np.ndarray, qual: np.ndarray, picks: np.ndarray, m: int) -> dict:
    shares = np.stack([np.bincount(p, minlength=m) / len(p) for p in picks])
    return {knob_name: _lists(knobs, 10), "cost_usd": _lists(cost, 10), "quality": _lists(qual), "share": _lists(shares, 4)}


def measure(ctx: SplitContext, quality: np.ndarray) -> dict[str, Any]:
    """Metrics of one router's predicted quality [N, M] on the test prompts (NaN: a column it may not choose):
    the lambda sweep charged on the recorded outcomes, its AIQ and reference points, the within-suite AUC of
    its predictions (`metrics.within_suite_auc`), and for a pair RouteLLM's APGR and CPTs (keys as in
    `evaluate_split`; "curve" and "threshold_curve" when settings.keep_curves)."""
    test = ctx.test
    lambdas = lambda_grid(quality, ctx.expected_cost, ctx.settings.num_lambdas)
    picks = np.stack([choose(quality, ctx.expected_cost, lam) for lam in lambdas])
    cost, qual = cost_quality_curve(picks, test.scores, test.costs)
    out = _curve_metrics(ctx, cost, qual)
    out["auc_within_suite"] = within_suite_auc(quality, test.scores, test.suites)
    if ctx.pair is not None:
        strong, weak = ctx.pair
        out.update(_pair_metrics(ctx, quality[:, strong] - quality[:, weak]))
    if ctx.settings.keep_curves:
        out["curve"] = _curve("lambda", lambdas, cost, qual, picks, test.num_models)
    return out


def measure_cascade(ctx: SplitContext, step_scores: np.ndarray, *, pays_rejected: bool = False) -> dict[str, Any]:
    """Metrics of the cascade over ctx.steps scored by `step_scores` [N, S] (see the module docstring): the
    threshold sweep charged on the recorded outcomes ("curve" has "threshold" in place of "lambda"), its AIQ
    and reference points; for a pair whose steps are (weak, strong), APGR and CPTs of escalating the prompts
    of lowest weak-step score first."""
    test = ctx.test
    thresholds = threshold_grid(step_scores, ctx.settings.num_lambdas)
    picks, paid = cascade_picks(step_scores, test.costs, ctx.steps, thresholds, pays_rejected=pays_rejected)
    rows = np.arange(test.num_prompts)
    cost, qual = np.nanmean(paid, axis=1), np.nanmean(test.scores[rows, picks], axis=1)
    out = {**_curve_metrics(ctx, cost, qual), "steps": [test.models[j] for j in ctx.steps],
           "pays_rejected": pays_rejected}
    if ctx.pair is not None and list(ctx.steps) == [ctx.pair[1], ctx.pair[0]]:
        out.update(_pair_metrics(ctx, -step_scores[:, 0]))
    if ctx.settings.keep_curves:
        out["curve"] = _curve("threshold", thresholds, cost, qual, picks, test.num_models)
    return out


def split_context(train: RoutingData, test: RoutingData, settings: EvalSettings) -> SplitContext:
    """The cost model fitted on `train` applied to `test`, the best single model, AIQ's cost range, the
    strong/weak pair (settings.pair, else the two single models when there are two) and the cascade's steps.

    Raises:
        KeyError: settings.pair, cascade_models or ensembles name a model the data lacks.
        ValueError: settings.cascade_models are not cheapest first on the training costs.
    """
    costs = CostModel.from_data(train)
    expected = costs.expected_cost(estimate_prompt_tokens(test.prompts), test.suites)
    acc, mean_cost = np.nanmean(test.scores, axis=0), np.nanmean(test.costs, axis=0)
    missing = [m for m in (*settings.ensembles, *(settings.cascade_models or ())) if m not in test.models]
    if missing:
        raise KeyError(f"unknown models {missing}; the data has {test.models}")
    singles = np.array([m not in settings.ensembles for m in test.models])
    single_cols = np.flatnonzero(singles)
    best = int(single_cols[np.lexsort((mean_cost[singles], -acc[singles]))[0]])
    pair = None
    if settings.pair is not None:
        pair = (test.models.index(settings.pair[0]), test.models.index(settings.pair[1]))
    elif len(single_cols) == 2:
        strong = best
        pair = (strong, int(single_cols[single_cols != strong][0]))
    steps = None
    if settings.cascade:
        if settings.cascade_models is not None:     # ordered by the training set's costs (the router's view)
            steps = check_step_order(settings.cascade_models, train.models, train.costs)
        else:
            steps = efficient_steps(train.scores, train.costs, single_cols)
        steps = steps if len(steps) >= 2 else None
    # AIQ's cost range as in RouterBench's code: from 0 to the largest cost compared (here the priciest
    # column, ensembles included), so a router earns nothing below its cheapest operating point
    return SplitContext(test, expected, best, 0.0, float(mean_cost.max()), pair, settings, singles, steps)
