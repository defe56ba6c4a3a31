"""LightGBM router: gradient-boosted trees predict each model's score from the prompt's embedding (reduced by
PCA), its cheap text features, its suite, and what its nearest training prompts say (stacked kNN).

    router = LGBMRouter(models).fit(train, featurizer.transform(train.prompts))
    quality = router.predict(featurizer.transform(prompts), suites)      # [N, M] probabilities

Inputs x = [pca(e_q) (C), text features (F), suite one-hot (S), kNN means (K x M0), with `lexical=True` the
word models' predicted quality (M0)], cross-entropy objective (labels in [0, 1]). Two layouts (`layout`):
- "per-model": one booster per candidate;
- "shared": one booster on the (prompt, model) cells with the model as a categorical feature, so models
  share what makes a prompt hard.
The kNN means are a `KNNRouter`'s shrunk neighbour means of every training model at each k of `neighbours`
(stacking, Wolpert 1992), cross-fitted on the training prompts (each fold's features from a bank of the
other folds), so a booster learns how far to trust the neighbours and how one model's neighbours speak for
another. The word models (`routers.lexical`: per-model logistic regressions on hashed word 1-2-grams) are
stacked the same way, cross-fitted on the same folds.

An added model gets its own small booster on [the fit-time models' predicted quality (M0), suite one-hot],
trained on its labelled prompts only: a few hundred prompts say how the new model relates to the known ones
(the idea of a model embedding in `routers.mf`), which is far less to learn than the full input. The PCA,
the kNN bank and the other boosters are not refitted. Boosters are saved as LightGBM's text model strings
(no pickle).

Each model remembers which kinds of prompt (with tools, without) it was labelled on; on a query of a kind it
has no labels of it is predicted `unseen_quality` (`routers.kinds`, as in kNN): the booster of a model added
from tool-calling prompts only would otherwise read plain prompts through the base models' quality too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from routers.base import Router
from routers.boosters import BoosterBag
from routers.features import BASE_FEATURE_NAMES, Features
from routers.offline.data import RoutingData
from routers.kinds import (apply_evidence_rule, check_unseen_quality, kinds_from_state, kinds_state,
                           labelled_kinds)
from routers.knn import KNNRouter
from routers.lexical import NUM_BITS, LexicalModel, cross_fitted, hashed_ngrams, prompt_hashes

LAYOUTS = ("per-model", "shared")
SHARED = ""             # the key of the shared booster
# small, strongly regularised trees: per-prompt signal is weak (RouterBench 5-fold CV on the train files chose
# num_leaves 4 and lambda_l2 10 over 8 and 1; RouteLLM's folds agree)
DEFAULT_PARAMS: dict[str, Any] = {"objective": "cross_entropy", "learning_rate": 0.03, "num_leaves": 4,
                                  "min_data_in_leaf": 20, "feature_fraction": 0.5, "bagging_fraction": 0.8,
                                  "bagging_freq": 1, "lambda_l2": 10.0, "verbose": -1, "num_threads": 1, "seed": 0}
DEFAULT_ADD_PARAMS: dict[str, Any] = {"num_leaves": 4, "min_data_in_leaf": 30, "feature_fraction": 1.0}
NUM_STACKING_FOLDS = 5
LEGACY_NUM_TEXT_FEATURES = len(BASE_FEATURE_NAMES)   # the text columns of files saved before F was recorded


class LGBMRouter(Router):
    """Boosted-tree quality predictor (Ke et al. 2017, LightGBM) on local embeddings, text features, the suite
    and stacked kNN features; RouterBench (Hu et al. 2024) evaluates such learned routers.

    Args:
        models: [M] candidate names.
        layout: "per-model" (a booster per candidate) or "shared" (one booster, model as a feature).
        num_components: PCA components kept of the embedding (0: the raw embedding).
        num_rounds: boosting rounds per booster.
        params: LightGBM parameters overriding `DEFAULT_PARAMS`.
        use_suites: add a one-hot of the training suites (when there are two or more).
        neighbours: k values of the stacked kNN features (empty: none).
        neighbour_prior: the kNN's shrinkage pseudo-count.
        add_rounds, add_params: rounds and parameter overrides (over `params`) of an added model's booster.
        unseen_quality: the quality predicted for a model without labelled prompts of the query's kind (with
            or without tools), in [0, 1].
        num_bags: boosters per model, seeds params["seed"] + 0 .. num_bags - 1, their predictions averaged
            (`routers.boosters.BoosterBag`); an added model's too. 5 by RouteLLM's MMLU folds (APGR 0.713 against
            0.711 with one; RouterBench's AIQ unchanged) for ~2.5x the fitting time and +1.2 ms a decision
            over 11 models.
        lexical: also read the prompt's words: stacked per-model logistic regressions on hashed word 1-2-grams
            (`routers.lexical`; needs `Features.texts`, which a `Featurizer` keeps). RouteLLM's MMLU pair, 5-fold
            CV, mean over fold seeds 0-2: APGR 0.7092 -> 0.7164, higher for every seed and on 13 of 15 folds;
            fitting takes ~2.5x as long (RouteLLM's pair; six logistic regressions per model) and the file grows
            by (M + 1) x 512 KiB, plus 8 + 4 x M bytes per training prompt.
        lexical_c: the word models' inverse regularisation strength.
    Raises:
        ValueError: an unknown layout, negative sizes, num_bags < 1, unseen_quality outside [0, 1] or
            lexical_c <= 0.
    """

    type = "lgbm"

    def __init__(self, models: Sequence[str], layout: str = "per-model", num_components: int = 32,
                 num_rounds: int = 200, params: dict[str, Any] | None = None, use_suites: bool = True,
                 neighbours: Sequence[int] = (10, 50), neighbour_prior: float = 4.0, add_rounds: int = 100,
                 add_params: dict[str, Any] | None = None, unseen_quality: float = 0.0, num_bags: int = 5,
                 lexical: bool = False, lexical_c: float = 1.0):
        super().__init__(models)
        if layout not in LAYOUTS:
            raise ValueError(f"unknown layout {layout!r}; layouts: {', '.join(LAYOUTS)}")
        if num_components < 0 or num_rounds < 1 or add_rounds < 1 or num_bags < 1:
            raise ValueError(f"need num_components >= 0, rounds >= 1 and num_bags >= 1, got {num_components}, "
                             f"{num_rounds}, {add_rounds}, {num_bags}")
        self.layout, self.num_components, self.num_rounds = layout, int(num_components), int(num_rounds)
        self.params = {**DEFAULT_PARAMS, **(params or {})}
        self.use_suites = bool(use_suites)
        self.neighbours, self.neighbour_prior = [int(k) for k in neighbours], float(neighbour_prior)
        self.add_rounds, self.num_bags = int(add_rounds), int(num_bags)
        self.add_params = {**DEFAULT_ADD_PARAMS, **(add_params or {})}
        self.unseen_quality = check_unseen_quality(unseen_quality)
        if not lexical_c > 0 or not np.isfinite(lexical_c):
            raise ValueError(f"lexical_c must be a finite number > 0, got {lexical_c}")
        self.lexical, self.lexical_c = bool(lexical), float(lexical_c)
        self.lexical_model: LexicalModel | None = None   # the word models (set by fit when lexical)
        # the training prompts' text hashes [P] and cross-fitted word predictions [P, M0]: `add_model` reads a
        # training prompt through these, as the boosters did, not through word models that saw its label
        self.lexical_hashes = np.zeros(0, dtype=np.int64)
        self.lexical_train = np.zeros((0, 0), dtype=np.float32)
        self.model_kinds = np.ones((len(self.models), 2), dtype=bool)   # [M, 2] see routers.kinds
        self.base_models: list[str] = []        # the models at fit time (the columns of the kNN features)
        self.knn: KNNRouter | None = None       # the bank of the stacked features
        self.suites: list[str] = []
        self.pca_mean = np.zeros(0, dtype=np.float32)                  # [D]
        self.pca_components = np.zeros((0, 0), dtype=np.float32)       # [C, D]
        self.num_text_features: int | None = None   # F, the text columns read (set by fit; see _inputs)
        self.choice_embeddings = False              # fitted on Features.choices too (set by fit)
        self.boosters: dict[str, BoosterBag] = {}   # base model (or SHARED) -> its boosters
        self.added: dict[str, BoosterBag] = {}      # added model -> its boosters

    # --- inputs -----------------------------------------------------------------------------------------

    def _onehot(self, n: int, suites: Sequence[str] | None) -> np.ndarray:
        onehot = np.zeros((n, len(self.suites)), dtype=np.float32)
        if suites is not None and self.suites:
            index = {s: i for i, s in enumerate(self.suites)}
            for row, s in enumerate(suites):
                if s in index:
                    onehot[row, index[s]] = 1.0
        return onehot

    def _inputs(self, features: Features, suites: Sequence[str] | None,
                exclude: np.ndarray | None = None) -> np.ndarray:
        """[N, C + F (+ 6) + S (+ K * M0) (+ M0)] float32: PCA of the embedding, text features, the choice
        features when fitted on them, one-hot of a known suite and, once fitted, the kNN means per k (`exclude`
        [N]: bank rows left out, see `KNNRouter.neighbour_means`) and the word models' predicted quality."""
        e = np.asarray(features.embeddings, dtype=np.float32)
        if self.num_components:
            e = (e - self.pca_mean) @ self.pca_components.T
        # the first F text columns: newer featurizers append columns, a router fitted before them reads its own
        text = np.asarray(features.text, dtype=np.float32)[:, :self.num_text_features]
        parts = [e, text]
        if self.choice_embeddings:
            if features.choices is None:
                raise ValueError("this router was fitted on choice features: read the prompts with "
                                 "Featurizer(choice_embeddings=True)")
            parts.append(features.choices)
        parts.append(self._onehot(len(e), suites))
        if self.knn is not None:
            parts += self.knn.neighbour_means(features, suites, self.neighbours, exclude=exclude)
        if self.lexical_model is not None:
            parts.append(self.lexical_model.predict(self._counts(features)))
        return np.hstack(parts).astype(np.float32)

    def _counts(self, features: Features):
        if features.texts is None:
            raise ValueError("this LightGBM router reads the prompts' words (lexical=True): pass features from a "
                             "Featurizer, which keeps the texts")
        return hashed_ngrams(features.texts, self.lexical_model.num_bits if self.lexical_model else NUM_BITS)

    @property
    def reads_choice_embeddings(self) -> bool:
        return self.choice_embeddings

    def _base_quality(self, x: np.ndarray) -> np.ndarray:
        """[N, M0] the fit-time models' predicted quality from inputs x."""
        if self.layout == "per-model":
            return np.stack([self.boosters[m].predict(x) for m in self.base_models], axis=1)
        shared = self.boosters[SHARED]
        return np.stack([shared.predict(np.hstack([x, np.full((len(x), 1), j, dtype=np.float32)]))
                         for j in range(len(self.base_models))], axis=1)

    def _make_knn(self, models: Sequence[str]) -> KNNRouter:
        return KNNRouter(models, k=max(self.neighbours), prior=self.neighbour_prior)

    def _stacking_folds(self, num_prompts: int) -> np.ndarray:
        """[P] the cross-fitting fold of each training prompt (the kNN and the word models share them)."""
        return np.random.default_rng(self.params.get("seed", 0)).permutation(num_prompts) % NUM_STACKING_FOLDS

    def _cross_fitted_words(self, data: RoutingData, features: Features, counts=None) -> np.ndarray:
        """[P, M] the training prompts' word-model predictions, each fold's from word models fitted on the other
        folds (the kNN features' folds); `counts` the prompts' hashed n-grams when already computed."""
        counts = self._counts(features) if counts is None else counts
        return cross_fitted(counts, data.scores, self._stacking_folds(data.num_prompts), c=self.lexical_c)

    def _cross_fitted_neighbours(self, data: RoutingData, features: Features) -> np.ndarray:
        """[P, K * M] the training prompts' kNN features, each fold's from a bank of the other folds
        (cross-fitting: unlike leave-one-out it cannot leak a prompt's own label through tied neighbours)."""
        fold = self._stacking_folds(data.num_prompts)
        out = np.zeros((data.num_prompts, len(self.neighbours) * data.num_models), dtype=np.float32)
        for f in range(NUM_STACKING_FOLDS):
            bank, rows = np.flatnonzero(fold != f), np.flatnonzero(fold == f)
            if len(rows) == 0 or len(bank) == 0:
                continue
            knn = self._make_knn(data.models).fit(data.subset(bank), features.subset(bank))
            out[rows] = np.hstack(knn.neighbour_means(features.subset(rows), [data.suites[i] for i in rows],
                                                      self.neighbours))
        return out

    def _fit_pca(self, embeddings: np.ndarray) -> None:
        e = np.asarray(embeddings, dtype=np.float64)
        self.pca_mean = e.mean(axis=0).astype(np.float32)
        _, _, vt = np.linalg.svd(e - e.mean(axis=0), full_matrices=False)
        self.pca_components = vt[: min(self.num_components, *e.shape)].astype(np.float32)

    def _train(self, x: np.ndarray, y: np.ndarray, categorical: list[int] | None = None, *,
               added: bool = False) -> BoosterBag:
        params = {**self.params, **self.add_params} if added else self.params
        return BoosterBag.train(params, x, y, num_rounds=self.add_rounds if added else self.num_rounds,
                                num_bags=self.num_bags, categorical=categorical)

    # --- training ---------------------------------------------------------------------------------------

    def fit(self, data: RoutingData, features: Features) -> LGBMRouter:
        """Fit the PCA, the kNN bank and the booster(s) on `data` [P, M] (this router's models), `features` N = P.

        Raises:
            KeyError: data lacks a model. ValueError: features and data disagree on P.
        """
        data = self.aligned(data)
        if features.num_rows != data.num_prompts:
            raise ValueError(f"{features.num_rows} feature rows for {data.num_prompts} prompts")
        self.base_models, self.added, self.knn, self.lexical_model = list(self.models), {}, None, None
        self.lexical_hashes, self.lexical_train = np.zeros(0, dtype=np.int64), np.zeros((0, 0), dtype=np.float32)
        self.model_kinds = labelled_kinds(data.scores, features.has_tools)
        self.suites = sorted(set(data.suites)) if self.use_suites and len(set(data.suites)) > 1 else []
        self.num_text_features = features.text.shape[1]
        self.choice_embeddings = features.choices is not None
        if self.num_components:
            self._fit_pca(features.embeddings)
        x = self._inputs(features, data.suites)
        if self.neighbours:
            x = np.hstack([x, self._cross_fitted_neighbours(data, features)])
            self.knn = self._make_knn(data.models).fit(data, features)
        if self.lexical:
            counts = self._counts(features)       # hashed once, for the cross-fitted and the final word models
            self.lexical_train = self._cross_fitted_words(data, features, counts)
            self.lexical_hashes = prompt_hashes(features.texts)
            x = np.hstack([x, self.lexical_train])
            self.lexical_model = LexicalModel(c=self.lexical_c).fit(counts, data.scores)
        self.boosters = {}
        if self.layout == "per-model":
            for j, model in enumerate(self.models):
                ok = np.isfinite(data.scores[:, j])
                self.boosters[model] = self._train(x[ok], data.scores[ok, j])
            return self
        rows, cols = np.nonzero(np.isfinite(data.scores))
        cells = np.hstack([x[rows], cols[:, None].astype(np.float32)])
        self.boosters[SHARED] = self._train(cells, data.scores[rows, cols], categorical=[cells.shape[1] - 1])
        return self

    def add_model(self, name: str, data: RoutingData, features: Features) -> None:
        """Train a small booster for `name` on its labelled prompts ([P'] rows of `data`, NaN scores skipped),
        on [the fit-time models' predicted quality, suite one-hot]; nothing else changes.

        Raises:
            ValueError: `name` is already a candidate, the router is not fitted, no labelled prompt, or
                features and data disagree on P'.
            KeyError: `data` has no column `name`.
        """
        if name in self.models:
            raise ValueError(f"{name!r} is already one of the router's models")
        if not self.boosters:
            raise ValueError("fit the LightGBM router before adding a model")
        y = data.select_models([name]).scores[:, 0]
        ok = np.isfinite(y)
        if not ok.any():
            raise ValueError(f"no labelled prompt for {name!r}")
        kinds = labelled_kinds(y[:, None], features.has_tools)                 # [1, 2]
        # prompts already in the kNN bank leave themselves out, as the training prompts did
        exclude = self.knn.find_in_bank(features, data.suites) if self.knn is not None else None
        x = self._inputs(features, data.suites, exclude)
        if self.lexical_model is not None:
            # a training prompt's word inputs as the boosters saw them (cross-fitted), not in-sample predictions
            row = {h: i for i, h in enumerate(self.lexical_hashes.tolist())}
            found = np.array([row.get(h, -1) for h in prompt_hashes(features.texts).tolist()], dtype=np.int64)
            hit = found >= 0
            x[hit, -len(self.base_models):] = self.lexical_train[found[hit]]
        x = self._added_inputs(x, data.suites)
        self.added[name] = self._train(x[ok], y[ok], added=True)
        self.model_kinds = np.vstack([self.model_kinds, kinds])
        self.models.append(name)

    def add_model_minimum(self) -> int:
        """Labelled prompts `add_model` needs for its booster to split at all: two leaves of min_data_in_leaf
        each, within a bag (bagging_fraction of the rows when bagging_freq > 0); with fewer its booster
        predicts one constant, the model's mean."""
        params = {**self.params, **self.add_params}
        bag = float(params.get("bagging_fraction", 1.0)) if int(params.get("bagging_freq", 0)) > 0 else 1.0
        return math.ceil(2 * int(params.get("min_data_in_leaf", 20)) / bag)

    def _added_inputs(self, x: np.ndarray, suites: Sequence[str] | None) -> np.ndarray:
        """[N, M0 + S] an added model's inputs: the base models' predicted quality and the suite one-hot."""
        return np.hstack([self._base_quality(x), self._onehot(len(x), suites)]).astype(np.float32)

    # --- prediction -------------------------------------------------------------------------------------

    def predict(self, features: Features, suites: list[str] | None = None) -> np.ndarray:
        """[N, M] float64 predicted probability that each model answers each prompt well (`unseen_quality`
        for a model without labels of the prompt's kind)."""
        if not self.boosters:
            raise RuntimeError("the LightGBM router is not fitted")
        x = self._inputs(features, suites)
        base = self._base_quality(x)
        columns = dict(zip(self.base_models, base.T))
        if self.added:
            extra = np.hstack([base, self._onehot(len(x), suites)]).astype(np.float32)
            columns.update({m: b.predict(extra) for m, b in self.added.items()})
        quality = np.stack([columns[m] for m in self.models], axis=1)
        return apply_evidence_rule(quality, features.has_tools, self.model_kinds, self.unseen_quality)

    # --- persistence ------------------------------------------------------------------------------------

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays = {"pca_mean": self.pca_mean, "pca_components": self.pca_components,
                  **kinds_state(self.model_kinds)}
        knn_meta = None
        if self.knn is not None:
            knn_arrays, knn_meta = self.knn.state()
            arrays.update({f"knn.{k}": v for k, v in knn_arrays.items()})
            knn_meta = {**knn_meta, "models": self.knn.models}
        lexical_meta = None
        if self.lexical_model is not None:
            lexical_arrays, lexical_meta = self.lexical_model.state()
            arrays.update({f"lexical.{k}": v for k, v in lexical_arrays.items()})
            arrays.update({"lexical_train.hashes": self.lexical_hashes, "lexical_train.predictions": self.lexical_train})
        return (arrays, {"layout": self.layout, "num_components": self.num_components, "num_rounds": self.num_rounds,
                         "params": self.params, "use_suites": self.use_suites, "suites": self.suites,
                         "neighbours": self.neighbours, "neighbour_prior": self.neighbour_prior, "knn": knn_meta,
                         "add_rounds": self.add_rounds, "add_params": self.add_params, "base_models": self.base_models,
                         "unseen_quality": self.unseen_quality, "num_text_features": self.num_text_features,
                         "num_bags": self.num_bags, "lexical": self.lexical, "lexical_c": self.lexical_c,
                         "lexical_model": lexical_meta,
                         "choice_embeddings": self.choice_embeddings,
                         "boosters": {k: b.to_state() for k, b in self.boosters.items()},
                         "added": {k: b.to_state() for k, b in self.added.items()}})

    @classmethod
    def from_state(cls, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> LGBMRouter:
        router = cls(meta["models"], layout=meta["layout"], num_components=meta["num_components"],
                     num_rounds=meta["num_rounds"], params=meta["params"], use_suites=meta["use_suites"],
                     neighbours=meta["neighbours"], neighbour_prior=meta["neighbour_prior"],
                     add_rounds=meta["add_rounds"], add_params=meta["add_params"],
                     unseen_quality=meta.get("unseen_quality", 0.0), num_bags=meta.get("num_bags", 1),
                     lexical=meta.get("lexical", False), lexical_c=meta.get("lexical_c", 1.0))
        router.base_models, router.suites = list(meta["base_models"]), list(meta["suites"])
        router.num_text_features = meta.get("num_text_features", LEGACY_NUM_TEXT_FEATURES)
        router.choice_embeddings = bool(meta.get("choice_embeddings", False))
        router.model_kinds = kinds_from_state(arrays, len(router.models))
        if meta["knn"] is not None:
            knn_arrays = {k.removeprefix("knn."): v for k, v in arrays.items() if k.startswith("knn.")}
            router.knn = KNNRouter.from_state(knn_arrays, meta["knn"])
        if meta.get("lexical_model") is not None:
            lexical_arrays = {k.removeprefix("lexical."): v for k, v in arrays.items() if k.startswith("lexical.")}
            router.lexical_model = LexicalModel.from_state(lexical_arrays, meta["lexical_model"])
            router.lexical_hashes = np.asarray(arrays.get("lexical_train.hashes", np.zeros(0)), dtype=np.int64)
            router.lexical_train = np.asarray(arrays.get("lexical_train.predictions", np.zeros((0, 0))), dtype=np.float32)
        router.pca_mean = np.asarray(arrays["pca_mean"], dtype=np.float32)
        router.pca_components = np.asarray(arrays["pca_components"], dtype=np.float32)
        router.boosters = {k: BoosterBag.from_state(s) for k, s in meta["boosters"].items()}
        router.added = {k: BoosterBag.from_state(s) for k, s in meta["added"].items()}
        return router
