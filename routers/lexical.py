"""Lexical stacking: per-model logistic regressions on a prompt's hashed word n-grams, whose predicted quality a
LightGBM router reads as extra inputs (`LGBMRouter(lexical=True)`).

    counts = hashed_ngrams(texts)                               # [N, 2^num_bits] word 1-2-gram counts
    model = LexicalModel().fit(counts, data.scores)             # one logistic regression per model
    quality = model.predict(counts)                             # [N, M] probabilities
    train_inputs = cross_fitted(counts, data.scores, fold)      # [P, M] each fold's from the other folds

The embedding sees what a prompt is about; the words see how it is put ("Statement 1 | Statement 2", "EXCEPT",
a unit, a named law), which a 384-d sentence embedding reduced to 32 components blurs. Hashing (Weinberger et
al. 2009) needs no fitted vocabulary, so the file holds only the idf weights and the coefficients. Weights are
sublinear tf-idf (tf -> 1 + ln tf, idf = ln((1 + n) / (1 + df)) + 1, the smoothed form of scikit-learn's
TfidfTransformer), rows L2-normalised. On RouteLLM's MMLU pair (5-fold CV, fold seeds 0-2) these stacked
inputs raise the LightGBM router's APGR from 0.7092 to 0.7164 (`benchmarks/routing_eval.py --part routellm
--mmlu-seeds 0 1 2`, row "lgbm+words").
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import sparse

NUM_BITS = 17           # 131,072 hash buckets (MMLU's 14k prompts hold 376k distinct 1-2-grams: rare ones share)
NGRAM_RANGE = (1, 2)
TOKEN_PATTERN = r"(?u)\b\w\w+\b"     # words of two or more letters or digits ("A" and "I" are dropped)


def prompt_hashes(texts: Sequence[str]) -> np.ndarray:
    """[N] int64 a stable 64-bit hash of each text (BLAKE2b), to find a training prompt again."""
    return np.array([int.from_bytes(hashlib.blake2b(t.encode("utf-8"), digest_size=8).digest(), "little", signed=True)
                     for t in texts], dtype=np.int64)


def hashed_ngrams(texts: Sequence[str], num_bits: int = NUM_BITS) -> sparse.csr_matrix:
    """[N, 2^num_bits] float32 counts of each text's lower-cased word unigrams and bigrams (words:
    `TOKEN_PATTERN`), hashed (no vocabulary). Raises ValueError for num_bits outside [8, 24]."""
    from sklearn.feature_extraction.text import HashingVectorizer

    if not 8 <= num_bits <= 24:
        raise ValueError(f"num_bits must lie in [8, 24], got {num_bits}")
    vectorizer = HashingVectorizer(ngram_range=NGRAM_RANGE, token_pattern=TOKEN_PATTERN, n_features=2 ** num_bits,
                                   alternate_sign=False, norm=None, dtype=np.float32)
    return vectorizer.transform(list(texts)).tocsr()


class LexicalModel:
    """Per-model L2-regularised logistic regressions on sublinear tf-idf weighted hashed n-grams.

    Args:
        num_bits: log2 of the hash buckets (the counts' width must be 2^num_bits).
        c: inverse regularisation strength (scikit-learn's C); 1 by RouteLLM's MMLU folds (0.3 and 3 about
            as good).
    Raises:
        ValueError: c not > 0 (NaN included).
    """

    def __init__(self, num_bits: int = NUM_BITS, c: float = 1.0):
        if not c > 0 or not np.isfinite(c):
            raise ValueError(f"c must be a finite number > 0, got {c}")
        self.num_bits, self.c = int(num_bits), float(c)
        self.idf = np.zeros(0, dtype=np.float32)          # [H]
        self.coef = np.zeros((0, 0), dtype=np.float32)    # [M, H]
        self.intercept = np.zeros(0, dtype=np.float32)    # [M]
        self._coef_t: np.ndarray | None = None             # [H, M] C-order copy for predict (a view would be copied per call)

    def _weigh(self, counts: sparse.spmatrix) -> sparse.csr_matrix:
        from sklearn.preprocessing import normalize

        x = sparse.csr_matrix(counts, dtype=np.float32, copy=True)
        if x.shape[1] != len(self.idf):
            raise ValueError(f"counts have {x.shape[1]} columns, the model {len(self.idf)} (num_bits {self.num_bits})")
        x.data = (1.0 + np.log(x.data)) * self.idf[x.indices]
        return normalize(x, norm="l2", copy=False)

    def fit(self, counts: sparse.spmatrix, scores: np.ndarray) -> LexicalModel:
        """Fit on `counts` [P, 2^num_bits] and `scores` [P, M] in [0, 1] (NaN: not run, skipped). A fractional
        score s counts as a right answer of weight s and a wrong one of weight 1 - s; a model whose labels are
        all one value predicts that value (clipped to [1e-4, 1 - 1e-4]), one without labels 0.5.

        Raises:
            ValueError: counts and scores disagree on P, or the counts' width is not 2^num_bits.
        """
        from sklearn.linear_model import LogisticRegression

        counts, scores = sparse.csr_matrix(counts), np.asarray(scores, dtype=np.float64)
        if scores.ndim != 2 or counts.shape[0] != len(scores):
            raise ValueError(f"counts {counts.shape} and scores {scores.shape} must share P")
        if counts.shape[1] != 2 ** self.num_bits:
            raise ValueError(f"counts have {counts.shape[1]} columns, need 2^{self.num_bits}")
        df = np.bincount(counts.indices, minlength=counts.shape[1])
        self.idf = (np.log((1.0 + counts.shape[0]) / (1.0 + df)) + 1.0).astype(np.float32)
        x = self._weigh(counts)
        m = scores.shape[1]
        self.coef = np.zeros((m, counts.shape[1]), dtype=np.float32)
        self.intercept = np.zeros(m, dtype=np.float32)
        self._coef_t = None
        for j in range(m):
            ok = np.flatnonzero(np.isfinite(scores[:, j]))
            y = scores[ok, j]
            if len(ok) == 0 or np.all(y == y[0]):
                mean = float(np.clip(y.mean() if len(ok) else 0.5, 1e-4, 1 - 1e-4))
                self.intercept[j] = np.log(mean / (1 - mean))
                continue
            # each prompt once as right (weight s) and once as wrong (weight 1 - s); zero weights dropped
            rows = np.concatenate([ok, ok])
            labels = np.concatenate([np.ones(len(ok)), np.zeros(len(ok))])
            weights = np.concatenate([y, 1.0 - y])
            keep = weights > 0
            model = LogisticRegression(C=self.c, max_iter=2000)
            model.fit(x[rows[keep]], labels[keep], sample_weight=weights[keep])
            self.coef[j], self.intercept[j] = model.coef_[0], model.intercept_[0]
        return self

    def predict(self, counts: sparse.spmatrix) -> np.ndarray:
        """[N, M] float32 predicted probability of a right answer per model.

        Raises:
            RuntimeError: not fitted. ValueError: the counts' width is not 2^num_bits."""
        if not len(self.idf):
            raise RuntimeError("the lexical model is not fitted")
        if self._coef_t is None:
            self._coef_t = np.ascontiguousarray(self.coef.T)
        logits = np.asarray(self._weigh(counts) @ self._coef_t) + self.intercept
        return (1.0 / (1.0 + np.exp(-logits))).astype(np.float32)

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        return ({"idf": self.idf, "coef": self.coef, "intercept": self.intercept},
                {"num_bits": self.num_bits, "c": self.c, "ngram_range": list(NGRAM_RANGE), "token_pattern": TOKEN_PATTERN})

    @classmethod
    def from_state(cls, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> LexicalModel:
        """Raises ValueError when the file's words were cut otherwise (n-gram range or token pattern) than this
        version cuts them: its coefficients would read other hash buckets."""
        saved = (list(meta.get("ngram_range", NGRAM_RANGE)), meta.get("token_pattern", TOKEN_PATTERN))
        if saved != (list(NGRAM_RANGE), TOKEN_PATTERN):
            raise ValueError(f"the word model was saved with n-grams {saved[0]} and token pattern {saved[1]!r}; this "
                             f"version reads {list(NGRAM_RANGE)} and {TOKEN_PATTERN!r}: retrain the router")
        model = cls(num_bits=meta["num_bits"], c=meta["c"])
        model.idf = np.asarray(arrays["idf"], dtype=np.float32)
        model.coef = np.asarray(arrays["coef"], dtype=np.float32)
        model.intercept = np.asarray(arrays["intercept"], dtype=np.float32)
        return model


def cross_fitted(counts: sparse.spmatrix, scores: np.ndarray, fold: np.ndarray, *, num_bits: int = NUM_BITS,
                 c: float = 1.0) -> np.ndarray:
    """[P, M] float32 each training prompt's predicted quality from a `LexicalModel` fitted on the other folds
    (`fold` [P] int fold ids; cross-fitting, so a stacked learner sees predictions as honest as at test time)."""
    counts = sparse.csr_matrix(counts)
    fold = np.asarray(fold)
    out = np.zeros(np.asarray(scores).shape, dtype=np.float32)
    for f in np.unique(fold):
        rows, bank = np.flatnonzero(fold == f), np.flatnonzero(fold != f)
        if len(bank) == 0:
            continue
        out[rows] = LexicalModel(num_bits, c).fit(counts[bank], np.asarray(scores)[bank]).predict(counts[rows])
    return out
