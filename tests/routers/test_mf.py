"""MF router: recovers a planted low-rank score matrix, adds a model from its labels alone, round-trips."""

from __future__ import annotations

import numpy as np
import pytest

from routers.base import load_router, save_router
from routers.features import HAS_TOOLS, TEXT_FEATURE_NAMES, Featurizer, Features
from routers.mf import MFRouter, logistic_regression
from routers.offline.data import RoutingData

D, RANK, NUM_MODELS = 24, 3, 5


def planted(num_prompts: int, seed: int, num_models: int = NUM_MODELS):
    """Embeddings x [P, D] and true probabilities sigmoid(x W^T V^T + b) [P, M] of a rank-3 model."""
    rng = np.random.default_rng(0)                        # the same W, V, b for every call
    w = rng.normal(size=(RANK, D))
    v = rng.normal(size=(num_models, RANK))
    b = rng.normal(scale=0.5, size=num_models)
    x = np.random.default_rng(seed).normal(size=(num_prompts, D)) / np.sqrt(D) * 2
    prob = 1 / (1 + np.exp(-(x @ w.T @ v.T + b)))
    return x.astype(np.float32), prob


def data_of(x, prob, models) -> tuple[RoutingData, Features]:
    n = len(x)
    data = RoutingData([f"p{i}" for i in range(n)], [""] * n, ["s"] * n, models, prob, np.zeros_like(prob))
    return data, Features(x, np.zeros((n, 2)))


MODELS = [f"m{j}" for j in range(NUM_MODELS)]


@pytest.fixture(scope="module")
def fitted():
    x, prob = planted(800, seed=1)
    data, feats = data_of(x, prob, MODELS)
    return MFRouter(MODELS, dim=8, epochs=600, lr=0.02, weight_decay=1e-5, dropout=0.0, unseen_quality=0.05).fit(
        data, feats)


def test_recovers_a_planted_low_rank_matrix(fitted):
    x, prob = planted(400, seed=2)                        # unseen prompts
    pred = fitted.predict(Features(x, np.zeros((400, 2))))
    assert pred.shape == (400, NUM_MODELS)
    assert np.abs(pred - prob).mean() < 0.03
    # the best model per prompt is recovered where the gap is clear
    gap = np.sort(prob, axis=1)[:, -1] - np.sort(prob, axis=1)[:, -2]
    clear = gap > 0.1
    assert (pred[clear].argmax(1) == prob[clear].argmax(1)).mean() > 0.95


def test_add_model_fits_only_the_new_embedding(fitted):
    import copy

    router = copy.deepcopy(fitted)
    x, prob = planted(300, seed=3, num_models=NUM_MODELS + 1)   # the planted model has a 6th column
    labelled = RoutingData([f"q{i}" for i in range(300)], [""] * 300, ["s"] * 300, ["new"], prob[:, -1:], np.zeros((300, 1)))
    xt, prob_t = planted(400, seed=4, num_models=NUM_MODELS + 1)
    test = Features(xt, np.zeros((400, 2)))
    before = router.predict(test)
    w_before = router.projection.copy()
    router.add_model("new", labelled, Features(x, np.zeros((300, 2))))
    after = router.predict(test)
    assert router.models == [*MODELS, "new"] and after.shape == (400, NUM_MODELS + 1)
    np.testing.assert_array_equal(router.projection, w_before)
    np.testing.assert_allclose(after[:, :NUM_MODELS], before)
    assert np.abs(after[:, -1] - prob_t[:, -1]).mean() < 0.05


def test_logistic_regression_solves_its_first_order_condition():
    rng = np.random.default_rng(5)
    x = np.hstack([rng.normal(size=(200, 3)), np.ones((200, 1))])
    y = (rng.uniform(size=200) < 1 / (1 + np.exp(-(x @ [1.0, -2.0, 0.5, 0.3])))).astype(float)
    coef = logistic_regression(x, y, l2=2.0, penalise_last=False)
    p = 1 / (1 + np.exp(-(x @ coef)))
    penalty = np.array([2.0, 2.0, 2.0, 1e-6])
    np.testing.assert_allclose(x.T @ (p - y) + penalty * coef, 0.0, atol=1e-6)


def test_suites_enter_as_a_one_hot_and_unknown_suites_as_zeros():
    rng = np.random.default_rng(6)
    n = 300
    suites = ["easy"] * (n // 2) + ["hard"] * (n // 2)
    scores = np.where(np.array(suites)[:, None] == "easy", [0.9, 0.2], [0.1, 0.8])     # model a wins easy, b hard
    data = RoutingData([f"p{i}" for i in range(n)], [""] * n, suites, ["a", "b"], scores, np.zeros((n, 2)))
    feats = Features(rng.normal(size=(n, 8)).astype(np.float32), np.zeros((n, 1)))
    router = MFRouter(["a", "b"], dim=4, epochs=400, lr=0.03, weight_decay=0.0, dropout=0.0).fit(data, feats)
    pred = router.predict(feats.subset(np.arange(2)), ["easy", "hard"])
    np.testing.assert_allclose(pred, [[0.9, 0.2], [0.1, 0.8]], atol=0.05)
    assert router.project(feats.subset(np.arange(1)), ["unknown"]).shape == (1, 4)


def test_save_load_round_trip(tmp_path, fitted):
    loaded = load_router(save_router(fitted, tmp_path / "mf.safetensors")).router
    x, _ = planted(10, seed=7)
    feats = Features(x, np.zeros((10, 2)))
    np.testing.assert_allclose(loaded.predict(feats), fitted.predict(feats), rtol=1e-6)
    assert loaded.dim == 8 and loaded.models == MODELS


def test_errors():
    with pytest.raises(ValueError):
        MFRouter(["a"], dim=0)
    with pytest.raises(RuntimeError):
        MFRouter(["a"]).predict(Features(np.zeros((1, 4)), np.zeros((1, 1))))
    with pytest.raises(ValueError, match="fit the MF router"):
        MFRouter(["a"]).add_model("b", RoutingData(["p"], [""], ["s"], ["b"], [[1.0]], [[0.0]]),
                                  Features(np.zeros((1, 4)), np.zeros((1, 1))))


def of_kind(x: np.ndarray, tools: int) -> Features:
    """Embeddings x with `TEXT_FEATURE_NAMES`' columns, has_tools set to `tools`."""
    text = np.zeros((len(x), len(TEXT_FEATURE_NAMES)), dtype=np.float32)
    text[:, HAS_TOOLS] = tools
    return Features(x, text)


@pytest.fixture(scope="module")
def tool_added(fitted):
    """`fitted` (m0..m4 labelled on plain prompts) plus "new" added from 300 tool prompts only."""
    import copy

    router = copy.deepcopy(fitted)
    x, prob = planted(300, seed=3, num_models=NUM_MODELS + 1)
    labelled = RoutingData([f"q{i}" for i in range(300)], [""] * 300, ["s"] * 300, ["new"], prob[:, -1:],
                           np.zeros((300, 1)))
    router.add_model("new", labelled, of_kind(x, 1))
    return router


def test_a_model_added_from_tool_prompts_gets_the_unseen_quality_on_plain_prompts(fitted, tool_added):
    xt, prob_t = planted(400, seed=4, num_models=NUM_MODELS + 1)
    before = fitted.predict(of_kind(xt, 0))
    np.testing.assert_array_equal(fitted.predict(of_kind(xt, 1)), before)     # no model had tool labels
    assert tool_added.model_kinds.tolist() == [[True, False]] * NUM_MODELS + [[False, True]]
    plain, tools = tool_added.predict(of_kind(xt, 0)), tool_added.predict(of_kind(xt, 1))
    np.testing.assert_array_equal(plain[:, :NUM_MODELS], before)               # the others as before the add
    np.testing.assert_array_equal(plain[:, -1], 0.05)                          # no plain evidence for "new"
    np.testing.assert_array_equal(tools[:, :NUM_MODELS], 0.05)                 # no tool evidence for m0..m4
    assert np.abs(tools[:, -1] - prob_t[:, -1]).mean() < 0.05                  # "new" learned on tool prompts


class TableEmbedder:
    """A fake embedder: a fixed vector per text."""

    def __init__(self, vectors: dict[str, np.ndarray]):
        self.vectors = vectors

    def embed(self, texts):
        return np.stack([self.vectors[t] for t in texts]).astype(np.float32)


def test_score_reads_the_kind_from_the_request(tool_added):
    import copy

    x, _ = planted(1, seed=8)
    router = copy.deepcopy(tool_added)
    router.featurizer = Featurizer(TableEmbedder({"What is 2 + 2?": x[0]}))
    plain = {"messages": [{"role": "user", "content": "What is 2 + 2?"}]}
    tools = {**plain, "tools": [{"type": "function", "function": {"name": "add", "parameters": {}}}]}
    h = x @ router.projection.T                                                # [1, d]
    raw = 1 / (1 + np.exp(-(h @ router.model_embeddings.T + router.model_bias)))[0]
    assert router.score(plain) == pytest.approx({**dict(zip(MODELS, raw[:NUM_MODELS])), "new": 0.05}, rel=1e-6)
    assert router.score(tools) == pytest.approx({**dict.fromkeys(MODELS, 0.05), "new": raw[-1]}, rel=1e-6)


def test_the_evidence_rule_survives_saving_and_old_files_predict_as_before(tmp_path, tool_added):
    xt, _ = planted(50, seed=9)
    plain, tools = of_kind(xt, 0), of_kind(xt, 1)
    loaded = load_router(save_router(tool_added, tmp_path / "mf.safetensors")).router
    assert loaded.unseen_quality == 0.05
    np.testing.assert_array_equal(loaded.model_kinds, tool_added.model_kinds)
    for query in (plain, tools):
        np.testing.assert_allclose(loaded.predict(query), tool_added.predict(query), rtol=1e-6)
    # a state written before the kinds existed: every model counts as labelled on both kinds, so every cell is
    # sigmoid(v_m . W x + b_m)
    arrays, meta = tool_added.state()
    del arrays["model_kinds"], meta["unseen_quality"]
    old = MFRouter.from_state(arrays, {**meta, "models": tool_added.models})
    assert old.unseen_quality == 0.0 and old.model_kinds.all()
    raw = 1 / (1 + np.exp(-(xt @ tool_added.projection.T @ tool_added.model_embeddings.T + tool_added.model_bias)))
    for query in (plain, tools):
        np.testing.assert_allclose(old.predict(query), raw, rtol=1e-5)
