"""The cascade offline: its escalation-threshold sweep on recorded outcomes, and the threshold's calibration.

    steps = efficient_steps(train.scores, train.costs)                  # model columns, cheapest first
    result = cascade_sweep(quality[:, steps], test.scores, test.costs, steps)   # a calibration.Sweep
    t = calibrate_cascade(quality[:, steps], steps, CalibrationTarget.parse("cost=0.001"), scores=..., costs=...)

A cascade (FrugalGPT, Chen, Zaharia and Zou 2023, arXiv:2305.05176) asks its steps in order of cost and
returns the first answer whose score reaches the threshold; the last step always answers. Offline the
rule is `routers.cascade.replay_cascade` on a score per prompt and step:

    - the router's predicted quality of the step's model (the gateway's `scorer: router`,
      `routers.cascade.PredictedQuality`): a step scored below the threshold is skipped before its model
      is called, so a prompt pays only the step that answers (`pays_rejected=False`);
    - a judge's verdict on the answer (`scorer: judge`): every step up to the answering one was called and
      is paid (`pays_rejected=True`). With the recorded scores as verdicts this is a perfect judge, the
      ceiling of any judge-scored cascade (the judge's own calls not counted).
    - an answer checker's P(correct) of each step's recorded answer (`scorer: answer`,
      `cascade_answer_scores`, `routers.answer_check`): every step called is paid, as with a judge.

One threshold is shared by every step (the gateway's `threshold: 0.5`); its sweep gives the cascade's
cost-quality curve, measured like a router's lambda sweep (AIQ, accuracy at cost, ...), and
`calibrate_cascade` sets it from the same `calibration.CalibrationTarget` as a router's knob (`calibration.select_setting`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from routers.cascade import replay_cascade
from routers.offline.calibration import DEFAULT_GRID_SIZE, CalibrationTarget, Sweep, select_setting
from routers.offline.data import RoutingData


def efficient_steps(scores: np.ndarray, costs: np.ndarray, candidates: Sequence[int] | None = None) -> list[int]:
    """The cascade's default steps: the models on the cost-accuracy frontier, cheapest first.

    Walking the models by mean cost (ties: the more accurate first), a model is kept when it is strictly more
    accurate than every cheaper one kept; a dominated model (another is cheaper and at least as accurate)
    never helps a cascade.

    Args:
        scores, costs: [N, M] recorded scores and USD (NaN cells left out of the means).
        candidates: the columns allowed (default: all).
    Returns:
        column indices, ascending mean cost and strictly ascending mean score; the last is the most accurate
        model (ties: the cheaper one).
    """
    cols = list(range(scores.shape[1])) if candidates is None else list(candidates)
    acc, cost = np.nanmean(scores[:, cols], axis=0), np.nanmean(costs[:, cols], axis=0)
    steps: list[int] = []
    best = -np.inf
    for i in np.lexsort((-acc, cost)):
        if acc[i] > best:
            steps.append(cols[i])
            best = acc[i]
    return steps


ORDER_TOLERANCE = 0.05   # a step may cost up to 5% more than the next (near-equal models: either order)


def check_step_order(names: Sequence[str], models: Sequence[str], costs: np.ndarray) -> list[int]:
    """The model columns of a cascade given by name, checked to go cheapest first.

    Args:
        names: [S] the steps' model names, in escalation order.
        models: [M] the column names of `costs`.
        costs: [N, M] recorded USD (NaN cells left out of the means).
    Returns:
        [S] column indices.
    Raises:
        KeyError: a name is not a column.
        ValueError: fewer than two steps, a model twice, a step without a recorded cost, or a step costing more
            on average than ORDER_TOLERANCE over the one after it (a cascade asks its cheapest model first; an
            expensive first step answers nearly every prompt at its price).
    """
    unknown = [m for m in names if m not in models]
    if unknown:
        raise KeyError(f"cascade model(s) {unknown} are not among the models {list(models)}")
    if len(names) < 2:
        raise ValueError(f"a cascade needs at least two models, got {list(names)}")
    if len(set(names)) < len(names):
        raise ValueError(f"a cascade asks each model once, got {list(names)}")
    steps = [list(models).index(m) for m in names]
    step_costs = np.asarray(costs, dtype=np.float64)[:, steps]
    counted = np.isfinite(step_costs).any(axis=0)
    if not counted.all():
        raise ValueError(f"no recorded cost of cascade model(s) {[m for m, ok in zip(names, counted) if not ok]}")
    mean_cost = np.nanmean(step_costs, axis=0)
    for a, b, ca, cb in zip(names, names[1:], mean_cost, mean_cost[1:]):
        if ca > cb * (1 + ORDER_TOLERANCE):
            cheapest_first = [names[i] for i in np.argsort(mean_cost, kind="stable")]
            raise ValueError(f"a cascade's models go cheapest first, but {a} (${ca * 1e3:.4g} per 1k requests) costs "
                             f"more than {b} (${cb * 1e3:.4g}) after it; give them as {','.join(cheapest_first)}")
    return steps


def threshold_grid(step_scores: np.ndarray, num: int = DEFAULT_GRID_SIZE) -> np.ndarray:
    """[K] ascending escalation thresholds: `num - 1` quantiles of the scores of every step but the last
    (the smallest accepts every prompt at the first step) and one just above the largest (every prompt goes
    to the last step).

    Args:
        step_scores: [N, S] scores, S >= 2.
    """
    values = np.asarray(step_scores, dtype=np.float64)[:, :-1]
    values = values[np.isfinite(values)]
    if values.size == 0:
        return np.array([0.0])
    inner = np.quantile(values, np.linspace(0.0, 1.0, max(num - 1, 1)))
    return np.unique(np.concatenate([inner, [np.nextafter(values.max(), np.inf)]]))


def cascade_picks(step_scores: np.ndarray, costs: np.ndarray, steps: Sequence[int], thresholds: np.ndarray, *,
                  pays_rejected: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Each threshold's answering model and cost per prompt.

    Args:
        step_scores: [N, S] the scorer's score of each step on each prompt.
        costs: [N, M] recorded USD of every model column.
        steps: [S] the model column of each step, in escalation order.
        thresholds: [K].
        pays_rejected: see the module docstring.
    Returns:
        (picks [K, N] int model column that answered, cost [K, N] USD paid).
    Raises:
        ValueError: fewer than two steps, or `step_scores` not [N, len(steps)].
    """
    steps = np.asarray(steps, dtype=np.int64)
    step_scores = np.asarray(step_scores, dtype=np.float64)
    if steps.size < 2 or step_scores.shape != (len(costs), steps.size):
        raise ValueError(f"need [N, S>=2] step scores for {steps.size} steps, got {step_scores.shape}")
    step_costs = np.asarray(costs, dtype=np.float64)[:, steps]
    picks, paid = [], []
    for t in np.asarray(thresholds, dtype=np.float64):
        answered, cost = replay_cascade(step_scores, step_costs, float(t), pays_rejected=pays_rejected)
        picks.append(steps[answered])
        paid.append(cost)
    return np.stack(picks), np.stack(paid)


def cascade_sweep(step_scores: np.ndarray, scores: np.ndarray, costs: np.ndarray, steps: Sequence[int], *,
                  thresholds: np.ndarray | None = None, pays_rejected: bool = False,
                  num_thresholds: int = DEFAULT_GRID_SIZE) -> Sweep:
    """Every threshold's cascade charged on recorded outcomes.

    Args:
        step_scores: [N, S] scores of the steps (the router's predicted quality of each step's model).
        scores, costs: [N, M] recorded scores and USD of every model column.
        steps: [S] model columns in escalation order.
        thresholds: [K] (default `threshold_grid(step_scores, num_thresholds)`).
    Returns:
        a `calibration.Sweep`: knob = thresholds [K], mean cost [K] USD per request (every called step paid),
        mean quality [K] (the answering model's recorded score), share [K, M] of prompts each model answered.
    """
    knobs = threshold_grid(step_scores, num_thresholds) if thresholds is None else np.asarray(thresholds, dtype=np.float64)
    picks, paid = cascade_picks(step_scores, costs, steps, knobs, pays_rejected=pays_rejected)
    rows = np.arange(picks.shape[1])
    m = np.asarray(scores).shape[1]
    return Sweep(knobs, np.nanmean(paid, axis=1), np.nanmean(np.asarray(scores)[rows, picks], axis=1),
                 np.stack([np.bincount(p, minlength=m) / len(p) for p in picks]))


def calibrate_cascade(step_scores: np.ndarray, steps: Sequence[int], target: CalibrationTarget, *, scores: np.ndarray,
                      costs: np.ndarray, models: list[str] | None = None, pays_rejected: bool = False) -> float:
    """The escalation threshold that meets `target` on held-out prompts (as `calibration.calibrate` sets a
    router's lambda): cost = mean USD per request, share:MODEL = share of prompts MODEL answers, quality =
    fraction of the best single model's mean score (over the columns of `scores`).

    Args:
        step_scores: [N, S] the router's predicted quality of each step's model.
        steps: [S] model columns (of `scores`/`costs`), cheapest first.
        scores, costs: [N, M] recorded outcomes.
        models: [M] names (for a share target).
    Raises:
        ValueError: as `calibration.select_setting`, or fewer than two steps.
    """
    result = cascade_sweep(step_scores, scores, costs, steps, pays_rejected=pays_rejected)
    i = select_setting(result, target, models=models, reference_quality=np.nanmean(scores, axis=0))
    return float(result.knob[i])


def answer_check_gap(train: RoutingData, test: RoutingData, steps: Sequence[int]) -> str | None:
    """Why `cascade_answer_scores` cannot score the cascade over `steps` ([S] model columns, cheapest first), in
    words naming the step's model and the count ("weak has no recorded answer on 7 of 80 prompts", counted
    over train and test together); None when it can. An empty answer ("") is a recorded answer; only None is not.
    """
    num = train.num_prompts + test.num_prompts
    for j in steps[:-1]:
        model = train.models[j]
        answers = [*(train.responses[:, j] if train.responses is not None else [None] * train.num_prompts),
                   *(test.responses[:, j] if test.responses is not None else [None] * test.num_prompts)]
        missing = sum(a is None for a in answers)
        if missing:
            return f"{model} has no recorded answer on {missing} of {num} prompts (a null or absent response)"
        labels = train.scores[:, j]
        if np.isnan(labels).any():
            return f"{model} has no score on {int(np.isnan(labels).sum())} of {train.num_prompts} training prompts"
        if (labels >= 0.5).all() or (labels < 0.5).all():
            return (f"{model}'s {train.num_prompts} training answers are all {'right' if labels[0] >= 0.5 else 'wrong'}; "
                    "a checker learns from right and wrong ones")
    return None


def cascade_answer_scores(train: RoutingData, test: RoutingData, steps: Sequence[int], **options) -> np.ndarray | None:
    """[N_test, S] an answer checker's P(correct) of each step's recorded answer on the test prompts (the last
    column 0: the last step always answers), each step's checker fitted on its training answers; None when a
    step but the last has an answer missing (None; an empty string is an answer) or no wrong (or no right)
    training answer (`answer_check_gap` says which).

    Args:
        steps: [S] model columns of the cascade, cheapest first.
        options: `AnswerChecker` arguments.
    """
    from routers.answer_check import AnswerChecker

    if answer_check_gap(train, test, steps) is not None:
        return None

    def signals(data: RoutingData, j: int) -> list | None:
        return None if data.signals is None else list(data.signals[:, j])

    out = np.zeros((test.num_prompts, len(steps)))
    for s, j in enumerate(steps[:-1]):
        checker = AnswerChecker(**options).fit(train.prompts, list(train.responses[:, j]), train.scores[:, j],
                                               signals(train, j))
        out[:, s] = checker.predict(test.prompts, list(test.responses[:, j]), signals(test, j))
    return out


def with_sample_costs(data: RoutingData, columns: Sequence[int]) -> RoutingData:
    """`data` with each answer of `columns` also charged its recorded extra samples (`signals` "samples_cost_usd":
    what a plan reading the agreement signal pays before it decides); answers without them unchanged."""
    costs = data.costs.copy()
    if data.signals is not None:
        for j in columns:
            extra = [(s or {}).get("samples_cost_usd") or 0.0 for s in data.signals[:, j]]
            costs[:, j] = costs[:, j] + np.asarray(extra, dtype=np.float64)
    return replace(data, costs=costs)
