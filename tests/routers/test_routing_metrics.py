"""Routing metrics on curves computed by hand: AIQ, the hull, APGR, CPT, accuracy and cost at a reference."""

from __future__ import annotations

import numpy as np
import pytest

from routers.offline.metrics import (accuracy_at_cost, aiq, apgr, cost_at_accuracy, cost_quality_curve, cpt,
                                     hull_quality_at, nondecreasing_convex_hull, rank_auc, threshold_curve,
                                     within_suite_auc)

# (0, .5) (1, .7) (2, .8) are the hull; (1.5, .6) lies under it; (3, .75) falls after the best point
COSTS = [0.0, 1.0, 1.5, 2.0, 3.0]
QUALITY = [0.5, 0.7, 0.6, 0.8, 0.75]


def test_hull_drops_points_below_and_after_the_best():
    hx, hy = nondecreasing_convex_hull(COSTS, QUALITY)
    np.testing.assert_allclose(hx, [0.0, 1.0, 2.0])
    np.testing.assert_allclose(hy, [0.5, 0.7, 0.8])
    # a point above the chord of its neighbours stays; one under it goes: (0, 0) (1, .2) (2, 1) -> (1, .2) goes
    hx, hy = nondecreasing_convex_hull([0, 1, 2], [0.0, 0.2, 1.0])
    np.testing.assert_allclose(hx, [0, 2])
    np.testing.assert_allclose(hull_quality_at(hx, hy, [-1.0, 1.0, 5.0]), [0.0, 0.5, 1.0])


def test_aiq_of_a_piecewise_curve_by_hand():
    # over [0, 3]: trapezoids (.5 + .7) / 2 + (.7 + .8) / 2 + the flat .8 = .6 + .75 + .8 = 2.15; / 3
    assert aiq(COSTS, QUALITY, 0.0, 3.0) == pytest.approx(2.15 / 3)
    # over [0.5, 2.5]: (.6 + .7) / 2 * .5 + .75 + .8 * .5 = .325 + .75 + .4 = 1.475; / 2
    assert aiq(COSTS, QUALITY, 0.5, 2.5) == pytest.approx(1.475 / 2)
    # default range = the points' own: [0, 3]
    assert aiq(COSTS, QUALITY) == pytest.approx(2.15 / 3)
    # a router that cannot run below cost 1 earns nothing on [0, 1): (.7 + .8) / 2 + .8 = 1.55; / 3
    assert aiq([1.0, 2.0], [0.7, 0.8], 0.0, 3.0) == pytest.approx(1.55 / 3)
    # one point: flat from its cost on
    assert aiq([1.0], [0.6], 0.0, 2.0) == pytest.approx(0.3)
    with pytest.raises(ValueError):
        aiq(COSTS, QUALITY, 2.0, 1.0)


def test_aiq_orders_a_better_router_first():
    # the same endpoints, a router that reaches .8 at cost 1 beats the straight line (the zero router)
    assert aiq([0, 1, 3], [0.5, 0.8, 0.8], 0, 3) > aiq([0, 3], [0.5, 0.8], 0, 3)
    assert aiq([0, 3], [0.5, 0.8], 0, 3) == pytest.approx(0.65)


def test_cost_quality_curve_charges_recorded_outcomes():
    scores = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    costs = np.array([[2.0, 1.0], [2.0, 1.0], [2.0, 1.0]])
    c, q = cost_quality_curve(np.array([[0, 0, 0], [0, 1, 1], [1, 1, 1]]), scores, costs)
    np.testing.assert_allclose(c, [2.0, 4 / 3, 1.0])
    np.testing.assert_allclose(q, [2 / 3, 1.0, 2 / 3])


def _pair(n=1000, seed=0):
    rng = np.random.default_rng(seed)
    strong = (rng.uniform(size=n) < 0.8).astype(float)
    weak = np.where(strong == 1, (rng.uniform(size=n) < 0.6), 0.0).astype(float)
    return np.stack([strong, weak], axis=1)


def test_apgr_of_a_perfect_and_of_a_random_router():
    scores = _pair()
    w, s = scores[:, 1].mean(), scores[:, 0].mean()
    perfect_gain = scores[:, 0] - scores[:, 1]                 # 1 exactly where only the strong model is right
    share, quality = threshold_curve(perfect_gain, scores, strong=0, weak=1)
    # quality reaches the strong model's at the share of prompts the strong model alone answers (~32%)
    # and stays there: APGR = 1 - (that share) / 2 by the trapezoids
    jump = perfect_gain.mean()
    assert apgr(share, quality, w, s) >= 1 - jump / 2 - 0.05
    random_gains = [apgr(*threshold_curve(np.random.default_rng(k).uniform(size=len(scores)), scores, 0, 1), w, s)
                    for k in range(20)]
    assert np.mean(random_gains) == pytest.approx(0.5, abs=0.02)


def test_apgr_and_cpt_by_hand():
    share = [0.0, 0.5, 1.0]
    quality = [0.6, 0.9, 1.0]
    # area: (.6 + .9) / 4 + (.9 + 1) / 4 = .85; weak area .6, strong area 1 -> (.85 - .6) / .4
    assert apgr(share, quality, 0.6, 1.0) == pytest.approx(0.625)
    assert apgr(share[::-1], quality[::-1], 0.6, 1.0) == pytest.approx(0.625)     # order does not matter
    # CPT(50%): target .8, between (0, .6) and (.5, .9): 0.5 * (.2 / .3)
    assert cpt(0.5, share, quality, 0.6, 1.0) == pytest.approx(1 / 3)
    # CPT(80%): target .92, between (.5, .9) and (1, 1): .5 + .5 * (.02 / .1)
    assert cpt(0.8, share, quality, 0.6, 1.0) == pytest.approx(0.6)
    assert np.isnan(cpt(0.5, [0.0, 1.0], [0.6, 0.7], 0.6, 1.0))
    with pytest.raises(ValueError):
        apgr(share, quality, 0.7, 0.7)


def test_threshold_curve_matches_routellm_quantiles():
    gain = np.arange(10, dtype=float)                           # deciles 0, 0.9, ..., 9
    scores = np.stack([np.ones(10), np.zeros(10)], axis=1)
    share, quality = threshold_curve(gain, scores, 0, 1)
    assert len(share) == 11 and share[0] == 1.0 and share[-1] == 0.0
    np.testing.assert_allclose(quality, share)
    # threshold 0.9 keeps gains 1..9 -> 90%
    assert share[1] == pytest.approx(0.9)


def test_accuracy_at_cost_and_cost_at_accuracy():
    costs, quality = [1.0, 2.0, 4.0, 5.0], [0.6, 0.8, 0.85, 0.9]
    assert accuracy_at_cost(costs, quality, 2.0) == 0.8
    assert accuracy_at_cost(costs, quality, 3.9) == 0.8
    assert np.isnan(accuracy_at_cost(costs, quality, 0.5))
    assert cost_at_accuracy(costs, quality, 0.85) == 4.0
    assert cost_at_accuracy(costs, quality, 0.7) == 2.0
    assert np.isnan(cost_at_accuracy(costs, quality, 0.95))


def test_rank_auc_by_hand_and_against_sklearn():
    # positives score 3 and 1, negatives 2 and 1: pairs (3>2) 1, (3>1) 1, (1<2) 0, (1=1) 0.5 -> 2.5 / 4
    assert rank_auc([3, 1, 2, 1], [1, 1, 0, 0]) == pytest.approx(0.625)
    assert np.isnan(rank_auc([1, 2], [1, 1]))
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(0)
    score, label = rng.integers(0, 5, size=200).astype(float), rng.uniform(size=200) < 0.3
    assert rank_auc(score, label) == pytest.approx(roc_auc_score(label, score))


def test_within_suite_auc_weights_cells_and_ignores_the_suite_mean():
    suites = ["a"] * 4 + ["b"] * 2
    scores = np.array([[1, 0], [0, 1], [1, 1], [0, 0], [1, 1], [0, 1]], dtype=float)
    perfect = scores.copy()
    assert within_suite_auc(perfect, scores, suites) == pytest.approx(1.0)
    # a suite's mean predicted for every prompt (best model per task) ranks nothing: 0.5
    per_suite = np.array([[0.5, 0.5]] * 4 + [[0.5, 1.0]] * 2)
    assert within_suite_auc(per_suite, scores, suites) == pytest.approx(0.5)
    # cells: (a, model 0) 4 prompts AUC 1; (a, model 1) 4 prompts AUC 0; (b, model 0) 2 prompts AUC 1;
    # (b, model 1) all right: left out -> (4 * 1 + 4 * 0 + 2 * 1) / 10
    mixed = np.array([[1, 1], [0, 0], [1, 0], [0, 1], [1, 0], [0, 0]], dtype=float)
    assert within_suite_auc(mixed, scores, suites) == pytest.approx(0.6)
    assert within_suite_auc(np.ones((2, 1)), np.ones((2, 1)), ["a", "a"]) is None
