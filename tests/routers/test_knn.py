"""kNN router: predictions equal neighbour means computed by hand on a toy bank of 2-d embeddings."""

from __future__ import annotations

import numpy as np
import pytest

from routers.base import load_router, make_router, save_router
from routers.features import Features
from routers.knn import KNNRouter
from routers.offline.data import RoutingData


def unit(degrees) -> np.ndarray:
    """[N, 2] unit vectors at the given angles: cosine similarity = cos(angle difference)."""
    a = np.radians(np.asarray(degrees, dtype=np.float64))
    return np.stack([np.cos(a), np.sin(a)], axis=1).astype(np.float32)


def feats(degrees) -> Features:
    return Features(unit(degrees), np.zeros((len(degrees), 3)))


# five prompts at 0, 10, 20, 90 and 180 degrees; models "a" and "b"; suites s, s, s, t, t
ANGLES = [0, 10, 20, 90, 180]
SCORES = np.array([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0], [0.0, 1.0], [1.0, 1.0]])
SUITES = ["s", "s", "s", "t", "t"]


def toy() -> RoutingData:
    return RoutingData([f"p{i}" for i in range(5)], [f"prompt {i}" for i in range(5)], SUITES, ["a", "b"],
                       SCORES, np.full((5, 2), 0.001))


def test_plain_neighbour_mean_without_prior():
    router = KNNRouter(["a", "b"], k=2, prior=0.0, by_suite=False).fit(toy(), feats(ANGLES))
    # a query at 4 degrees: nearest are 0 and 10 degrees -> mean of rows 0 and 1
    np.testing.assert_allclose(router.predict(feats([4])), [[0.5, 0.0]])
    # at 110 degrees: 90 (20 away) and 180 (70 away) are nearest -> mean of rows 3 and 4
    np.testing.assert_allclose(router.predict(feats([110])), [[0.5, 1.0]])


def test_prior_shrinks_toward_the_suite_mean_and_suite_restricts_neighbours():
    router = KNNRouter(["a", "b"], k=2, prior=2.0, by_suite=True).fit(toy(), feats(ANGLES))
    suite_t = SCORES[3:].mean(axis=0)            # [0.5, 1.0]
    # suite t has only rows 3 and 4: both are the neighbours whatever the angle
    expected = (SCORES[3] + SCORES[4] + 2.0 * suite_t) / (2 + 2.0)
    np.testing.assert_allclose(router.predict(feats([5]), ["t"]), [expected])
    # suite s, query at 18 degrees: neighbours 20 and 10
    suite_s = SCORES[:3].mean(axis=0)
    expected_s = (SCORES[2] + SCORES[1] + 2.0 * suite_s) / 4.0
    np.testing.assert_allclose(router.predict(feats([18]), ["s"]), [expected_s])
    # an unknown suite searches every prompt and shrinks toward the global mean
    expected_u = (SCORES[2] + SCORES[1] + 2.0 * SCORES.mean(axis=0)) / 4.0
    np.testing.assert_allclose(router.predict(feats([18]), ["new"]), [expected_u])
    np.testing.assert_allclose(router.predict(feats([18])), [expected_u])


def test_temperature_weights_are_softmax_of_cosines():
    router = KNNRouter(["a", "b"], k=3, prior=0.0, temperature=0.1, by_suite=False).fit(toy(), feats(ANGLES))
    sims = unit(ANGLES) @ unit([12])[0]
    top = np.argsort(-sims)[:3]
    w = np.exp(sims[top] / 0.1)
    np.testing.assert_allclose(router.predict(feats([12]))[0], (w[:, None] * SCORES[top]).sum(0) / w.sum(), rtol=1e-6)


def test_leave_one_out_and_find_in_bank():
    router = KNNRouter(["a", "b"], k=1, prior=0.0, by_suite=False).fit(toy(), feats(ANGLES))
    # each prompt's nearest other prompt: 0->10, 10->0 or 20 (tie: both 10 degrees), 20->10, 90->20, 180->90
    loo = router.neighbour_means(feats(ANGLES), None, (1,), exclude=np.arange(5))[0]
    np.testing.assert_allclose(loo[[0, 2, 3, 4]], SCORES[[1, 1, 2, 3]])
    assert router.find_in_bank(feats([20, 21])).tolist() == [2, -1]
    assert router.find_in_bank(feats([20]), ["t"]).tolist() == [-1]          # same text, other suite


def test_add_model_leaves_the_others_unchanged():
    router = KNNRouter(["a", "b"], k=2, prior=0.0, by_suite=False).fit(toy(), feats(ANGLES))
    queries = feats([3, 45, 170])
    before = router.predict(queries)
    new = RoutingData(["n0", "n1", "n2"], ["x", "y", "z"], ["s", "s", "t"], ["c"],
                      np.array([[1.0], [0.0], [np.nan]]), np.zeros((3, 1)))
    router.add_model("c", new, feats([0, 40, 90]))
    after = router.predict(queries)
    assert router.models == ["a", "b", "c"]
    np.testing.assert_allclose(after[:, :2], before)
    # "c" has two labelled prompts (0 and 40 degrees): k=2 takes both
    np.testing.assert_allclose(after[:, 2], [0.5, 0.5, 0.5])
    with pytest.raises(ValueError):
        router.add_model("c", new, feats([0, 40, 90]))


def test_save_load_round_trip(tmp_path):
    router = make_router("knn", ["a", "b"], k=2, prior=1.5).fit(toy(), feats(ANGLES))
    loaded = load_router(save_router(router, tmp_path / "knn.safetensors")).router
    queries = feats([7, 95, 200])
    np.testing.assert_allclose(loaded.predict(queries, ["s", "t", "u"]), router.predict(queries, ["s", "t", "u"]))
    assert (loaded.k, loaded.prior, loaded.by_suite) == (2, 1.5, True)


def test_rejects_bad_options_and_mismatched_rows():
    with pytest.raises(ValueError):
        KNNRouter(["a"], k=0)
    with pytest.raises(ValueError):
        KNNRouter(["a", "b"]).fit(toy(), feats([0, 1]))
    with pytest.raises(RuntimeError):
        KNNRouter(["a"]).predict(feats([0]))


def kinds(degrees, tools) -> Features:
    """`feats` with the has_tools text column set per prompt."""
    from routers.features import HAS_TOOLS, TEXT_FEATURE_NAMES
    text = np.zeros((len(degrees), len(TEXT_FEATURE_NAMES)))
    text[:, HAS_TOOLS] = tools
    return Features(unit(degrees), text)


def test_neighbours_come_from_the_query_kind_and_unseen_models_get_the_unseen_quality():
    # "a" and "b" labelled on plain prompts only; "t" (a tool-calling fine-tune) added from tool prompts only
    router = KNNRouter(["a", "b"], k=2, prior=0.0, by_suite=False, unseen_quality=0.05).fit(
        toy(), kinds(ANGLES, [0] * 5))
    labelled = RoutingData(["q0", "q1", "q2"], ["x", "y", "z"], ["bfcl"] * 3, ["t"],
                           np.array([[0.9], [0.6], [0.0]]), np.full((3, 1), 0.001))
    router.add_model("t", labelled, kinds([2, 8, 170], [1, 1, 1]))
    plain, tools = router.predict(kinds([4, 4], [0, 1]))
    # plain query: "a" and "b" as before the add; "t" has no plain evidence -> the unseen quality
    np.testing.assert_allclose(plain, [0.5, 0.0, 0.05])
    # tool query: only "t" has tool evidence (neighbours at 2 and 8 degrees); a and b get the unseen quality
    np.testing.assert_allclose(tools, [0.05, 0.05, 0.75])
    np.testing.assert_allclose(router.predict(kinds([110], [0]))[0], [0.5, 1.0, 0.05])
    with pytest.raises(ValueError, match="unseen_quality"):
        KNNRouter(["a"], unseen_quality=1.5)


def test_a_kind_no_model_has_labels_for_uses_every_prompt():
    router = KNNRouter(["a", "b"], k=2, prior=0.0, by_suite=False).fit(toy(), kinds(ANGLES, [0] * 5))
    np.testing.assert_allclose(router.predict(kinds([4], [1])), router.predict(kinds([4], [0])))


def test_prompt_kinds_survive_saving(tmp_path):
    router = KNNRouter(["a", "b"], k=2, prior=0.0, by_suite=False, unseen_quality=0.05).fit(
        toy(), kinds(ANGLES, [0, 0, 1, 1, 0]))
    path = save_router(router, tmp_path / "r.safetensors")
    loaded = load_router(path).router
    np.testing.assert_array_equal(loaded.bank_tools, [False, False, True, True, False])
    assert loaded.unseen_quality == 0.05
    query = kinds([4, 100], [1, 0])
    np.testing.assert_allclose(loaded.predict(query), router.predict(query))
    # tool query at 4 degrees: tool rows 20 and 90 degrees
    np.testing.assert_allclose(router.predict(kinds([4], [1])), [(SCORES[2] + SCORES[3]) / 2])
