"""Offline routing metrics: the cost-quality curve, RouterBench's AIQ, RouteLLM's APGR and CPT.

    cost, quality = cost_quality_curve(picks, test.scores, test.costs)   # picks [K, N]: one row per knob
    aiq(cost, quality, c_min, c_max)            # RouterBench (Hu et al. 2024): area under the non-decreasing
                                                # convex hull over [c_min, c_max], divided by c_max - c_min
    share, quality = threshold_curve(gain, scores, strong=0, weak=1)     # RouteLLM's 10 quantile thresholds
    apgr(share, quality, weak_q, strong_q)      # RouteLLM (Ong et al. 2024): average performance gap recovered
    cpt(0.5, share, quality, weak_q, strong_q)  # share of strong calls needed to recover 50% of the gap
    accuracy_at_cost(cost, quality, budget), cost_at_accuracy(cost, quality, target)
    within_suite_auc(predicted, scores, suites)  # how well predicted quality ranks right above wrong answers
                                                # of one model on one suite (0.5: no better than the suite mean)

Costs are mean USD per request and qualities mean scores over the same prompts; shares are fractions in
[0, 1] (RouteLLM prints them as percentages).
"""

from __future__ import annotations

import numpy as np

ROUTELLM_NUM_THRESHOLDS = 10


def _trapezoid(y: np.ndarray, x: np.ndarray) -> float:
    """The trapezoid rule (np.trapezoid needs numpy 2)."""
    return float(np.sum((y[1:] + y[:-1]) / 2 * np.diff(x)))


def cost_quality_curve(picks: np.ndarray, scores: np.ndarray, costs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Charge each knob setting's picks on recorded outcomes.

    Args:
        picks: [K, N] int model index per prompt (or [N] for one setting).
        scores, costs: [N, M] recorded score and USD.
    Returns:
        (mean cost [K] USD per request, mean quality [K]); NaN cells are left out of the means.
    """
    picks = np.atleast_2d(np.asarray(picks, dtype=np.int64))
    rows = np.arange(picks.shape[1])
    return np.nanmean(costs[rows, picks], axis=1), np.nanmean(scores[rows, picks], axis=1)


def nondecreasing_convex_hull(costs, qualities) -> tuple[np.ndarray, np.ndarray]:
    """The upper convex hull of the (cost, quality) points from the cheapest point up to the best one
    (RouterBench's non-decreasing convex hull: mixing two operating points at random reaches any point on the
    segment between them, and more budget never has to lower quality).

    Returns:
        (cost [H], quality [H]) hull vertices, cost ascending, quality non-decreasing.
    Raises:
        ValueError: no finite point.
    """
    x, y = np.asarray(costs, dtype=np.float64), np.asarray(qualities, dtype=np.float64)
    ok = np.isfinite(x) & np.isfinite(y)
    if not ok.any():
        raise ValueError("no finite (cost, quality) point")
    x, y = x[ok], y[ok]
    order = np.lexsort((-y, x))                 # by cost, best quality first among equal costs
    x, y = x[order], y[order]
    keep = np.r_[True, x[1:] != x[:-1]]         # one point per cost: the best
    x, y = x[keep], y[keep]
    hull: list[int] = []
    for i in range(len(x)):                     # Andrew's monotone chain, upper part
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            if (x[b] - x[a]) * (y[i] - y[a]) - (y[b] - y[a]) * (x[i] - x[a]) >= 0:   # b is not above a->i
                hull.pop()
            else:
                break
        hull.append(i)
    hx, hy = x[hull], y[hull]
    top = int(np.argmax(hy))                    # after the best point the hull falls: cut it (flat from there)
    return hx[: top + 1], hy[: top + 1]


def hull_quality_at(costs, qualities, at) -> np.ndarray:
    """The hull's quality at costs `at`: interpolated between vertices, flat after the last, 0 before the
    first (the router cannot run that cheaply)."""
    hx, hy = nondecreasing_convex_hull(costs, qualities)
    at = np.asarray(at, dtype=np.float64)
    return np.where(at < hx[0], 0.0, np.interp(at, hx, hy))


def aiq(costs, qualities, c_min: float | None = None, c_max: float | None = None) -> float:
    """RouterBench's Average Improvement in Quality: (1 / (c_max - c_min)) * integral over [c_min, c_max] of
    the non-decreasing convex hull of the router's (cost, quality) points (0 below the router's cheapest
    point, flat after its best one).

    Args:
        costs, qualities: [K] the router's operating points (mean USD per request, mean quality).
        c_min, c_max: the cost range, the same for every router compared (default: the points' own range).
    Raises:
        ValueError: c_max < c_min, or no finite point.
    """
    hx, hy = nondecreasing_convex_hull(costs, qualities)
    x = np.asarray(costs, dtype=np.float64)
    lo = float(hx[0] if c_min is None else c_min)
    hi = float(np.nanmax(x[np.isfinite(x)]) if c_max is None else c_max)
    if hi < lo:
        raise ValueError(f"c_max {hi} < c_min {lo}")
    if hi == lo:
        return float(hull_quality_at(hx, hy, [lo])[0])
    start = max(lo, hx[0])
    if start >= hi:
        return 0.0
    xs = np.unique(np.concatenate([[start, hi], hx[(hx > start) & (hx < hi)]]))
    return float(_trapezoid(np.interp(xs, hx, hy), xs) / (hi - lo))


# --- RouteLLM: a strong/weak pair -----------------------------------------------------------------------

def threshold_curve(gain: np.ndarray, scores: np.ndarray, strong: int, weak: int,
                    num_thresholds: int = ROUTELLM_NUM_THRESHOLDS) -> tuple[np.ndarray, np.ndarray]:
    """RouteLLM's evaluation sweep: thresholds at the num_thresholds + 1 quantiles (0%, 10%, ..., 100%) of the
    router's strong-model score `gain` [N]; a prompt goes to the strong model when its score >= threshold,
    and at the last threshold (the maximum) when > (so that point sends none).

    Returns:
        (strong share [K], mean score [K]) with K = num_thresholds + 1, in threshold order.
    """
    gain = np.asarray(gain, dtype=np.float64)
    thresholds = np.quantile(gain, np.linspace(0.0, 1.0, num_thresholds + 1))
    share, quality = [], []
    for i, t in enumerate(thresholds):
        to_strong = gain > t if i == len(thresholds) - 1 else gain >= t
        share.append(to_strong.mean())
        quality.append(np.where(to_strong, scores[:, strong], scores[:, weak]).mean())
    return np.array(share), np.array(quality)


def _by_share(share, quality) -> tuple[np.ndarray, np.ndarray]:
    share, quality = np.asarray(share, dtype=np.float64), np.asarray(quality, dtype=np.float64)
    order = np.argsort(share, kind="stable")
    return share[order], quality[order]


def apgr(share, quality, weak_quality: float, strong_quality: float) -> float:
    """RouteLLM's average performance gap recovered: the area under quality against strong-call share,
    minus the weak model's area, over the strong model's minus the weak model's (both over the same
    share range; 0.5 for a random router, 1 when quality jumps to the strong model's at once).

    Raises:
        ValueError: equal weak and strong quality (no gap), or fewer than two points.
    """
    s, q = _by_share(share, quality)
    if len(s) < 2 or s[-1] == s[0]:
        raise ValueError("APGR needs points at two or more strong-call shares")
    if strong_quality == weak_quality:
        raise ValueError("APGR is undefined when the strong and weak models score the same")
    width = s[-1] - s[0]
    return float((_trapezoid(q, s) - weak_quality * width) / ((strong_quality - weak_quality) * width))


def cpt(fraction: float, share, quality, weak_quality: float, strong_quality: float) -> float:
    """RouteLLM's call-performance threshold CPT(x): the smallest strong-call share at which the curve
    (linear between points, in share order) reaches weak + x * (strong - weak). NaN if it never does.
    For a curve rising with share this is RouteLLM's `np.interp(target, quality, share)`."""
    s, q = _by_share(share, quality)
    target = weak_quality + fraction * (strong_quality - weak_quality)
    if q[0] >= target:
        return float(s[0])
    for i in range(1, len(s)):
        if q[i] >= target:
            return float(s[i - 1] + (target - q[i - 1]) / (q[i] - q[i - 1]) * (s[i] - s[i - 1]))
    return float("nan")


# --- against the best single model ----------------------------------------------------------------------

def accuracy_at_cost(costs, qualities, budget: float) -> float:
    """The best quality among the operating points costing at most `budget` USD per request (NaN: none)."""
    c, q = np.asarray(costs, dtype=np.float64), np.asarray(qualities, dtype=np.float64)
    ok = c <= budget * (1 + 1e-12)
    return float(q[ok].max()) if ok.any() else float("nan")


def cost_at_accuracy(costs, qualities, target: float) -> float:
    """The lowest mean cost among the operating points scoring at least `target` (NaN: none does)."""
    c, q = np.asarray(costs, dtype=np.float64), np.asarray(qualities, dtype=np.float64)
    ok = q >= target - 1e-12
    return float(c[ok].min()) if ok.any() else float("nan")


# --- per-prompt discrimination ---------------------------------------------------------------------------

def rank_auc(score: np.ndarray, label: np.ndarray) -> float:
    """The area under the ROC curve of `score` [N] for binary `label` [N] (Mann-Whitney: the chance that a
    random positive scores above a random negative, ties counting half). NaN when a class is missing."""
    from scipy.stats import rankdata

    label = np.asarray(label, dtype=bool)
    num_pos, num_neg = int(label.sum()), int((~label).sum())
    if num_pos == 0 or num_neg == 0:
        return float("nan")
    ranks = rankdata(np.asarray(score, dtype=np.float64))       # 1-based, ties averaged
    return float((ranks[label].sum() - num_pos * (num_pos + 1) / 2) / (num_pos * num_neg))


def within_suite_auc(predicted: np.ndarray, scores: np.ndarray, suites) -> float | None:
    """How well a router's predicted quality separates a model's right answers from its wrong ones inside
    one suite: the rank AUC per (suite, model) cell, averaged with weights = the cell's prompts.

    A router that knows only each suite's mean (best model per task) scores 0.5, the oracle 1. It is the
    per-prompt signal a router adds over the per-task baseline: near 0.5, its curve can only follow that
    baseline's. Scores >= 0.5 count as right.

    Args:
        predicted, scores: [N, M] predicted quality and recorded scores (NaN: left out).
        suites: [N] suite labels.
    Returns:
        the weighted mean AUC, or None when no cell has both right and wrong answers.
    """
    predicted, scores = np.asarray(predicted, dtype=np.float64), np.asarray(scores, dtype=np.float64)
    labels = np.asarray(suites)
    total, weight = 0.0, 0
    for suite in np.unique(labels):
        rows = labels == suite
        for j in range(scores.shape[1]):
            ok = rows & np.isfinite(scores[:, j]) & np.isfinite(predicted[:, j])
            value = rank_auc(predicted[ok, j], scores[ok, j] >= 0.5) if ok.any() else float("nan")
            if np.isfinite(value):
                total += value * int(ok.sum())
                weight += int(ok.sum())
    return total / weight if weight else None
