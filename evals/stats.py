"""Confidence intervals for mean scores and AlpacaEval's length-controlled win rate.

    wilson_interval(42, 50)                    # (0.7144, 0.9166): 95% interval of a 42/50 pass rate
    mean_interval([0.2, 0.9, 0.7])             # (mean, lo, hi): bootstrap when the scores are not all 0/1
    length_controlled_win_rate(prefs, model_lengths, baseline_lengths)   # in [0, 1]
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
LENGTH_PENALTY = 10.0  # L2 weight on the length coefficient of the LC win rate (see there)


def wilson_interval(successes: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a proportion `successes / n` (Wilson 1927; Brown, Cai and DasGupta 2001).

        centre = (p + z^2/2n) / (1 + z^2/n),  half = z sqrt(p(1-p)/n + z^2/4n^2) / (1 + z^2/n)

    Args:
        successes: in [0, n] (a sum of scores may be fractional).
        n: the number of trials, > 0.
        z: the normal quantile (1.96 for 95%).
    Returns:
        (lo, hi) within [0, 1], lo <= p <= hi.
    Raises:
        ValueError: n <= 0 or successes outside [0, n].
    """
    if n <= 0:
        raise ValueError(f"a Wilson interval needs n > 0, got {n}")
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be in [0, {n}], got {successes}")
    p, z2 = successes / n, z * z
    denominator = 1 + z2 / n
    centre = (p + z2 / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denominator
    # The interval always contains p; rounding could leave hi a hair below 1 at p = 1 (n = 6: 0.9999999999999999).
    return max(0.0, min(p, centre - half)), min(1.0, max(p, centre + half))


def mean_interval(values: Sequence[float], z: float = 1.96) -> tuple[float, float, float]:
    """The mean of `values` with a 95% confidence interval.

    All values 0 or 1: the Wilson interval. Otherwise a percentile bootstrap of the mean
    (`BOOTSTRAP_RESAMPLES` resamples, seeded with `BOOTSTRAP_SEED`, so reports are reproducible);
    `z` applies to Wilson only (the bootstrap is always 95%).

    Raises:
        ValueError: no values.
    """
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        raise ValueError("mean_interval needs at least one value")
    mean = float(x.mean())
    if np.all((x == 0) | (x == 1)):
        return (mean, *wilson_interval(float(x.sum()), int(x.size), z))
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    means = []
    chunk = max(1, min(BOOTSTRAP_RESAMPLES, 4_000_000 // x.size))  # bound memory: chunk * n indices at once
    for start in range(0, BOOTSTRAP_RESAMPLES, chunk):
        idx = rng.integers(0, x.size, size=(min(chunk, BOOTSTRAP_RESAMPLES - start), x.size))
        means.append(x[idx].mean(axis=1))
    lo, hi = np.percentile(np.concatenate(means), [2.5, 97.5])
    return mean, float(lo), float(hi)


def _sigmoid(t: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(t, -50.0, 50.0)))


def length_controlled_win_rate(preferences: Sequence[float], model_lengths: Sequence[float],
                               baseline_lengths: Sequence[float], *, length_penalty: float = LENGTH_PENALTY) -> float:
    """The win rate the judge would give if the model's and the baseline's outputs were equally long.

    After AlpacaEval 2's length control (Dubois, Galambosi, Liang and Hashimoto 2024, "Length-Controlled
    AlpacaEval: A Simple Way to Debias Automatic Evaluators", arXiv:2404.04475): fit a logistic model of
    the preference on the length difference,

        P(model wins | i) = sigmoid(a + b * tanh(d_i / std(d))),   d_i = model_length_i - baseline_length_i,

    by maximum likelihood with the preferences as soft labels (Newton's method) and an L2 penalty
    `length_penalty * b^2 / 2` on the length weight only, and return sigmoid(a), the prediction at zero
    length difference. Unlike AlpacaEval's GLM this fits one model against its baseline alone, without the
    instruction-difficulty term (which needs every model's annotations). The penalty (10) was chosen so
    that the values track the AlpacaEval 2 leaderboard's LC win rates on ../shared/data (median
    difference 0.8 points, at most 4.8, over its 57 models; tests/evals/test_stats.py checks this).

    Args:
        preferences: per prompt in [0, 1] (1 = the model wins, 0.5 = a draw), e.g. AlpacaEval preference - 1.
        model_lengths, baseline_lengths: output lengths per prompt (characters), same order.
    Returns:
        the length-controlled win rate in [0, 1]; equals the plain mean when every d_i is 0.
    Raises:
        ValueError: empty input, mismatched lengths, or a preference outside [0, 1].
    """
    y = np.asarray(preferences, dtype=float)
    d = np.asarray(model_lengths, dtype=float) - np.asarray(baseline_lengths, dtype=float)
    if y.size == 0 or y.shape != d.shape:
        raise ValueError(f"need equally many preferences and lengths, got {y.size} and {d.size}")
    if np.any((y < 0) | (y > 1)):
        raise ValueError("preferences must be in [0, 1]")
    mean = float(y.mean())
    if mean in (0.0, 1.0):
        return mean  # the intercept has no finite maximum; its limit is the plain win rate
    scale = d.std()
    x = np.tanh(d / scale) if scale > 0 else np.zeros_like(d)
    features = np.column_stack([np.ones_like(x), x])  # [n, 2]: intercept a, length weight b
    penalty = np.diag([0.0, length_penalty])
    w = np.array([math.log(mean / (1 - mean)), 0.0])
    for _ in range(100):
        p = _sigmoid(features @ w)
        gradient = features.T @ (p - y) + penalty @ w
        hessian = (features * (p * (1 - p))[:, None]).T @ features + penalty + 1e-9 * np.eye(2)
        step = np.linalg.solve(hessian, gradient)
        w -= step
        if np.max(np.abs(step)) < 1e-10:
            break
    return float(_sigmoid(np.array(w[0])))
