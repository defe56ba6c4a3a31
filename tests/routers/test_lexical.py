"""Word models (routers/lexical.py): hashed 1-2-gram counts, tf-idf weights by hand, what the logistic
regressions learn, cross-fitting, persistence and errors."""

from __future__ import annotations

import numpy as np
import pytest

from routers.lexical import LexicalModel, cross_fitted, hashed_ngrams, prompt_hashes

BITS = 12


def column(word: str) -> int:
    return int(hashed_ngrams([word], BITS).indices[0])


def test_hashed_counts_hold_every_unigram_and_bigram():
    counts = hashed_ngrams(["the cat saw the cat", "dogs bark"], BITS)
    assert counts.shape == (2, 2 ** BITS) and counts.dtype == np.float32
    # 5 words and 4 bigrams; "the", "cat" and "the cat" twice each
    assert counts[0].sum() == 9 and counts[1].sum() == 3
    assert counts[0, column("the")] == counts[0, column("cat")] == counts[0, column("the cat")] == 2
    assert counts[0, column("dogs")] == 0


def test_idf_and_weights_by_hand():
    texts = ["common alpha", "common beta", "common gamma"]
    counts = hashed_ngrams(texts, BITS)
    model = LexicalModel(num_bits=BITS).fit(counts, np.array([[1.0], [0.0], [1.0]]))
    # smoothed idf: ln((1 + n) / (1 + df)) + 1 with n = 3 documents
    assert model.idf[column("common")] == pytest.approx(1.0)
    assert model.idf[column("alpha")] == pytest.approx(np.log(4 / 2) + 1)
    assert model.idf[column("nothing here")] == pytest.approx(np.log(4 / 1) + 1)
    # one document: "common" and "alpha" once, rows L2-normalised
    x = model._weigh(counts[:1]).toarray()[0]
    w = np.array([1.0, np.log(2) + 1, np.log(2) + 1])      # common, alpha, "common alpha"
    assert x[column("common")] == pytest.approx(w[0] / np.linalg.norm(w), rel=1e-5)
    assert x[column("alpha")] == pytest.approx(w[1] / np.linalg.norm(w), rel=1e-5)


def planted(n: int, seed: int):
    """Model 0 is wrong on prompts with the word "tricky" and right otherwise; model 1 the other way round;
    model 2 was not run on the first half (NaN) and is right on the rest."""
    rng = np.random.default_rng(seed)
    filler = ["apple", "river", "stone", "cloud", "paper", "glass", "honey", "tiger"]
    tricky = rng.uniform(size=n) < 0.5
    texts = [" ".join([*rng.choice(filler, 5), *(["tricky"] if t else [])]) for t in tricky]
    scores = np.stack([~tricky, tricky, np.ones(n)], axis=1).astype(float)
    scores[: n // 2, 2] = np.nan
    return texts, scores, tricky


def test_the_regressions_learn_a_planted_word():
    texts, scores, _ = planted(300, seed=0)
    model = LexicalModel(num_bits=BITS, c=10.0).fit(hashed_ngrams(texts, BITS), scores)
    test_texts, _, tricky = planted(100, seed=1)
    p = model.predict(hashed_ngrams(test_texts, BITS))
    assert p.shape == (100, 3) and p.dtype == np.float32
    assert (p[tricky, 0] < 0.2).all() and (p[~tricky, 0] > 0.8).all()
    assert (p[tricky, 1] > 0.8).all() and (p[~tricky, 1] < 0.2).all()
    # all of model 2's labelled prompts are right: it predicts that, whatever the words
    np.testing.assert_allclose(p[:, 2], 1 - 1e-4, atol=1e-6)


def test_a_fractional_score_counts_as_a_weighted_right_and_wrong_answer():
    """Score 0.2 on prompts with "tricky", 0.4 on the others: weakly regularised, the fitted probabilities are
    those means (a model that rounded the scores to 0/1 would predict 0 and 0)."""
    texts, _, tricky = planted(300, seed=2)
    counts = hashed_ngrams(texts, BITS)
    scores = np.where(tricky, 0.2, 0.4)[:, None]
    p = LexicalModel(num_bits=BITS, c=1e4).fit(counts, scores).predict(counts)[:, 0]
    np.testing.assert_allclose(p[tricky], 0.2, atol=0.02)
    np.testing.assert_allclose(p[~tricky], 0.4, atol=0.02)


def test_cross_fitting_never_reads_a_prompts_own_label():
    texts, scores, _ = planted(200, seed=3)
    counts = hashed_ngrams(texts, BITS)
    fold = np.arange(200) % 5
    x = cross_fitted(counts, scores[:, :2], fold, num_bits=BITS)
    flipped = scores[:, :2].copy()
    flipped[0] = 1 - flipped[0]
    y = cross_fitted(counts, flipped, fold, num_bits=BITS)
    np.testing.assert_array_equal(y[fold == 0], x[fold == 0])      # its own fold is fitted without it
    assert (y[fold != 0] != x[fold != 0]).any()                    # the other folds read it


def test_state_round_trip_and_errors():
    texts, scores, _ = planted(100, seed=4)
    counts = hashed_ngrams(texts, BITS)
    model = LexicalModel(num_bits=BITS, c=2.0).fit(counts, scores)
    arrays, meta = model.state()
    assert meta["num_bits"] == BITS and meta["c"] == 2.0 and arrays["coef"].shape == (3, 2 ** BITS)
    loaded = LexicalModel.from_state(arrays, meta)
    np.testing.assert_array_equal(loaded.predict(counts), model.predict(counts))
    with pytest.raises(ValueError, match="retrain"):        # words cut otherwise would read other buckets
        LexicalModel.from_state(arrays, {**meta, "ngram_range": [1, 3]})
    with pytest.raises(ValueError, match="num_bits"):
        hashed_ngrams(["x"], 30)
    with pytest.raises(ValueError, match="c must"):
        LexicalModel(c=float("nan"))
    with pytest.raises(ValueError, match="c must"):
        LexicalModel(c=0)
    with pytest.raises(RuntimeError, match="not fitted"):
        LexicalModel(num_bits=BITS).predict(counts)
    with pytest.raises(ValueError, match="columns"):
        model.predict(hashed_ngrams(texts, BITS + 1))
    with pytest.raises(ValueError, match="share P"):
        LexicalModel(num_bits=BITS).fit(counts, scores[:10])


def test_prompt_hashes_are_stable_and_tell_texts_apart():
    h = prompt_hashes(["a", "b", "a", ""])
    assert h.dtype == np.int64 and h[0] == h[2] and len(set(h.tolist())) == 3
    # BLAKE2b, 8 bytes, little-endian: fixed across runs and machines (a saved router finds its prompts again)
    import hashlib
    assert h[1] == int.from_bytes(hashlib.blake2b(b"b", digest_size=8).digest(), "little", signed=True)
