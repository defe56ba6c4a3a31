"""Baselines on a hand-made table: best model per task under each lambda, oracle, single, random."""

from __future__ import annotations

import numpy as np
import pytest

from routers.base import load_router, make_router, save_router
from routers.baselines import BestPerTaskRouter, OracleRouter, RandomRouter, SingleModelRouter
from routers.decision import choose
from routers.features import Features
from routers.offline.data import RoutingData

MODELS = ["cheap", "mid", "big"]
# 6 prompts: suite "math" (3) and "code" (3)
SCORES = np.array([
    [0.0, 1.0, 1.0],
    [1.0, 0.0, 1.0],
    [0.0, 1.0, 1.0],      # math: cheap 1/3, mid 2/3, big 1
    [1.0, 1.0, 1.0],
    [1.0, 1.0, 0.0],
    [1.0, 0.0, 1.0],      # code: cheap 1, mid 2/3, big 2/3
])
COSTS = np.tile([0.001, 0.01, 0.1], (6, 1))
SUITES = ["math"] * 3 + ["code"] * 3


def table() -> RoutingData:
    return RoutingData([f"p{i}" for i in range(6)], [f"text {i}" for i in range(6)], SUITES, MODELS, SCORES, COSTS)


def feats(n: int = 6, offset: int = 0) -> Features:
    emb = np.zeros((n, 4), dtype=np.float32)
    emb[:, 0] = np.arange(offset, offset + n)          # distinct embeddings identify the prompts
    return Features(emb, np.zeros((n, 2)))


def test_best_per_task_predicts_training_accuracy_per_suite():
    router = BestPerTaskRouter(MODELS).fit(table(), feats())
    pred = router.predict(feats(3), ["math", "code", "poetry"])
    np.testing.assert_allclose(pred, [[1 / 3, 2 / 3, 1.0], [1.0, 2 / 3, 2 / 3], [4 / 6, 4 / 6, 5 / 6]])
    np.testing.assert_allclose(router.predict(feats(1)), [[4 / 6, 4 / 6, 5 / 6]])


def test_best_per_task_under_lambda_is_accuracy_minus_lambda_cost_per_suite():
    router = BestPerTaskRouter(MODELS).fit(table(), feats())
    quality = router.predict(feats(2), ["math", "code"])
    cost = COSTS[:2]
    # lambda 0: math -> big (1.0), code -> cheap (1.0, cheaper than nothing better)
    assert choose(quality, cost, 0.0).tolist() == [2, 0]
    # lambda 5: math utilities 1/3-0.005, 2/3-0.05, 1-0.5 -> mid
    assert choose(quality, cost, 5.0).tolist() == [1, 0]
    # lambda 50: 1/3-0.05=0.283, 2/3-0.5=0.167, 1-5 -> cheap everywhere
    assert choose(quality, cost, 50.0).tolist() == [0, 0]


def test_best_per_task_add_model_and_round_trip(tmp_path):
    router = BestPerTaskRouter(MODELS).fit(table(), feats())
    new = RoutingData(["a", "b", "c"], ["", "", ""], ["math", "math", "code"], ["new"], [[1.0], [0.0], [1.0]],
                      np.zeros((3, 1)))
    router.add_model("new", new, feats(3))
    pred = router.predict(feats(3), ["math", "code", "poetry"])
    np.testing.assert_allclose(pred[:, :3], [[1 / 3, 2 / 3, 1.0], [1.0, 2 / 3, 2 / 3], [4 / 6, 4 / 6, 5 / 6]])
    np.testing.assert_allclose(pred[:, 3], [0.5, 1.0, 2 / 3])
    loaded = load_router(save_router(router, tmp_path / "bpt.safetensors")).router
    np.testing.assert_allclose(loaded.predict(feats(3), ["math", "code", "poetry"]), pred)


def test_oracle_returns_the_recorded_scores_and_refuses_new_prompts():
    router = OracleRouter(MODELS).fit(table(), feats())
    order = [4, 0, 2]
    np.testing.assert_allclose(router.predict(feats().subset(order), [SUITES[i] for i in order]), SCORES[order])
    np.testing.assert_allclose(router.predict(feats().subset(order)), SCORES[order])
    with pytest.raises(KeyError, match="fitted on"):
        router.predict(feats(1, offset=100))
    new = RoutingData([f"p{i}" for i in range(6)], [""] * 6, SUITES, ["new"], np.arange(6)[:, None] / 10, np.zeros((6, 1)))
    router.add_model("new", new, feats())
    np.testing.assert_allclose(router.predict(feats(), SUITES)[:, 3], np.arange(6) / 10)
    # at lambda 0 the oracle picks a right model wherever there is one
    picks = choose(router.predict(feats(), SUITES)[:, :3], COSTS, 0.0)
    assert (SCORES[np.arange(6), picks] == SCORES.max(axis=1)).all()


def test_single_model_and_random():
    single = make_router("single", MODELS, model="mid").fit(table(), feats())
    assert isinstance(single, SingleModelRouter)
    assert choose(single.predict(feats(), SUITES), COSTS, 0.0).tolist() == [1] * 6
    with pytest.raises(ValueError):
        SingleModelRouter(MODELS, model="absent")
    rand = make_router("random", MODELS, seed=3)
    assert isinstance(rand, RandomRouter)
    a, b = rand.predict(feats()), RandomRouter(MODELS, seed=3).predict(feats())
    np.testing.assert_array_equal(a, b)
    assert ((0 <= a) & (a < 1)).all() and not np.array_equal(a, RandomRouter(MODELS, seed=4).predict(feats()))
    # at lambda 0 over many prompts each model is picked about a third of the time
    picks = choose(RandomRouter(MODELS).predict(feats(3000)), np.zeros((3000, 3)), 0.0)
    assert np.allclose(np.bincount(picks) / 3000, 1 / 3, atol=0.03)
    rand.add_model("new", table(), feats())
    single.add_model("new", table(), feats())
    assert rand.predict(feats()).shape == (6, 4) and single.predict(feats())[:, 3].tolist() == [0.0] * 6
