"""The router interface, registry, one-file save/load and the decision of a loaded router."""

from __future__ import annotations

import json

import numpy as np
import pytest

from routers.base import ROUTERS, LoadedRouter, Router, load_router, make_router, read_header, register_router, save_router
from routers.decision import CostModel
from routers.features import Featurizer, Features
from routers.offline.data import RoutingData


class LengthEmbedder:
    """A fake embedder: the first coordinate is the text length."""

    def embed(self, texts):
        out = np.zeros((len(texts), 384), dtype=np.float32)
        out[:, 0] = [len(t) for t in texts]
        return out


class ToyRouter(Router):
    """Quality = a per-model weight times the text length feature plus a bias (fit: per-model mean score)."""

    type = "toy"

    def __init__(self, models, scale: float = 1.0):
        super().__init__(models)
        self.scale = scale
        self.bias = np.zeros(len(self.models))
        self.weight = np.zeros(len(self.models))

    def fit(self, data, features):
        data = self.aligned(data)
        self.bias = np.nanmean(data.scores, axis=0)
        return self

    def predict(self, features, suites=None):
        return self.bias[None, :] + self.scale * self.weight[None, :] * features.embeddings[:, :1]

    def add_model(self, name, data, features):
        self.models.append(name)
        self.bias = np.append(self.bias, np.nanmean(data.select_models([name]).scores))
        self.weight = np.append(self.weight, 0.0)

    def state(self):
        return {"bias": self.bias, "weight": self.weight}, {"scale": self.scale}

    @classmethod
    def from_state(cls, arrays, meta):
        router = cls(meta["models"], scale=meta["scale"])
        router.bias, router.weight = arrays["bias"], arrays["weight"]
        return router


@pytest.fixture(autouse=True)
def toy_registered():
    register_router("toy", f"{__name__}:ToyRouter")
    yield
    ROUTERS.pop("toy", None)


def toy_data() -> RoutingData:
    prompts = ["short", "a much longer prompt here", "mid-size one"]
    scores = np.array([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0], [0.0, 1.0, 1.0]])
    costs = np.array([[0.01, 0.001, 0.0], [0.02, 0.002, 0.0], [0.015, 0.0015, 0.0]])
    return RoutingData(["p0", "p1", "p2"], prompts, ["s"] * 3, ["big", "mid", "free"], scores, costs)


def test_router_base_checks_models_and_default_add_model():
    with pytest.raises(ValueError):
        ToyRouter([])
    with pytest.raises(ValueError):
        ToyRouter(["a", "a"])

    class Bare(Router):
        type = "bare"

        def fit(self, data, features):
            return self

        def predict(self, features, suites=None):
            return np.zeros((features.num_rows, self.num_models))

    bare = Bare(["a"])
    with pytest.raises(NotImplementedError, match="cannot add a model"):
        bare.add_model("b", toy_data(), Features(np.zeros((3, 384)), np.zeros((3, 11))))
    with pytest.raises(NotImplementedError, match="cannot be saved"):
        save_router(bare, "/tmp/never.safetensors")


def test_registry_and_make_router():
    router = make_router("toy", ["a", "b"], scale=2.0)
    assert isinstance(router, ToyRouter) and router.models == ["a", "b"] and router.scale == 2.0
    with pytest.raises(ValueError, match="unknown router type"):
        make_router("nope", ["a"])
    assert {"knn", "lgbm", "mf", "random", "single", "oracle", "best-per-task"} <= set(ROUTERS)


def test_score_reads_one_request_through_the_featurizer():
    router = ToyRouter(["big", "mid", "free"]).fit(toy_data(), None)
    router.weight = np.array([0.0, 0.01, 0.0])
    router.featurizer = Featurizer(LengthEmbedder())
    scores = router.score({"messages": [{"role": "user", "content": "x" * 10}]})
    assert scores == pytest.approx({"big": 2 / 3, "mid": 2 / 3 + 0.1, "free": 2 / 3})


def test_save_and_load_round_trip_one_safetensors_file(tmp_path):
    data = toy_data()
    router = ToyRouter(data.models, scale=3.0).fit(data, None)
    router.weight = np.array([0.1, 0.2, 0.3])
    costs = CostModel.from_data(data)
    path = save_router(router, tmp_path / "r.safetensors", costs=costs,
                       decision={"rule": "lambda", "cost_penalty": 12.5}, info={"trained_on": ["toy"]})
    assert path.is_file() and list(tmp_path.iterdir()) == [path]
    header = read_header(path)
    assert header["type"] == "toy" and header["models"] == data.models and header["router"] == {"scale": 3.0}
    assert json.loads(json.dumps(header)) == header
    loaded = load_router(path)
    assert isinstance(loaded, LoadedRouter) and isinstance(loaded.router, ToyRouter)
    assert loaded.router.scale == 3.0 and loaded.models == data.models
    feats = Features(np.ones((2, 384)), np.zeros((2, 11)))
    np.testing.assert_allclose(loaded.router.predict(feats), router.predict(feats))
    np.testing.assert_allclose(loaded.costs.mean_cost, costs.mean_cost)
    assert loaded.decision == {"rule": "lambda", "cost_penalty": 12.5} and loaded.info == {"trained_on": ["toy"]}


def test_load_refuses_what_is_not_a_router(tmp_path):
    from safetensors.numpy import save_file

    with pytest.raises(FileNotFoundError):
        load_router(tmp_path / "missing.safetensors")
    (tmp_path / "junk.bin").write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError):
        load_router(tmp_path / "junk.bin")
    save_file({"w": np.zeros(2, dtype=np.float32)}, str(tmp_path / "plain.safetensors"))
    with pytest.raises(ValueError, match="not a saved router"):
        load_router(tmp_path / "plain.safetensors")
    router = ToyRouter(["a"]).fit(RoutingData(["p"], ["t"], ["s"], ["a"], np.ones((1, 1)), np.zeros((1, 1))), None)
    path = save_router(router, tmp_path / "r.safetensors")
    ROUTERS.pop("toy")
    with pytest.raises(ValueError, match="unknown router type"):
        load_router(path)


def test_loaded_router_decides_with_the_saved_knob_and_overrides(tmp_path):
    data = toy_data()
    router = ToyRouter(data.models).fit(data, None)          # quality: big 2/3, mid 2/3, free 2/3 -> set below
    router.bias = np.array([0.9, 0.7, 0.3])
    router.featurizer = Featurizer(LengthEmbedder())
    costs = CostModel(data.models, [np.nan] * 3, [np.nan] * 3, [np.nan] * 3, mean_cost=[0.01, 0.001, 0.0])
    body = {"messages": [{"role": "user", "content": "hello"}]}
    free_lunch = LoadedRouter(router, costs, {"rule": "lambda", "cost_penalty": 0.0})
    decision = free_lunch.decide(body)
    assert decision.chosen == "big" and decision.order == ["big", "mid", "free"]
    # lambda = 30: utilities 0.9 - 0.3 = 0.6, 0.7 - 0.03 = 0.67, 0.3 -> mid
    assert free_lunch.decide(body, cost_penalty=30.0).chosen == "mid"
    # lambda = 500: 0.9 - 5, 0.7 - 0.5, 0.3 -> free
    assert LoadedRouter(router, costs, {"rule": "lambda", "cost_penalty": 500.0}).decide(body).chosen == "free"
    priced = LoadedRouter(router, CostModel(data.models, [0.0] * 3, [1000.0] * 3, [100.0, 10.0, 1.0], [0.0] * 3))
    np.testing.assert_allclose(priced.expected_cost(body), [0.1, 0.01, 0.001])          # 1000 USD / M output tokens
    np.testing.assert_allclose(priced.expected_cost({**body, "max_tokens": 5}), [0.005, 0.005, 0.001])
    np.testing.assert_allclose(priced.expected_cost({**body, "max_tokens": 50, "max_completion_tokens": 2}), [0.002] * 2 + [0.001])
    capped = free_lunch.decide(body, max_cost_usd=0.005)
    assert capped.chosen == "mid" and capped.excluded == ["big"]
    assert free_lunch.decide(body, allowed=["free", "mid"]).chosen == "mid"
    with pytest.raises(ValueError, match="allowed"):
        free_lunch.decide(body, allowed=["other"])
    threshold = LoadedRouter(router, costs, {"rule": "threshold", "strong": "big", "weak": "free", "threshold": 0.5})
    assert threshold.decide(body).chosen == "big"            # gain 0.6 >= 0.5
    threshold.decision["threshold"] = 0.7
    d = threshold.decide(body)
    assert d.chosen == "free" and d.as_dict()["rule"] == "threshold"
    assert json.loads(json.dumps(d.as_dict()))["chosen"] == "free"
