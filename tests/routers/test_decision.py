"""The decision rule, the cost model and calibration, on hand-checked toy cases."""

from __future__ import annotations

import numpy as np
import pytest

from routers.decision import CostModel, choose, choose_threshold, estimate_prompt_tokens, rank
from routers.offline.calibration import CalibrationTarget, calibrate, lambda_grid, sweep
from routers.offline.data import RoutingData


def test_choose_is_argmax_of_quality_minus_lambda_cost():
    q = np.array([[0.9, 0.6, 0.5], [0.2, 0.3, 0.1]])
    c = np.array([[1.0, 0.1, 0.0], [1.0, 0.0, 0.5]])
    np.testing.assert_array_equal(choose(q, c, 0.0), [0, 1])
    # lambda = 0.5: row 0 utilities 0.4, 0.55, 0.5 -> 1; row 1: -0.3, 0.3, -0.15 -> 1
    np.testing.assert_array_equal(choose(q, c, 0.5), [1, 1])
    # lambda = 2: row 0: -1.1, 0.4, 0.5 -> 2
    np.testing.assert_array_equal(choose(q, c, 2.0), [2, 1])


def test_choose_breaks_ties_to_the_cheaper_model_and_skips_unavailable():
    q = np.array([[1.0, 1.0, 1.0], [np.nan, 0.1, 0.9]])
    c = np.array([[0.3, 0.1, 0.2], [0.0, 0.0, 0.0]])
    np.testing.assert_array_equal(choose(q, c, 0.0), [1, 2])
    with pytest.raises(ValueError):
        choose(q, c, -1.0)
    with pytest.raises(ValueError):
        choose(q, c[:, :2], 0.0)


def test_choose_threshold_on_the_predicted_gain():
    q = np.array([[0.9, 0.5], [0.6, 0.5], [0.2, 0.5]])
    np.testing.assert_array_equal(choose_threshold(q, strong=0, weak=1, threshold=0.05), [0, 0, 1])
    np.testing.assert_array_equal(choose_threshold(q, strong=0, weak=1, threshold=0.2), [0, 1, 1])


def test_lambda_grid_spans_every_switch():
    q = np.array([[0.9, 0.5], [0.8, 0.7]])
    c = np.array([[1.0, 0.0], [2.0, 0.0]])
    grid = lambda_grid(q, c, num=16)
    # breakpoints 0.4 / 1 = 0.4 and 0.1 / 2 = 0.05
    assert grid[0] == 0.0 and grid[-1] == pytest.approx(0.8) and np.all(np.diff(grid) > 0)
    assert grid.min() < 0.05 < 0.4 < grid.max()
    np.testing.assert_array_equal(choose(q, c, grid[-1]), [1, 1])


def _linear_cost_data() -> RoutingData:
    prompts = ["x" * n for n in (4, 8, 40, 400, 80)]          # 1, 2, 10, 100, 20 tokens
    tokens = np.array([1, 2, 10, 100, 20], dtype=float)
    suites = ["a", "a", "b", "b", "b"]
    # model 0: 1e-5 per token + 3e-4 in suite a, 5e-4 in suite b; model 1: a flat 2e-3
    c0 = 1e-5 * tokens + np.where(np.array(suites) == "a", 3e-4, 5e-4)
    costs = np.stack([c0, np.full(5, 2e-3)], axis=1)
    return RoutingData([f"p{i}" for i in range(5)], prompts, suites, ["m0", "m1"], np.ones((5, 2)) * 0.5, costs)


def test_cost_model_fits_a_line_in_prompt_tokens_with_suite_intercepts():
    data = _linear_cost_data()
    assert estimate_prompt_tokens(data.prompts).tolist() == [1, 2, 10, 100, 20]
    model = CostModel.from_data(data)
    assert model.per_prompt_token[1] == pytest.approx(0.0, abs=1e-12)
    assert model.base_cost[1] == pytest.approx(2e-3)
    # the per-suite intercept is mean(cost - a * tokens) over the suite
    a = model.per_prompt_token[0]
    assert model.suite_base_cost["a"][0] == pytest.approx(np.mean(data.costs[:2, 0] - a * np.array([1, 2])))
    expected = model.expected_cost(np.array([50.0, 50.0]), ["a", "b"])
    assert expected[0, 0] == pytest.approx(a * 50 + model.suite_base_cost["a"][0])
    assert expected[1, 0] == pytest.approx(a * 50 + model.suite_base_cost["b"][0])
    np.testing.assert_allclose(expected[:, 1], 2e-3)
    unknown_suite = model.expected_cost(np.array([50.0]), ["zzz"])
    assert unknown_suite[0, 0] == pytest.approx(a * 50 + model.base_cost[0])


def test_cost_model_clips_a_negative_slope_and_uses_prices():
    data = _linear_cost_data()
    data.costs[:, 1] = [5e-3, 4e-3, 3e-3, 1e-3, 2e-3]          # falls with length: slope clipped to 0
    model = CostModel.from_data(data, prices={"m0": (10.0, 30.0)})
    assert model.per_prompt_token[1] == 0.0 and model.base_cost[1] == pytest.approx(3e-3)
    # m0: expected output tokens solved from the mean cost: (mean - 10e-6 * mean tokens) / 30e-6
    mean_tokens = np.mean([1, 2, 10, 100, 20])
    out_tokens = (data.costs[:, 0].mean() - 10e-6 * mean_tokens) / 30e-6
    assert model.expected_output_tokens[0] == pytest.approx(out_tokens)
    assert model.expected_cost(np.array([1000.0]))[0, 0] == pytest.approx(10e-6 * 1000 + 30e-6 * out_tokens)
    arrays, meta = model.state()
    again = CostModel.from_state(arrays, meta)
    np.testing.assert_allclose(again.expected_cost(np.array([7.0, 70.0]), ["a", "b"]),
                               model.expected_cost(np.array([7.0, 70.0]), ["a", "b"]))
    assert model.select_models(["m1"]).models == ["m1"]


def test_the_requests_max_tokens_caps_a_priced_models_expected_output():
    model = CostModel(["a", "b", "unpriced"], input_per_million=[1.0, 2.0, np.nan], output_per_million=[10.0, 20.0, np.nan],
                      expected_output_tokens=[100.0, 50.0, np.nan], mean_cost=[0.0, 0.0, 0.005])
    cost = model.expected_cost(np.array([1000.0, 1000.0, 1000.0]), None, np.array([np.nan, 10.0, 80.0]))
    np.testing.assert_allclose(cost, [[(1000 + 10 * 100) / 1e6, (2 * 1000 + 20 * 50) / 1e6, 0.005],    # no limit
                                      [(1000 + 10 * 10) / 1e6, (2 * 1000 + 20 * 10) / 1e6, 0.005],     # 10 tokens
                                      [(1000 + 10 * 80) / 1e6, (2 * 1000 + 20 * 50) / 1e6, 0.005]])    # 80: b's 50 stay


def test_target_parse():
    assert CalibrationTarget.parse("cost=0.001") == CalibrationTarget("cost", 0.001)
    assert CalibrationTarget.parse("share:gpt-4-1106-preview=0.3") == CalibrationTarget("share", 0.3, "gpt-4-1106-preview")
    assert CalibrationTarget.parse("quality = 0.95") == CalibrationTarget("quality", 0.95)
    for bad in ("speed=1", "quality=1.5", "share=0.3", "cost"):
        with pytest.raises(ValueError):
            CalibrationTarget.parse(bad)


def _toy_pair(n: int = 200, seed: int = 0):
    """A strong model (cost 1) right on every prompt, a weak one (cost 0) right where a hidden difficulty is
    low; the router predicts the difficulty with noise."""
    rng = np.random.default_rng(seed)
    difficulty = rng.uniform(size=n)
    scores = np.stack([np.ones(n), (difficulty < 0.6).astype(float)], axis=1)
    quality = np.stack([np.full(n, 0.95), 1 - difficulty + rng.normal(0, 0.05, n)], axis=1)
    costs = np.stack([np.ones(n), np.zeros(n)], axis=1)
    return quality, costs, scores


def test_calibrate_hits_a_cost_target():
    quality, costs, scores = _toy_pair()
    lam = calibrate(quality, costs, CalibrationTarget("cost", 0.3), scores=scores, costs=costs)
    picks = choose(quality, costs, lam)
    share_strong = np.mean(picks == 0)
    assert share_strong <= 0.3 and share_strong >= 0.28          # the most quality the budget allows
    every = sweep(quality, costs, scores=scores, costs=costs)
    feasible = every.mean_cost <= 0.3
    assert scores[np.arange(len(picks)), picks].mean() == pytest.approx(every.quality[feasible].max())


def test_calibrate_hits_a_share_target_with_lambda_and_threshold():
    quality, costs, scores = _toy_pair()
    models = ["strong", "weak"]
    lam = calibrate(quality, costs, CalibrationTarget("share", 0.25, "strong"), models=models)
    assert np.mean(choose(quality, costs, lam) == 0) == pytest.approx(0.25, abs=0.01)
    thr = calibrate(quality, costs, CalibrationTarget("share", 0.25, "strong"), models=models, strong=0, weak=1)
    assert np.mean(choose_threshold(quality, 0, 1, thr) == 0) == pytest.approx(0.25, abs=0.005)
    with pytest.raises(ValueError, match="share target"):
        calibrate(quality, costs, CalibrationTarget("share", 0.25, "nobody"), models=models)


def test_calibrate_hits_a_quality_target_at_least_cost():
    quality, costs, scores = _toy_pair()
    # best single model: the strong one, mean 1.0; target 0.9 -> at most 10% wrong answers
    lam = calibrate(quality, costs, CalibrationTarget("quality", 0.9), scores=scores, costs=costs)
    picks = choose(quality, costs, lam)
    achieved = scores[np.arange(len(picks)), picks].mean()
    assert achieved >= 0.9
    every = sweep(quality, costs, scores=scores, costs=costs)
    assert costs[np.arange(len(picks)), picks].mean() == pytest.approx(every.mean_cost[every.quality >= 0.9].min())
    assert np.mean(picks == 0) < 0.5                            # far cheaper than always-strong


def test_rank_breaks_ties_by_cost_then_by_the_order_given():
    tied = rank({"a": 0.5, "b": 0.5, "c": 0.5}, {"a": 0.002, "b": 0.001, "c": 0.001}, 0.0)
    assert tied.order == ("b", "c", "a")
    # objectives 1e-13 apart count as a tie (float noise), the cheaper first
    assert rank({"a": 0.5 + 1e-13, "b": 0.5}, {"a": 0.002, "b": 0.001}, 0.0).order == ("b", "a")
    assert rank({"a": 0.5 + 1e-9, "b": 0.5}, {"a": 0.002, "b": 0.001}, 0.0).order == ("a", "b")


def test_every_candidate_over_the_ceiling_keeps_all_the_cheapest():
    ranking = rank({"a": 0.2, "b": 0.9, "c": 0.99}, {"a": 0.01, "b": 0.01, "c": 0.05}, 0.0, max_cost=0.001)
    assert ranking.order == ("b", "a")
    assert ranking.excluded == ["c"] and ranking.is_over_max_cost
    assert [r.is_over_max_cost for r in ranking.given] == [True, True, True]


@pytest.mark.parametrize("args, message", [
    (({}, {}, 1.0), "a quality and a cost per candidate"),
    (({"a": 0.5}, {"b": 0.1}, 1.0), "a quality and a cost per candidate"),
    (({"a": 0.5}, {"a": 0.1}, -1.0), "cost_penalty must be >= 0"),
    (({"a": 0.5}, {"a": 0.1}, 1.0, -0.5), "max_cost must be >= 0"),
])
def test_rank_refuses_what_it_cannot_rank(args, message):
    with pytest.raises(ValueError, match=message):
        rank(*args)


def test_the_first_place_of_rank_is_choose():
    rng = np.random.default_rng(3)
    quality, cost = rng.random((200, 4)), rng.random((200, 4)) * 0.01
    quality[rng.random((200, 4)) < 0.1] = 0.5        # some exact ties
    for lam in (0.0, 10.0, 100.0):
        picks = choose(quality, cost, lam)
        firsts = [rank(dict(zip("abcd", q)), dict(zip("abcd", c)), lam).order[0] for q, c in zip(quality, cost)]
        assert firsts == ["abcd"[p] for p in picks]
