"""LightGBM router: learns a planted rule, stacks cross-fitted kNN features, adds a model, round-trips."""

from __future__ import annotations

import numpy as np
import pytest

from routers.base import load_router, save_router
from routers.features import BASE_FEATURE_NAMES, HAS_TOOLS, TEXT_FEATURE_NAMES, Features
from routers.lexical import hashed_ngrams
from routers.lgbm import LGBMRouter
from routers.offline.data import RoutingData

FAST = {"num_rounds": 60, "params": {"learning_rate": 0.2, "min_data_in_leaf": 5}}


def planted(n: int, seed: int):
    """Model "short" is right on prompts whose first text feature < 0, "long" on the others; "either" is
    right on a suite "easy" only. Embeddings: noise plus the sign in coordinate 0 (for the kNN features)."""
    rng = np.random.default_rng(seed)
    text = rng.normal(size=(n, 4)).astype(np.float32)
    emb = rng.normal(size=(n, 16)).astype(np.float32)
    emb[:, 0] = 3 * np.sign(text[:, 0])
    suites = np.where(rng.uniform(size=n) < 0.5, "easy", "hard")
    scores = np.stack([(text[:, 0] < 0), (text[:, 0] >= 0), suites == "easy"], axis=1).astype(float)
    data = RoutingData([f"p{i}" for i in range(n)], [""] * n, suites.tolist(), ["short", "long", "either"], scores,
                       np.zeros_like(scores))
    return data, Features(emb, text)


@pytest.mark.parametrize("layout", ["per-model", "shared"])
def test_learns_a_planted_rule(layout):
    train, train_f = planted(400, seed=0)
    test, test_f = planted(200, seed=1)
    router = LGBMRouter(train.models, layout=layout, num_components=4, **FAST).fit(train, train_f)
    pred = router.predict(test_f, test.suites)
    assert pred.shape == (200, 3) and ((0 <= pred) & (pred <= 1)).all()
    assert ((pred > 0.5) == (test.scores > 0.5)).mean() > 0.95


def test_stacked_neighbour_features_never_see_the_prompts_own_label():
    train, train_f = planted(300, seed=2)
    router = LGBMRouter(train.models, num_components=4, neighbours=(5, 20), **FAST)
    x = router._cross_fitted_neighbours(train, train_f)
    assert x.shape == (300, 2 * 3)
    flipped = train.subset(np.arange(300))
    flipped.scores[0] = 1 - flipped.scores[0]
    y = router._cross_fitted_neighbours(flipped, train_f)
    np.testing.assert_array_equal(y[0], x[0])           # its own label does not reach its own features
    assert (y[1:] != x[1:]).any()                       # but it reaches its neighbours' in other folds


@pytest.mark.parametrize("layout", ["per-model", "shared"])
def test_add_model_trains_one_booster_and_leaves_the_others(layout):
    train, train_f = planted(400, seed=3)
    old = ["short", "either"]
    router = LGBMRouter(old, layout=layout, num_components=4, **FAST).fit(train.select_models(old), train_f)
    test, test_f = planted(200, seed=4)
    before = router.predict(test_f, test.suites)
    labelled = np.arange(300)
    router.add_model("long", train.subset(labelled).select_models(["long"]), train_f.subset(labelled))
    after = router.predict(test_f, test.suites)
    assert router.models == ["short", "either", "long"] and list(router.added) == ["long"]
    assert sorted(router.boosters) == (sorted(old) if layout == "per-model" else [""])
    np.testing.assert_array_equal(after[:, :2], before)
    assert ((after[:, 2] > 0.5) == (test.scores[:, 1] > 0.5)).mean() > 0.95


def test_save_load_round_trip_keeps_boosters_as_text(tmp_path):
    train, train_f = planted(200, seed=5)
    router = LGBMRouter(train.models[:2], num_components=4, neighbours=(3,), **FAST)
    router.fit(train.select_models(train.models[:2]), train_f)
    router.add_model("either", train, train_f)
    path = save_router(router, tmp_path / "lgbm.safetensors")
    loaded = load_router(path).router
    test, test_f = planted(50, seed=6)
    np.testing.assert_allclose(loaded.predict(test_f, test.suites), router.predict(test_f, test.suites))
    assert loaded.layout == "per-model" and loaded.neighbours == [3] and loaded.knn is not None
    assert loaded.models == train.models and list(loaded.added) == ["either"]
    assert b"tree" in path.read_bytes()        # LightGBM's text model format, inside the JSON header


def test_a_router_reads_the_text_columns_it_was_fitted_on(tmp_path):
    """Featurizers append text columns (issue 6's word-problem and choice features); a router fitted on fewer
    reads its first F, and a file saved before F was recorded reads the base columns."""
    train, train_f = planted(200, seed=11)
    router = LGBMRouter(train.models, num_components=4, neighbours=(5,), **FAST).fit(train, train_f)
    assert router.num_text_features == 4
    wider = Features(train_f.embeddings, np.hstack([train_f.text, np.full((200, 7), 9.0, dtype=np.float32)]))
    np.testing.assert_array_equal(router.predict(wider, train.suites), router.predict(train_f, train.suites))
    arrays, meta = router.state()
    assert meta["num_text_features"] == 4
    del meta["num_text_features"]
    old = LGBMRouter.from_state(arrays, {**meta, "models": router.models})
    assert old.num_text_features == len(BASE_FEATURE_NAMES) == 11


def test_raw_embeddings_without_neighbours(tmp_path):
    train, train_f = planted(200, seed=8)
    router = LGBMRouter(train.models, num_components=0, neighbours=(), **FAST).fit(train, train_f)
    loaded = load_router(save_router(router, tmp_path / "raw.safetensors")).router
    np.testing.assert_allclose(loaded.predict(train_f, train.suites), router.predict(train_f, train.suites))
    assert loaded.knn is None


def test_errors():
    with pytest.raises(ValueError, match="layout"):
        LGBMRouter(["a"], layout="stacked")
    with pytest.raises(RuntimeError):
        LGBMRouter(["a"]).predict(Features(np.zeros((1, 4)), np.zeros((1, 4))))
    train, train_f = planted(50, seed=7)
    with pytest.raises(ValueError, match="already"):
        LGBMRouter(train.models, **FAST).fit(train, train_f).add_model("long", train, train_f)


def of_kind(features: Features, tools: int) -> Features:
    """`features` with the text widened to `TEXT_FEATURE_NAMES`' columns and has_tools set to `tools`."""
    text = np.zeros((features.num_rows, len(TEXT_FEATURE_NAMES)), dtype=np.float32)
    text[:, :features.text.shape[1]] = features.text
    text[:, HAS_TOOLS] = tools
    return Features(features.embeddings, text)


def tool_added(layout: str):
    """"short" and "either" fitted on plain prompts; "long" added from tool prompts only; unseen quality 0.05.
    Returns (router, its predictions before the add on plain test prompts, test data, test features)."""
    train, train_f = planted(400, seed=9)
    old = ["short", "either"]
    router = LGBMRouter(old, layout=layout, num_components=4, unseen_quality=0.05, **FAST)
    router.fit(train.select_models(old), of_kind(train_f, 0))
    test, test_f = planted(200, seed=10)
    before = router.predict(of_kind(test_f, 0), test.suites)
    # no model has tool labels yet: tool prompts are predicted as they are
    np.testing.assert_array_equal(router.predict(of_kind(test_f, 1), test.suites), before)
    labelled = np.arange(300)
    router.add_model("long", train.subset(labelled).select_models(["long"]), of_kind(train_f.subset(labelled), 1))
    return router, before, test, test_f


@pytest.mark.parametrize("layout", ["per-model", "shared"])
def test_a_model_added_from_tool_prompts_gets_the_unseen_quality_on_plain_prompts(layout):
    router, before, test, test_f = tool_added(layout)
    np.testing.assert_array_equal(router.model_kinds, [[True, False], [True, False], [False, True]])
    plain = router.predict(of_kind(test_f, 0), test.suites)
    np.testing.assert_array_equal(plain[:, :2], before)                 # the fit-time models as before the add
    np.testing.assert_array_equal(plain[:, 2], 0.05)                    # no plain evidence for "long"
    tools = router.predict(of_kind(test_f, 1), test.suites)
    np.testing.assert_array_equal(tools[:, :2], 0.05)                   # no tool evidence for "short", "either"
    assert ((tools[:, 2] > 0.5) == (test.scores[:, 1] > 0.5)).mean() > 0.95    # "long" is learned on tool prompts


def test_the_evidence_rule_survives_saving_and_old_files_predict_as_before(tmp_path):
    router, _, test, test_f = tool_added("per-model")
    plain, tools = of_kind(test_f, 0), of_kind(test_f, 1)
    loaded = load_router(save_router(router, tmp_path / "lgbm.safetensors")).router
    assert loaded.unseen_quality == 0.05
    np.testing.assert_array_equal(loaded.model_kinds, router.model_kinds)
    for query in (plain, tools):
        np.testing.assert_allclose(loaded.predict(query, test.suites), router.predict(query, test.suites))
    # a state written before the kinds existed: every model counts as labelled on both kinds, so each model
    # gets its booster's prediction, the added one on [the base models' quality, suite one-hot]
    arrays, meta = router.state()
    del arrays["model_kinds"], meta["unseen_quality"]
    old = LGBMRouter.from_state(arrays, {**meta, "models": router.models})
    assert old.unseen_quality == 0.0 and old.model_kinds.all()
    for query in (plain, tools):
        x = router._inputs(query, test.suites)
        base = np.stack([router.boosters[m].predict(x) for m in ["short", "either"]], axis=1)
        added = router.added["long"].predict(np.hstack([base, router._onehot(len(x), test.suites)]))
        np.testing.assert_allclose(old.predict(query, test.suites), np.hstack([base, added[:, None]]))


def test_a_router_fitted_on_choice_embeddings_reads_them_after_loading(tmp_path):
    from routers.features import CHOICE_EMBEDDING_FEATURE_NAMES

    """The planted rule moved into a choice feature: only a router reading the choice features learns it."""
    train, train_f = planted(400, seed=12)
    test, test_f = planted(200, seed=13)
    def with_choices(f):
        choices = np.zeros((len(f.text), len(CHOICE_EMBEDDING_FEATURE_NAMES)), dtype=np.float32)
        choices[:, 2] = f.text[:, 0]
        return Features(np.zeros_like(f.embeddings), np.zeros_like(f.text), choices)
    router = LGBMRouter(train.models, num_components=4, neighbours=(), **FAST).fit(train, with_choices(train_f))
    blind = LGBMRouter(train.models, num_components=4, neighbours=(), **FAST).fit(
        train, Features(np.zeros_like(train_f.embeddings), np.zeros_like(train_f.text)))
    assert router.reads_choice_embeddings and not blind.reads_choice_embeddings
    right = test.scores[:, 0] == 1  # "short" is right exactly when text[:, 0] < 0
    seen = router.predict(with_choices(test_f), test.suites)[:, 0]
    assert (seen[right].min() > 0.5 > seen[~right].max())
    unseen = blind.predict(Features(np.zeros_like(test_f.embeddings), np.zeros_like(test_f.text)), test.suites)[:, 0]
    assert np.mean((unseen > 0.5) == right) < 0.7   # only the suite is left to it
    save_router(router, tmp_path / "r.safetensors")
    loaded = load_router(tmp_path / "r.safetensors").router
    assert loaded.reads_choice_embeddings and loaded.featurizer.choice_embeddings
    np.testing.assert_allclose(loaded.predict(with_choices(test_f), test.suites), router.predict(with_choices(test_f), test.suites))
    with pytest.raises(ValueError, match="choice_embeddings=True"):
        loaded.predict(Features(test_f.embeddings, test_f.text), test.suites)


@pytest.mark.parametrize("layout", ["per-model", "shared"])
def test_a_bag_averages_boosters_of_successive_seeds_and_round_trips(tmp_path, layout):
    import lightgbm

    train, train_f = planted(300, seed=12)
    test, test_f = planted(80, seed=13)
    base = ["short", "long"]
    # no stacked kNN features here: their cross-fitting folds are drawn from the seed too
    bagged = LGBMRouter(base, layout=layout, num_components=4, neighbours=(), num_bags=3, **FAST)
    bagged.fit(train.select_models(base), train_f)
    bagged.add_model("either", train, train_f)
    assert all(len(bag.boosters) == 3 for bag in (*bagged.boosters.values(), *bagged.added.values()))
    # a bag of one with seed s is the booster of seed s: the bag's mean is the mean of three one-booster
    # routers seeded 0, 1, 2 (row and feature subsampling on: they differ)
    singles = [LGBMRouter(base, layout=layout, num_components=4, neighbours=(), num_bags=1,
                          num_rounds=FAST["num_rounds"], params={**FAST["params"], "seed": s})
               .fit(train.select_models(base), train_f).predict(test_f, test.suites) for s in range(3)]
    assert not np.allclose(singles[0], singles[1])
    np.testing.assert_allclose(bagged.predict(test_f, test.suites)[:, :2], np.mean(singles, axis=0), atol=1e-12)
    loaded = load_router(save_router(bagged, tmp_path / "bag.safetensors")).router
    assert loaded.num_bags == 3
    np.testing.assert_allclose(loaded.predict(test_f, test.suites), bagged.predict(test_f, test.suites))
    # one booster is stored as one text model, as files saved before bags were
    one = LGBMRouter(base, num_components=4, neighbours=(), num_bags=1, **FAST)
    arrays, meta = one.fit(train.select_models(base), train_f).state()
    assert all(isinstance(text, str) for text in meta["boosters"].values()) and "num_bags" in meta
    del meta["num_bags"]
    old = LGBMRouter.from_state(arrays, {**meta, "models": base})
    assert old.num_bags == 1 and isinstance(old.boosters["short"].boosters[0], lightgbm.Booster)
    with pytest.raises(ValueError, match="num_bags"):
        LGBMRouter(base, num_bags=0)


def test_bag_params_move_every_given_seed_along():
    from routers.boosters import bag_params

    assert bag_params({"learning_rate": 0.1}, 2) == {"learning_rate": 0.1, "seed": 2}
    # a seed given explicitly would otherwise make every booster of the bag draw the same rows and columns
    assert bag_params({"seed": 7, "bagging_seed": 3, "feature_fraction_seed": 5}, 1) == \
        {"seed": 8, "bagging_seed": 4, "feature_fraction_seed": 6}


def worded(n: int, seed: int):
    """Like `planted`, but the rule is in the words only: model "short" is wrong on prompts with the word
    "tricky"; the embeddings and text features are noise."""
    rng = np.random.default_rng(seed)
    tricky = rng.uniform(size=n) < 0.5
    filler = ["apple", "river", "stone", "cloud", "paper", "glass"]
    texts = [" ".join([*rng.choice(filler, 4), *(["tricky"] if t else [])]) for t in tricky]
    scores = np.stack([~tricky, tricky], axis=1).astype(float)
    data = RoutingData([f"p{i}" for i in range(n)], texts, ["all"] * n, ["short", "long"], scores,
                       np.zeros_like(scores))
    feats = Features(rng.normal(size=(n, 16)), rng.normal(size=(n, 4)), texts=texts)
    return data, feats


def test_a_lexical_router_reads_a_rule_only_the_words_carry(tmp_path):
    train, train_f = worded(400, seed=20)
    test, test_f = worded(200, seed=21)
    plain = LGBMRouter(train.models, num_components=4, neighbours=(5,), **FAST).fit(train, train_f)
    router = LGBMRouter(train.models, num_components=4, neighbours=(5,), lexical=True, **FAST).fit(train, train_f)
    right = test.scores > 0.5
    assert ((plain.predict(test_f, test.suites) > 0.5) == right).mean() < 0.7       # noise to the plain router
    pred = router.predict(test_f, test.suites)
    assert ((pred > 0.5) == right).mean() > 0.95
    loaded = load_router(save_router(router, tmp_path / "lexical.safetensors")).router
    assert loaded.lexical and loaded.lexical_model is not None
    np.testing.assert_allclose(loaded.predict(test_f, test.suites), pred)
    with pytest.raises(ValueError, match="Featurizer, which keeps the texts"):
        router.predict(Features(test_f.embeddings, test_f.text), test.suites)
    with pytest.raises(ValueError, match="lexical_c"):
        LGBMRouter(train.models, lexical=True, lexical_c=0)
    # a file without word models loads as before
    arrays, meta = plain.state()
    for key in ("lexical", "lexical_c", "lexical_model"):
        del meta[key]
    old = LGBMRouter.from_state(arrays, {**meta, "models": plain.models})
    assert not old.lexical and old.lexical_model is None
    np.testing.assert_array_equal(old.predict(test_f, test.suites), plain.predict(test_f, test.suites))


def test_the_word_inputs_are_cross_fitted_in_training_and_when_adding_a_model():
    train, train_f = worded(300, seed=22)
    router = LGBMRouter(["short"], num_components=4, neighbours=(5,), lexical=True, **FAST)
    router.fit(train.select_models(["short"]), train_f)
    # what the boosters were trained on: the other folds' word models (the kNN's folds), never a prompt's own label
    np.testing.assert_array_equal(router.lexical_train, router._cross_fitted_words(train.select_models(["short"]), train_f))
    flipped = train.select_models(["short"])
    flipped.scores[0] = 1 - flipped.scores[0]
    again = router._cross_fitted_words(flipped, train_f)
    np.testing.assert_array_equal(again[0], router.lexical_train[0])
    assert (again[1:] != router.lexical_train[1:]).any()
    # adding a model reads a training prompt through those cross-fitted predictions, a new prompt through the
    # word models fitted on all training prompts
    seen = {}
    original = router._added_inputs
    router._added_inputs = lambda x, suites: seen.setdefault("x", x.copy()) is not None and original(x, suites)
    new, new_f = worded(50, seed=23)         # prompts never trained on: other ids, a word of their own
    texts = [f"{t} fresh" for t in new.prompts]
    fresh = RoutingData([f"new{i}" for i in range(50)], texts, new.suites, new.models, new.scores, new.costs)
    fresh_f = Features(new_f.embeddings, new_f.text, texts=texts)
    both = RoutingData.concat([train.subset(np.arange(100)), fresh])
    router.add_model("long", both.select_models(["long"]), Features.concat([train_f.subset(np.arange(100)), fresh_f]))
    words = seen["x"][:, -1]
    # (a text that occurs twice in training is read through one of its rows: compare the texts seen once)
    once = np.array([train.prompts.count(t) == 1 for t in train.prompts[:100]])
    assert once.sum() > 50
    np.testing.assert_allclose(words[:100][once], router.lexical_train[:100, 0][once])
    np.testing.assert_allclose(words[100:], router.lexical_model.predict(hashed_ngrams(fresh_f.texts))[:, 0], rtol=1e-6)
