"""Offline evaluation: a router that knows the answers beats the baselines; reports, splits and folds."""

from __future__ import annotations

import json

import numpy as np
import pytest

from routers.base import ROUTERS, Router, register_router
from routers.baselines import PromptLengthRouter
from routers.features import Features, text_features
from routers.offline.crossval import evaluate_add_model, evaluate_kfold, evaluate_resplits
from routers.offline.data import RoutingData
from routers.offline.evaluate import evaluate_split
from routers.offline.settings import EvalSettings


class PeekingRouter(Router):
    """Reads the true scores hidden in the embedding's first M coordinates (plus noise): a near-perfect
    learned router, so its metrics must approach the oracle's."""

    type = "peek"

    def __init__(self, models, noise: float = 0.1):
        super().__init__(models)
        self.noise = noise

    def fit(self, data, features):
        return self

    def predict(self, features, suites=None):
        rng = np.random.default_rng(0)
        m = self.num_models
        return features.embeddings[:, :m] + rng.normal(0, self.noise, (features.num_rows, m))

    def add_model(self, name, data, features):
        self.models.append(name)


@pytest.fixture(autouse=True)
def peek_registered():
    register_router("peek", f"{__name__}:PeekingRouter")
    yield
    ROUTERS.pop("peek", None)


def synthetic(n: int, models: list[str], acc: list[float], cost: list[float], seed: int, prefix: str = "p"):
    """Independent 0/1 scores per model; costs fixed per model with a little per-prompt noise."""
    rng = np.random.default_rng(seed)
    scores = (rng.uniform(size=(n, len(models))) < np.array(acc)).astype(float)
    costs = np.array(cost) * rng.uniform(0.9, 1.1, size=(n, len(models)))
    prompts = [("word " * int(rng.integers(1, 60))).strip() + f" #{i}" for i in range(n)]
    suites = [("a", "b")[i % 2] for i in range(n)]
    data = RoutingData([f"{prefix}{i}" for i in range(n)], prompts, suites, models, scores, costs)
    emb = np.zeros((n, 384), dtype=np.float32)
    emb[:, : len(models)] = scores
    return data, Features(emb, text_features(prompts))


MODELS = ["big", "mid", "small"]


def test_a_peeking_router_approaches_the_oracle_and_beats_the_baselines():
    train, ftr = synthetic(300, MODELS, [0.9, 0.7, 0.5], [1.0, 0.1, 0.01], seed=0)
    test, fte = synthetic(200, MODELS, [0.9, 0.7, 0.5], [1.0, 0.1, 0.01], seed=1, prefix="q")
    report = evaluate_split(train, test, EvalSettings(types=("peek",)), features=(ftr, fte))
    json.dumps(report)
    r = report["routers"]
    assert set(r) == {"peek", "random", "best-per-task", "length", "oracle", "cascade:peek", "cascade:oracle"}
    assert r["cascade:peek"]["steps"] == ["small", "mid", "big"]       # the training frontier, cheapest first
    assert report["reference"]["model"] == "big"
    assert report["single_models"]["big"]["accuracy"] == pytest.approx(test.scores[:, 0].mean())
    assert report["cost_range"] == pytest.approx([0.0, test.costs[:, 0].mean()])
    oracle_acc = np.max(test.scores, axis=1).mean()
    assert r["oracle"]["max_quality"] == pytest.approx(oracle_acc)
    assert r["oracle"]["aiq"] >= r["peek"]["aiq"] > r["best-per-task"]["aiq"]
    assert r["peek"]["aiq"] > report["zero_router"]["aiq"] and r["peek"]["aiq"] > r["random"]["aiq"]
    # knowing the answers, the big model's accuracy comes far cheaper than the big model
    assert r["peek"]["cost_ratio_at_best_accuracy"] < 0.5
    assert r["peek"]["accuracy_at_best_cost"] >= report["reference"]["accuracy"]
    curve = r["peek"]["curve"]
    assert len(curve["lambda"]) == len(curve["cost_usd"]) == len(curve["quality"]) == len(curve["share"])
    assert curve["lambda"][0] == 0.0 and np.allclose(np.sum(curve["share"], axis=1), 1.0, atol=1e-3)
    assert "apgr" not in r["peek"]                                # three models: no strong/weak pair


def test_a_pair_gets_routellm_metrics_random_near_half():
    pair = ["strong", "weak"]
    train, ftr = synthetic(400, pair, [0.85, 0.55], [1.0, 0.05], seed=2)
    test, fte = synthetic(2000, pair, [0.85, 0.55], [1.0, 0.05], seed=3, prefix="q")
    report = evaluate_split(train, test, EvalSettings(types=("peek",), baselines=("random", "oracle")),
                            features=(ftr, fte))
    assert report["pair"] == {"strong": "strong", "weak": "weak"}
    r = report["routers"]
    assert r["random"]["apgr"] == pytest.approx(0.5, abs=0.05)
    assert r["peek"]["apgr"] > 0.85 and r["oracle"]["apgr"] >= r["peek"]["apgr"] - 0.02
    assert r["peek"]["cpt50"] < r["random"]["cpt50"] and 0 <= r["peek"]["cpt80"] <= 1
    assert len(r["peek"]["threshold_curve"]["strong_share"]) == 11


def test_evaluate_split_checks_its_inputs():
    train, ftr = synthetic(50, MODELS, [0.9, 0.7, 0.5], [1.0, 0.1, 0.01], seed=0)
    with pytest.raises(ValueError, match="different models"):
        evaluate_split(train, train.select_models(["big", "mid"]), EvalSettings(types=()), features=(ftr, ftr))
    holey = train.subset(np.arange(50))
    holey.scores[0, 0] = np.nan
    with pytest.raises(ValueError, match="missing scores"):
        evaluate_split(train, holey, EvalSettings(types=()), features=(ftr, ftr))
    with pytest.raises(ValueError, match="unknown baselines"):
        EvalSettings(baselines=("coin",))


class TableFeaturizer:
    """Features looked up by prompt text (the synthetic embeddings), as a Featurizer would compute them."""

    def __init__(self, data, feats):
        self.rows = {p: i for i, p in enumerate(data.prompts)}
        self.feats = feats

    def transform(self, texts, has_tools=None):
        return self.feats.subset([self.rows[t] for t in texts])


def test_resplits_and_kfold_summarise_every_split():
    train, ftr = synthetic(200, MODELS, [0.9, 0.7, 0.5], [1.0, 0.1, 0.01], seed=0)
    test, fte = synthetic(100, MODELS, [0.9, 0.7, 0.5], [1.0, 0.1, 0.01], seed=1, prefix="q")
    pool = RoutingData.concat([train, test])
    featurizer = TableFeaturizer(pool, Features.concat([ftr, fte]))
    settings = EvalSettings(types=("peek",), baselines=("oracle",), keep_curves=False)
    result = evaluate_resplits(train, test, settings, num_splits=3, featurizer=featurizer)
    assert [r["num_test"] for r in result["splits"]] == [100, 100, 100]
    assert len({tuple(sorted(r["reference"].items())) for r in result["splits"]}) >= 1
    aiqs = [r["routers"]["peek"]["aiq"] for r in result["splits"]]
    assert result["summary"]["peek"]["aiq"]["mean"] == pytest.approx(np.mean(aiqs))
    assert result["summary"]["peek"]["aiq"]["std"] == pytest.approx(np.std(aiqs, ddof=1))
    assert result["summary"]["peek"]["aiq"]["n"] == 3
    folds = evaluate_kfold(pool, settings, k=3, seeds=(0, 1), featurizer=featurizer)
    assert len(folds["folds"]) == 6 and sum(f["num_test"] for f in folds["folds"][:3]) == 300
    by_suite = evaluate_kfold(pool, settings, k=2, group_by="suite", featurizer=featurizer)
    assert sorted(f["num_test"] for f in by_suite["folds"]) == [150, 150]
    json.dumps(folds)


def test_prompt_length_router_learns_scores_by_length():
    prompts = ["x" * n for n in range(1, 101)]
    scores = np.stack([np.arange(100) >= 50, np.arange(100) < 50], axis=1).astype(float)
    data = RoutingData([f"p{i}" for i in range(100)], prompts, ["s"] * 100, ["long", "short"], scores, np.zeros((100, 2)))
    feats = Features(np.zeros((100, 384)), text_features(prompts))
    router = PromptLengthRouter(data.models).fit(data, feats)
    q = router.predict(Features(np.zeros((2, 384)), text_features(["x" * 3, "x" * 90])))
    assert q[0, 1] == 1.0 and q[0, 0] == 0.0 and q[1, 0] == 1.0
    again = PromptLengthRouter.from_state(*router.state()[:1], {**router.state()[1], "models": data.models})
    np.testing.assert_array_equal(again.predict(feats), router.predict(feats))


def test_add_model_report_compares_with_a_full_retrain():
    train, ftr = synthetic(400, MODELS, [0.9, 0.7, 0.5], [1.0, 0.1, 0.01], seed=0)
    test, fte = synthetic(200, MODELS, [0.9, 0.7, 0.5], [1.0, 0.1, 0.01], seed=1, prefix="q")
    result = evaluate_add_model(train, test, "peek", "mid", num_labelled=100, features=(ftr, fte))
    assert result["num_labelled"] == 100 and result["new_model"] == "mid"
    # the peeking router reads the columns by position: after add_model "mid" is the last column,
    # reordered back to the test's model order before measuring
    assert result["new_model_max_share"] > 0
    assert set(result) >= {"added", "full", "aiq_gap"}
    with pytest.raises(KeyError):
        evaluate_add_model(train, test, "peek", "nobody", features=(ftr, fte))
