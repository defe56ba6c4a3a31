"""The cascade and the hybrid in the offline replay: hand-computed sweeps, calibration, report entries.

The toy table (USD per answer: cheap 1, mid 3, big 10; a dominated "bad" model costs 5):

    prompt  cheap mid big bad moa   predicted quality: cheap  mid
    p0        1    1   1   1   1                        0.9   0.9
    p1        0    1   1   0   1                        0.2   0.8
    p2        0    0   1   0   1                        0.1   0.3
    p3        0    0   0   0   1                        0.4   0.6

A cascade cheap -> mid -> big with threshold t answers at the first step predicted >= t. By hand, per
threshold interval (picks; mean quality; mean cost paying only the answering step):

    t <= .1      c c c c   .25   1
    (.1, .2]     c c m c   .25   1.5
    (.2, .3]     c m m c   .50   2
    (.3, .4]     c m b c   .75   3.75
    (.4, .6]     c m b m   .75   4.25
    (.6, .8]     c m b b   .75   6
    (.8, .9]     c b b b   .75   7.75
    t > .9       b b b b   .75   10
"""

from __future__ import annotations

import numpy as np
import pytest

from routers.base import ROUTERS, Router, register_router
from routers.features import Features, text_features
from routers.offline.calibration import CalibrationTarget
from routers.offline.cascade_eval import (calibrate_cascade, cascade_picks, cascade_sweep, check_step_order,
                                          efficient_steps, threshold_grid)
from routers.offline.data import RoutingData
from routers.offline.evaluate import evaluate_split
from routers.offline.measure import measure_cascade, split_context
from routers.offline.metrics import aiq
from routers.offline.settings import EvalSettings

SCORES = np.array([[1, 1, 1, 1, 1], [0, 1, 1, 0, 1], [0, 0, 1, 0, 1], [0, 0, 0, 0, 1]], dtype=float)
COSTS = np.tile([1.0, 3.0, 10.0, 5.0, 5.0], (4, 1))
MODELS = ["cheap", "mid", "big", "bad", "moa"]
PREDICTED = np.array([[0.9, 0.9], [0.2, 0.8], [0.1, 0.3], [0.4, 0.6]])
STEPS = [0, 1, 2]
# (threshold inside the interval, quality, cost) from the table in the module docstring
BY_HAND = [(0.05, 0.25, 1.0), (0.15, 0.25, 1.5), (0.25, 0.5, 2.0), (0.35, 0.75, 3.75), (0.5, 0.75, 4.25),
           (0.7, 0.75, 6.0), (0.85, 0.75, 7.75), (0.95, 0.75, 10.0)]


def step_scores() -> np.ndarray:
    """[4, 3]: the predictions of cheap and mid; the last step's column is never read."""
    return np.column_stack([PREDICTED, np.zeros(4)])


def toy(models=MODELS) -> RoutingData:
    cols = [MODELS.index(m) for m in models]
    return RoutingData([f"p{i}" for i in range(4)], [f"prompt {i}" for i in range(4)], ["toy"] * 4, models,
                       SCORES[:, cols], COSTS[:, cols])


def test_efficient_steps_keep_the_cost_accuracy_frontier():
    assert efficient_steps(SCORES[:, :4], COSTS[:, :4]) == [0, 1, 2]          # "bad" (5 USD, 0.25) is dominated
    assert efficient_steps(SCORES, COSTS, candidates=[3, 0, 2]) == [0, 2]
    # equal accuracy: the cheaper one only
    assert efficient_steps(np.ones((2, 2)), np.array([[2.0, 1.0], [2.0, 1.0]])) == [1]


def test_the_threshold_sweep_matches_the_table_by_hand():
    thresholds = np.array([t for t, _, _ in BY_HAND])
    result = cascade_sweep(step_scores(), SCORES, COSTS, STEPS, thresholds=thresholds)
    np.testing.assert_allclose(result.quality, [q for _, q, _ in BY_HAND])
    np.testing.assert_allclose(result.mean_cost, [c for _, _, c in BY_HAND])
    np.testing.assert_allclose(result.share[4, :3], [0.25, 0.5, 0.25])      # t = .5: c m b m
    # a judge pays every step it called: t = .5 picks c m b m, paying 1, 1+3, 1+3+10, 1+3
    picks, paid = cascade_picks(step_scores(), COSTS, STEPS, np.array([0.5]), pays_rejected=True)
    assert picks[0].tolist() == [0, 1, 2, 1] and paid[0].tolist() == [1.0, 4.0, 14.0, 4.0]
    with pytest.raises(ValueError, match="S>=2"):
        cascade_picks(step_scores()[:, :1], COSTS, [0], np.array([0.5]))


def test_threshold_grid_spans_all_first_steps_to_all_last():
    grid = threshold_grid(step_scores(), 3)            # 2 quantiles (min, max) and just above the max
    assert grid[:2].tolist() == [0.1, 0.9] and 0.9 < grid[2] < 0.9 + 1e-12
    result = cascade_sweep(step_scores(), SCORES, COSTS, STEPS, thresholds=grid)
    assert result.mean_cost.tolist() == [1.0, 7.75, 10.0]


def test_calibrate_cascade_meets_each_target_like_the_router_knob():
    kwargs = dict(scores=SCORES, costs=COSTS, models=MODELS)
    # cost <= 4.5: best quality .75, first reached at (.3, .4] (3.75 USD)
    t = calibrate_cascade(step_scores(), STEPS, CalibrationTarget("cost", 4.5), **kwargs)
    assert 0.3 < t <= 0.4
    # quality >= 1.0 x the best single model's .75 (moa's 1.0 is a column too: 0.75 x 1.0 = .75): cheapest 3.75
    assert 0.3 < calibrate_cascade(step_scores(), STEPS, CalibrationTarget("quality", 0.75), **kwargs) <= 0.4
    # half the prompts answered by big: (.6, .8]
    assert 0.6 < calibrate_cascade(step_scores(), STEPS, CalibrationTarget("share", 0.5, "big"), **kwargs) <= 0.8
    # nothing is that cheap: the cheapest setting (everything answered by cheap)
    assert calibrate_cascade(step_scores(), STEPS, CalibrationTarget("cost", 0.5), **kwargs) == pytest.approx(0.1)


def test_measure_cascade_reports_the_hand_computed_aiq():
    data = toy(["cheap", "mid", "big", "bad"])
    ctx = split_context(data, data, EvalSettings(types=(), baselines=(), cascade_models=("cheap", "mid", "big")))
    assert ctx.steps == [0, 1, 2] and ctx.best == 2 and ctx.c_max == 10.0
    out = measure_cascade(ctx, step_scores())
    points = set(zip(out["curve"]["cost_usd"], out["curve"]["quality"]))
    assert {(c, q) for _, q, c in BY_HAND} <= points
    # hull (1, .25) -> (2, .5) -> (3.75, .75), flat to 10: (.375 + 1.09375 + 4.6875) / 10
    assert out["aiq"] == pytest.approx(0.615625)
    assert out["aiq"] == pytest.approx(aiq([c for _, _, c in BY_HAND], [q for _, q, _ in BY_HAND], 0.0, 10.0))
    assert out["cost_at_best_accuracy"] == 3.75 and out["cost_ratio_at_best_accuracy"] == pytest.approx(0.375)
    assert out["steps"] == ["cheap", "mid", "big"] and out["pays_rejected"] is False
    assert "threshold" in out["curve"] and "apgr" not in out


class TableRouter(Router):
    """Predicts the quality hidden in the first M embedding coordinates (columns in the models' order)."""

    type = "table"

    def fit(self, data, features):
        return self

    def predict(self, features, suites=None):
        return features.embeddings[:, : self.num_models].astype(np.float64)


@pytest.fixture()
def table_router():
    register_router("table", f"{__name__}:TableRouter")
    yield
    ROUTERS.pop("table", None)


def toy_features() -> Features:
    """Embedding coordinates 0-3: the predicted quality of cheap, mid, big and moa."""
    emb = np.zeros((4, 384), dtype=np.float32)
    emb[:, :2] = PREDICTED
    emb[:, 2] = 0.75
    emb[:, 3] = 0.99
    return Features(emb, text_features([f"prompt {i}" for i in range(4)]))


def test_evaluate_split_puts_cascades_and_hybrids_in_the_same_report(table_router):
    data = toy(["cheap", "mid", "big", "moa"])
    feats = toy_features()
    settings = EvalSettings(types=("table",), baselines=("oracle",), ensembles=("moa",))
    report = evaluate_split(data, data, settings, features=(feats, feats))
    r = report["routers"]
    assert set(r) == {"table", "oracle", "cascade:table", "cascade:oracle", "hybrid:table", "hybrid:oracle"}
    assert report["ensembles"] == ["moa"] and report["reference"]["model"] == "big"   # the best single model
    # singles' hull (1, .25) -> (3, .5) -> (10, .75): (.75 + 4.375) / 10
    assert report["zero_router"]["aiq"] == pytest.approx(0.5125)
    moa = 3
    assert np.asarray(r["table"]["curve"]["share"])[:, moa].max() == 0.0        # single-model routers never pick it
    assert np.asarray(r["oracle"]["curve"]["share"])[:, moa].max() == 0.0 and r["oracle"]["max_quality"] == 0.75
    assert np.asarray(r["hybrid:table"]["curve"]["share"])[:, moa].max() == 1.0  # predicted .99 at lambda 0
    assert r["hybrid:table"]["max_quality"] == 1.0 and r["hybrid:oracle"]["max_quality"] == 1.0
    assert r["cascade:table"]["steps"] == ["cheap", "mid", "big"]
    assert r["cascade:table"]["aiq"] == pytest.approx(0.615625)
    # the perfect judge at t = .5: c m b b, paying 1, 1+3, 1+3+10, 1+3+10 -> 8.25 USD at .75
    judge = r["cascade:oracle"]
    assert judge["pays_rejected"] is True
    assert (8.25, 0.75) in set(zip(judge["curve"]["cost_usd"], judge["curve"]["quality"]))
    assert "hybrid:table" not in evaluate_split(data.select_models(["cheap", "mid", "big"]),
                                                data.select_models(["cheap", "mid", "big"]),
                                                EvalSettings(types=("table",), baselines=()),
                                                features=(feats, feats))["routers"]
    with pytest.raises(KeyError, match="unknown models"):
        evaluate_split(data, data, EvalSettings(types=(), baselines=(), ensembles=("nope",)), features=(feats, feats))
    with pytest.raises(ValueError, match="at least two"):
        EvalSettings(cascade_models=("cheap",))
    with pytest.raises(ValueError, match="costs more than mid"):     # big (10 USD) before mid (3 USD)
        split_context(data, data, EvalSettings(types=(), baselines=(), cascade_models=("cheap", "big", "mid")))


def test_check_step_order_wants_the_cheapest_first_within_a_tolerance():
    models = ["a", "b", "c"]
    costs = np.array([[1.0, 1.03, 3.0], [1.0, 1.03, np.nan]])    # means 1, 1.03, 3
    assert check_step_order(["a", "c"], models, costs) == [0, 2]
    # 3% apart: either order (cost means drift between folds)
    assert check_step_order(["b", "a", "c"], models, costs) == [1, 0, 2]
    with pytest.raises(ValueError, match="give them as a,c"):
        check_step_order(["c", "a"], models, costs)
    with pytest.raises(ValueError, match="each model once"):
        check_step_order(["a", "a"], models, costs)
    with pytest.raises(ValueError, match=r"no recorded cost of cascade model\(s\) \['b'\]"):
        check_step_order(["b", "c"], models, np.array([[1.0, np.nan, 3.0]]))
    with pytest.raises(KeyError, match="'z'"):
        check_step_order(["a", "z"], models, costs)
