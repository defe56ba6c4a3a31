"""k-nearest-neighbour router: a prompt's predicted quality per model is the mean score of its k most
similar training prompts, shrunk toward the model's mean on the prompt's task.

    router = KNNRouter(models, k=100).fit(train, featurizer.transform(train.prompts))
    quality = router.predict(featurizer.transform(prompts), suites)      # [N, M]
    router.add_model("new-model", labelled, featurizer.transform(labelled.prompts))

Similarity is the cosine of the (L2-normalised) MiniLM embeddings. With `by_suite` and a known suite the
neighbours come from that suite only (the task is the strongest single signal on RouterBench, Hu et al.
2024). The neighbour mean is shrunk toward a prior, the model's training mean on the suite:

    q[n, m] = (sum_i w_i * s[i, m] + prior * mu[suite(n), m]) / (sum_i w_i + prior)

with w_i = 1 (uniform) or exp(cos_i / temperature). RouterBench evaluates kNN routers of this kind. Every
model keeps its own bank of labelled prompts, so `add_model` only appends a bank for the new model (the
others are untouched).

Prompts come in two kinds, with and without tools (`Features.has_tools`): neighbours and priors come from
bank prompts of the query's kind. A model with no labelled prompt of that kind has no evidence there and is
predicted `unseen_quality` (0: it fails; `routers.kinds`, the rule LightGBM and MF share), so a model added
from tool-calling prompts only does not draw plain traffic, and the reverse; when no model has labels of the
query's kind, every bank prompt is used (without the rule, a fine-tune added from BFCL traces took all of GSM8K).
Ranking it just below the weakest evidenced model was not enough: its cost model, fitted on short tool calls,
made it the cheapest answer to MMLU questions, and the cost penalty sent it 74.5% of them.

The defaults k = 100 and prior = 10 come from 5-fold CV on RouterBench's train files (k in 20, 100, 300;
prior in 5, 20, 100: k = 100 best, the prior nearly irrelevant there) and RouteLLM's MMLU and GSM8K folds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from routers.base import Router
from routers.features import Features
from routers.kinds import KINDS, apply_evidence_rule, check_unseen_quality, labelled_kinds
from routers.offline.data import RoutingData

GLOBAL = ""          # key of the all-suites prior
CHUNK = 2048         # query rows per similarity block ([CHUNK, P] float32)


class KNNRouter(Router):
    """Mean score of the k nearest training prompts (cosine on embeddings), shrunk toward the task mean.

    Args:
        models: [M] candidate names.
        k: neighbours per prediction (fewer when a bank is smaller).
        prior: pseudo-count of the shrinkage toward the suite mean (0: the plain neighbour mean).
        temperature: None for uniform weights, else w = exp(cosine / temperature).
        by_suite: look for neighbours in the query's suite when that suite was seen in training.
        unseen_quality: the quality predicted for a model without labelled prompts of the query's kind (with
            or without tools), in [0, 1].
    Raises:
        ValueError: k < 1, prior < 0, temperature <= 0 or unseen_quality outside [0, 1].
    """

    type = "knn"

    def __init__(self, models: Sequence[str], k: int = 100, prior: float = 10.0, temperature: float | None = None,
                 by_suite: bool = True, unseen_quality: float = 0.0):
        super().__init__(models)
        if k < 1 or prior < 0 or (temperature is not None and temperature <= 0):
            raise ValueError(f"need k >= 1, prior >= 0 and temperature > 0; got {k}, {prior}, {temperature}")
        self.k, self.prior, self.temperature, self.by_suite = int(k), float(prior), temperature, bool(by_suite)
        self.unseen_quality = check_unseen_quality(unseen_quality)
        # bank: every labelled prompt, [P, D] embeddings, [P] suite, [P] offered tools, [P, M] scores (NaN: no label)
        self.embeddings = np.zeros((0, 0), dtype=np.float32)
        self.bank_suites = np.zeros(0, dtype=object)
        self.bank_tools = np.zeros(0, dtype=bool)
        self.scores = np.zeros((0, len(self.models)))
        self._means: dict[bool | None, dict[str, np.ndarray]] = {}       # cache of suite_means() per kind

    # --- training ---------------------------------------------------------------------------------------

    def fit(self, data: RoutingData, features: Features) -> KNNRouter:
        """Store the labelled prompts. `data` [P] with this router's models; `features` N = P.

        Raises:
            KeyError: data lacks a model. ValueError: features and data disagree on P.
        """
        data = self.aligned(data)
        _check_rows(data, features)
        self.embeddings = _normalise(features.embeddings)
        self.bank_suites = np.asarray(data.suites, dtype=object)
        self.bank_tools = features.has_tools.copy()
        self.scores = data.scores.copy()
        self._means = {}
        return self

    def add_model(self, name: str, data: RoutingData, features: Features) -> None:
        """Append a bank for `name` from its labelled prompts ([P'] rows of `data`, NaN scores skipped);
        the other models' banks and predictions are unchanged.

        Raises:
            ValueError: `name` is already a candidate, or no prompt has its score.
            KeyError: `data` has no column `name`.
        """
        if name in self.models:
            raise ValueError(f"{name!r} is already one of the router's models")
        column = data.select_models([name]).scores[:, 0]
        _check_rows(data, features)
        keep = np.isfinite(column)
        if not keep.any():
            raise ValueError(f"no labelled prompt for {name!r}")
        self.models.append(name)
        new_rows = np.full((int(keep.sum()), len(self.models)), np.nan)
        new_rows[:, -1] = column[keep]
        self.scores = np.vstack([np.hstack([self.scores, np.full((len(self.scores), 1), np.nan)]), new_rows])
        self.embeddings = np.vstack([self.embeddings, _normalise(features.embeddings[keep])])
        self.bank_suites = np.concatenate([self.bank_suites, np.asarray(data.suites, dtype=object)[keep]])
        self.bank_tools = np.concatenate([self.bank_tools, features.has_tools[keep]])
        self._means = {}

    def add_model_minimum(self) -> int:
        """Labelled prompts `add_model` needs for predictions that vary with the prompt: k + 1 (with k or fewer,
        every query's k nearest are the model's whole bank of a kind, so it gets one constant prediction there)."""
        return self.k + 1

    # --- prediction -------------------------------------------------------------------------------------

    def suite_means(self, has_tools: bool | None = None) -> dict[str, np.ndarray]:
        """suite -> [M] mean training score per model ("" for all suites; NaN-free: a model without labels
        in a suite gets its global mean, one without any labels 0.5), over the bank prompts of one kind
        (`has_tools` True or False) or all of them (None)."""
        if has_tools not in self._means:
            kind = np.ones(len(self.scores), dtype=bool) if has_tools is None else self.bank_tools == has_tools
            scores, suites = self.scores[kind], self.bank_suites[kind]
            overall = np.nan_to_num(_nanmean(scores), nan=0.5)
            means = {GLOBAL: overall}
            for s in dict.fromkeys(suites.tolist()):
                m = _nanmean(scores[suites == s])
                means[s] = np.where(np.isfinite(m), m, overall)
            self._means[has_tools] = means
        return self._means[has_tools]

    def predict(self, features: Features, suites: list[str] | None = None) -> np.ndarray:
        """[N, M] float64 predicted quality in [0, 1] for N prompts (`suites` [N] when known)."""
        return self.neighbour_means(features, suites, (self.k,))[0]

    def neighbour_means(self, features: Features, suites: Sequence[str] | None = None, ks: Sequence[int] = (),
                        *, exclude: np.ndarray | None = None) -> list[np.ndarray]:
        """The shrunk neighbour mean [N, M] for each k in `ks` (default: this router's k).

        Args:
            features: N query prompts; suites: [N] or None.
            exclude: [N] int, a bank row each query leaves out (-1: none): with `find_in_bank`, prompts
                already in the bank do not see their own labels (`routers.lgbm` stacking); `np.arange(P)`
                with the bank's own prompts as queries gives leave-one-out means.
        Raises:
            RuntimeError: not fitted. ValueError: wrong number of suites or of exclude rows.
        """
        if len(self.scores) == 0:
            raise RuntimeError("the kNN router is not fitted")
        ks = [int(k) for k in ks] or [self.k]
        query = _normalise(features.embeddings)
        n = len(query)
        suites = [GLOBAL] * n if suites is None else list(suites)
        if len(suites) != n:
            raise ValueError(f"{len(suites)} suites for {n} prompts")
        if exclude is not None and len(exclude) != n:
            raise ValueError(f"{len(exclude)} exclude rows for {n} prompts")
        labelled = np.isfinite(self.scores)                                   # [P, M]
        evidence = labelled_kinds(self.scores, self.bank_tools)               # [M, 2]
        groups = _column_groups(labelled)
        out = [np.full((n, self.num_models), np.nan) for _ in ks]
        query_tools = features.has_tools
        suite_of = np.asarray(suites, dtype=object)
        for column, tools in enumerate(KINDS):
            of_kind = query_tools == tools
            if not of_kind.any():
                continue
            # no model has labels of this kind: fall back to every bank prompt
            kind = (self.bank_tools == tools) if evidence[:, column].any() else None
            means = self.suite_means(None if kind is None else tools)
            for suite in dict.fromkeys(suite_of[of_kind].tolist()):
                rows = np.flatnonzero(of_kind & (suite_of == suite))
                known = self.by_suite and suite != GLOBAL and suite in means
                in_suite = (self.bank_suites == suite) if known else None
                prior = means.get(suite, means[GLOBAL])
                for mask, cols in groups:
                    if kind is not None:
                        if not evidence[cols[0], column]:
                            continue                                          # no evidence: the rule below
                        mask = mask & kind
                    pool = mask if in_suite is None else mask & in_suite
                    pool = np.flatnonzero(pool if pool.any() else mask)
                    self._fill(out, ks, query, rows, pool, cols, prior, exclude)
        return [apply_evidence_rule(q, query_tools, evidence, self.unseen_quality) for q in out]

    def _fill(self, out: list[np.ndarray], ks: Sequence[int], query: np.ndarray, rows: np.ndarray, pool: np.ndarray,
              cols: np.ndarray, prior: np.ndarray, exclude: np.ndarray | None) -> None:
        """out[k][rows, cols] = the shrunk mean of each query row's k nearest prompts among bank rows `pool`."""
        for start in range(0, len(rows), CHUNK):                              # [chunk, pool] similarities
            chunk = rows[start:start + CHUNK]
            sims = query[chunk] @ self.embeddings[pool].T
            if exclude is not None:
                sims[np.asarray(exclude)[chunk][:, None] == pool[None, :]] = -np.inf
            for k, target in zip(ks, out):
                target[np.ix_(chunk, cols)] = self._neighbour_mean(sims, self.scores[np.ix_(pool, cols)], prior[cols], k)

    def find_in_bank(self, features: Features, suites: Sequence[str] | None = None) -> np.ndarray:
        """[N] int the bank row holding the same prompt (embedding cosine >= 1 - 1e-6, same suite when both
        are known), -1 where none does."""
        query = _normalise(features.embeddings)
        out = np.full(len(query), -1, dtype=np.int64)
        for start in range(0, len(query), CHUNK):
            sims = query[start:start + CHUNK] @ self.embeddings.T
            if suites is not None:
                same = np.asarray(suites, dtype=object)[start:start + CHUNK, None] == self.bank_suites[None, :]
                sims = np.where(same, sims, -np.inf)
            best = sims.argmax(axis=1)
            found = sims[np.arange(len(sims)), best] >= 1 - 1e-6
            out[start:start + CHUNK] = np.where(found, best, -1)
        return out

    def _neighbour_mean(self, sims: np.ndarray, scores: np.ndarray, prior: np.ndarray, k: int) -> np.ndarray:
        """sims [n, p] of the queries to the pool (-inf: left out), scores [p, c] of the pool, prior [c] -> [n, c]."""
        k = min(k, sims.shape[1])
        if k < sims.shape[1]:
            top = np.argpartition(-sims, k - 1, axis=1)[:, :k]                # [n, k] the k most similar
        else:
            top = np.tile(np.arange(k), (len(sims), 1))
        near = np.take_along_axis(sims, top, axis=1)                          # [n, k]
        if self.temperature is None:
            weight = np.isfinite(near).astype(np.float64)
        else:
            finite = np.where(np.isfinite(near), near, np.nan)
            weight = np.nan_to_num(np.exp((finite - np.nanmax(finite, axis=1, keepdims=True)) / self.temperature))
        total = np.einsum("nk,nkc->nc", weight, scores[top])                  # [n, c]
        denominator = weight.sum(axis=1, keepdims=True) + self.prior
        return np.where(denominator > 0, (total + self.prior * prior[None, :]) / np.maximum(denominator, 1e-12),
                        prior[None, :])

    # --- persistence ------------------------------------------------------------------------------------

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        suites = list(dict.fromkeys(self.bank_suites.tolist()))
        index = np.array([suites.index(s) for s in self.bank_suites], dtype=np.int64)
        return ({"embeddings": self.embeddings, "scores": self.scores, "suite_index": index,
                 "has_tools": self.bank_tools.astype(np.uint8)},
                {"k": self.k, "prior": self.prior, "temperature": self.temperature, "by_suite": self.by_suite,
                 "unseen_quality": self.unseen_quality, "suites": suites})

    @classmethod
    def from_state(cls, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> KNNRouter:
        router = cls(meta["models"], k=meta["k"], prior=meta["prior"], temperature=meta["temperature"],
                     by_suite=meta["by_suite"], unseen_quality=meta.get("unseen_quality", 0.0))
        router.embeddings = np.asarray(arrays["embeddings"], dtype=np.float32)
        router.scores = np.asarray(arrays["scores"], dtype=np.float64)
        router.bank_suites = np.array([meta["suites"][i] for i in arrays["suite_index"]], dtype=object)
        # files written before the kinds existed hold no tool-calling prompts
        tools = arrays.get("has_tools")
        router.bank_tools = (np.zeros(len(router.scores), dtype=bool) if tools is None
                             else np.asarray(tools).astype(bool))
        return router


def _check_rows(data: RoutingData, features: Features) -> None:
    if features.num_rows != data.num_prompts:
        raise ValueError(f"{features.num_rows} feature rows for {data.num_prompts} prompts")


def _normalise(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def _nanmean(x: np.ndarray) -> np.ndarray:
    """Column means ignoring NaN, NaN for an all-NaN column (without numpy's warning)."""
    count = np.isfinite(x).sum(axis=0)
    return np.where(count > 0, np.nansum(x, axis=0) / np.maximum(count, 1), np.nan)


def _column_groups(labelled: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Group the model columns that have labels on the same prompts: [(row mask [P], columns)]."""
    groups: dict[bytes, list[int]] = {}
    for j in range(labelled.shape[1]):
        groups.setdefault(np.packbits(labelled[:, j]).tobytes(), []).append(j)
    return [(labelled[:, cols[0]], np.array(cols)) for cols in groups.values()]
