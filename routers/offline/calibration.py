"""Calibration, offline: the decision rule's knob swept on held-out prompts and set to meet a target.

    grid = lambda_grid(quality, expected)                               # [K] the cost penalties worth trying
    result = sweep(quality, expected, scores=held_out.scores, costs=held_out.costs)   # each knob's outcome
    lam = calibrate(quality, expected, CalibrationTarget.parse("cost=0.001"), costs=held_out.costs)

A knob is a router's cost penalty lambda (`routers.decision.choose`) or RouteLLM's threshold on the predicted
gain of a strong/weak pair (`routers.decision.choose_threshold`); a cascade's escalation threshold is set by
the same `select_setting` (`routers.offline.cascade_eval.calibrate_cascade`). Each knob's picks are charged the
recorded scores and costs; `select_setting` keeps the one meeting the target (`CalibrationTarget`: an average cost, a
model's share of requests, a fraction of the best single model's quality).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

import numpy as np

from routers.decision import choose

DEFAULT_GRID_SIZE = 256


def lambda_grid(quality: np.ndarray, expected_cost: np.ndarray, num: int = DEFAULT_GRID_SIZE) -> np.ndarray:
    """[K] ascending cost penalties from 0 to past the last switch, for sweeping the rule.

    The picks of one prompt change only at the breakpoints (q_i - q_j) / (c_i - c_j) > 0 of its model pairs;
    the grid holds 0, `num - 2` quantiles of all breakpoints, and twice the largest (where every prompt gets
    its cheapest model, up to quality ties).
    """
    q, c = np.asarray(quality, dtype=np.float64), np.asarray(expected_cost, dtype=np.float64)
    dq = q[:, :, None] - q[:, None, :]
    dc = c[:, :, None] - c[:, None, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        bp = dq / dc
    bp = bp[np.isfinite(bp) & (bp > 0) & (dc > 0)]
    if bp.size == 0:
        return np.array([0.0])
    inner = np.quantile(bp, np.linspace(0.0, 1.0, max(num - 2, 1)))
    return np.unique(np.concatenate([[0.0], inner, [2.0 * bp.max()]]))


@dataclass(frozen=True)
class CalibrationTarget:
    """What `calibrate` aims for.

    kind "cost": average USD per request <= value; "share": share of requests sent to `model` = value;
    "quality": mean quality >= value x the best single model's mean quality (value in (0, 1]).
    """

    kind: Literal["cost", "share", "quality"]
    value: float
    model: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("cost", "share", "quality"):
            raise ValueError(f"unknown target kind {self.kind!r}; kinds: cost, share, quality")
        if self.kind == "share" and (not self.model or not 0 <= self.value <= 1):
            raise ValueError("a share target needs a model and a value in [0, 1]")
        if self.kind == "quality" and not 0 < self.value <= 1:
            raise ValueError(f"a quality target is a fraction in (0, 1], got {self.value}")
        if self.kind == "cost" and not self.value >= 0:
            raise ValueError(f"a cost target must be >= 0 USD, got {self.value}")

    @classmethod
    def parse(cls, text: str) -> CalibrationTarget:
        """"cost=0.001" | "share:MODEL=0.3" | "quality=0.95". Raises ValueError otherwise."""
        match = re.fullmatch(r"\s*(cost|share|quality)(?::(.+?))?\s*=\s*([0-9.eE+-]+)\s*", text)
        if not match:
            raise ValueError(f"bad target {text!r}; expected cost=USD, share:MODEL=FRACTION or quality=FRACTION")
        kind, model, value = match.groups()
        return cls(kind, float(value), model)  # type: ignore[arg-type]


@dataclass
class Sweep:
    """Outcome of each knob setting on a held-out set: knob [K], mean_cost [K] USD, quality [K], share [K, M]."""

    knob: np.ndarray
    mean_cost: np.ndarray
    quality: np.ndarray
    share: np.ndarray


def _sweep_picks(picks: np.ndarray, knob: np.ndarray, quality: np.ndarray, costs: np.ndarray) -> Sweep:
    """picks [K, N] -> per-setting mean cost, mean quality and share of each model."""
    rows = np.arange(picks.shape[1])
    m = quality.shape[1]
    return Sweep(knob, np.nanmean(costs[rows, picks], axis=1), np.nanmean(quality[rows, picks], axis=1),
                 np.stack([np.bincount(p, minlength=m) / len(p) for p in picks]))


def sweep(quality: np.ndarray, expected_cost: np.ndarray, *, scores: np.ndarray | None = None,
          costs: np.ndarray | None = None, strong: int | None = None, weak: int | None = None,
          knobs: np.ndarray | None = None) -> Sweep:
    """Every knob setting's picks charged on held-out data.

    Args:
        quality, expected_cost: [N, M] the router's predictions.
        scores, costs: [N, M] recorded scores and USD (default: the predictions themselves).
        strong, weak: column indices for the threshold rule (knob = threshold, all distinct predicted gains
            and +inf); else the lambda rule over `knobs` (default `lambda_grid`).
    """
    scores = quality if scores is None else scores
    costs = expected_cost if costs is None else costs
    if strong is not None and weak is not None:
        gain = quality[:, strong] - quality[:, weak]
        knobs = np.concatenate([np.unique(gain[np.isfinite(gain)]), [np.inf]]) if knobs is None else np.asarray(knobs)
        picks = np.where(gain[None, :] >= knobs[:, None], strong, weak)
    else:
        knobs = lambda_grid(quality, expected_cost) if knobs is None else np.asarray(knobs)
        picks = np.stack([choose(quality, expected_cost, lam) for lam in knobs])
    return _sweep_picks(picks, knobs, scores, costs)


def select_setting(result: Sweep, target: CalibrationTarget, *, models: list[str] | None = None,
                   reference_quality: np.ndarray | None = None) -> int:
    """The index of the knob setting in `result` that meets `target` (shared by every knob: a router's lambda
    or threshold, a cascade's escalation threshold).

    - cost: of the settings whose mean cost <= target, the one of highest quality (none: the cheapest).
    - share: the setting whose share of `target.model` is closest to the target (ties: higher quality);
      with a threshold this is RouteLLM's quantile calibration.
    - quality: of the settings reaching target x max(reference_quality), the cheapest (none: the one of
      highest quality).

    Args:
        models: [M] names, the columns of `result.share`, to find a share target's model.
        reference_quality: [M] each single model's mean quality (a quality target's reference).
    Raises:
        ValueError: a share target without `models` or naming an unknown model; a quality target without
            `reference_quality`.
    """
    cost, qual = result.mean_cost, result.quality
    if target.kind == "cost":
        ok = cost <= target.value * (1 + 1e-9)
        return int(np.flatnonzero(ok)[np.argmax(qual[ok])]) if ok.any() else int(np.argmin(cost))
    if target.kind == "share":
        if models is None or target.model not in models:
            raise ValueError(f"share target model {target.model!r} is not among the models {models}")
        miss = np.abs(result.share[:, models.index(target.model)] - target.value)
        close = np.flatnonzero(miss <= miss.min() + 1e-12)
        return int(close[np.argmax(qual[close])])
    if reference_quality is None:
        raise ValueError("a quality target needs the single models' mean quality")
    goal = target.value * float(np.nanmax(reference_quality))
    ok = qual >= goal - 1e-12
    return int(np.flatnonzero(ok)[np.argmin(cost[ok])]) if ok.any() else int(np.argmax(qual))


def calibrate(quality: np.ndarray, expected_cost: np.ndarray, target: CalibrationTarget, *, models: list[str] | None = None,
              scores: np.ndarray | None = None, costs: np.ndarray | None = None,
              strong: int | None = None, weak: int | None = None) -> float:
    """The knob (lambda, or the threshold when `strong` and `weak` are given) that meets `target` on held-out
    prompts, charged with their recorded `scores` and `costs` ([N, M]) when given, else the predictions.
    The setting is chosen by `select_setting` (the best single model's quality: the mean of `scores`).

    Args:
        models: [M] names, to find a share target's model.
    Raises:
        ValueError: a share target without `models` or naming an unknown model.
    """
    quality, expected_cost = np.asarray(quality, dtype=np.float64), np.asarray(expected_cost, dtype=np.float64)
    result = sweep(quality, expected_cost, scores=scores, costs=costs, strong=strong, weak=weak)
    reference = np.nanmean(quality if scores is None else scores, axis=0)
    return float(result.knob[select_setting(result, target, models=models, reference_quality=reference)])
