"""The baselines every routing claim is measured against (RouterBench, Hu et al. 2024; RouteLLM, Ong et al. 2024).

    RandomRouter(models, seed=0)            # uniform random quality: a random model at lambda 0
    SingleModelRouter(models, model="x")    # always one model (its point on the cost-quality plane)
    OracleRouter(models).fit(test, feats)   # the recorded scores themselves: the best any router can do
    BestPerTaskRouter(models).fit(train, feats)   # per suite, each model's training accuracy

Under the decision rule argmax q - lambda * cost, BestPerTaskRouter picks, for each lambda and suite, the
model maximising training accuracy minus lambda times expected cost: RouterBench's "best model per task"
(about 0.845 AIQ on its ARC/MBPP/Winogrande rows).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from routers.base import Router
from routers.features import Features
from routers.offline.data import RoutingData


class RandomRouter(Router):
    """Uniform random predicted quality per prompt and model, drawn from `seed` (same features and seed: same
    draw), so every lambda picks at random among models weighted toward cheap ones as lambda grows."""

    type = "random"

    def __init__(self, models: Sequence[str], seed: int = 0):
        super().__init__(models)
        self.seed = int(seed)

    def fit(self, data: RoutingData, features: Features) -> RandomRouter:
        return self

    def predict(self, features: Features, suites: list[str] | None = None) -> np.ndarray:
        """[N, M] float64 uniform in [0, 1)."""
        return np.random.default_rng(self.seed).uniform(size=(features.num_rows, self.num_models))

    def add_model(self, name: str, data: RoutingData, features: Features) -> None:
        """Nothing to learn: `name` joins the candidates. Raises ValueError if already one."""
        _append(self, name)

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        return {}, {"seed": self.seed}

    @classmethod
    def from_state(cls, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> RandomRouter:
        return cls(meta["models"], seed=meta["seed"])


class SingleModelRouter(Router):
    """Always `model`: quality 1 for it, 0 for the others (whatever lambda, unless its cost penalty exceeds
    1 / its extra cost). Default model: the first candidate.

    Raises:
        ValueError: `model` is not a candidate.
    """

    type = "single"

    def __init__(self, models: Sequence[str], model: str | None = None):
        super().__init__(models)
        self.model = model if model is not None else self.models[0]
        if self.model not in self.models:
            raise ValueError(f"{self.model!r} is not among the candidates {self.models}")

    def fit(self, data: RoutingData, features: Features) -> SingleModelRouter:
        return self

    def predict(self, features: Features, suites: list[str] | None = None) -> np.ndarray:
        """[N, M] float64 one-hot of the chosen model."""
        out = np.zeros((features.num_rows, self.num_models))
        out[:, self.models.index(self.model)] = 1.0
        return out

    def add_model(self, name: str, data: RoutingData, features: Features) -> None:
        """`name` joins the candidates (never chosen). Raises ValueError if already one."""
        _append(self, name)

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        return {}, {"model": self.model}

    @classmethod
    def from_state(cls, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> SingleModelRouter:
        return cls(meta["models"], model=meta["model"])


class OracleRouter(Router):
    """The recorded scores of the prompts it was fitted on, looked up by prompt (evaluation only: fit it on the
    test set). A prompt is identified by its embedding's bytes and its suite.

    Raises (predict):
        KeyError: a prompt that was not in the fitted data.
    """

    type = "oracle"

    def __init__(self, models: Sequence[str]):
        super().__init__(models)
        self.table: dict[bytes, np.ndarray] = {}

    @staticmethod
    def _keys(features: Features, suites: Sequence[str] | None) -> list[bytes]:
        emb = np.ascontiguousarray(features.embeddings, dtype=np.float32)
        suites = [""] * len(emb) if suites is None else suites
        return [hashlib.sha256(row.tobytes() + str(s).encode()).digest() for row, s in zip(emb, suites)]

    def fit(self, data: RoutingData, features: Features) -> OracleRouter:
        """Remember `data`'s scores [P, M] (NaN cells become 0) by prompt; features N = P."""
        data = self.aligned(data)
        if features.num_rows != data.num_prompts:
            raise ValueError(f"{features.num_rows} feature rows for {data.num_prompts} prompts")
        scores = np.nan_to_num(data.scores)
        # keyed both with and without the suite, so a caller that knows no suites still finds the prompt
        for keys in (self._keys(features, data.suites), self._keys(features, None)):
            self.table.update(zip(keys, scores))
        return self

    def predict(self, features: Features, suites: list[str] | None = None) -> np.ndarray:
        """[N, M] float64 the recorded scores."""
        keys = self._keys(features, suites)
        missing = sum(k not in self.table for k in keys)
        if missing:
            raise KeyError(f"the oracle knows only the prompts it was fitted on; {missing} of {len(keys)} are new")
        return np.stack([self.table[k] for k in keys]) if keys else np.zeros((0, self.num_models))

    def add_model(self, name: str, data: RoutingData, features: Features) -> None:
        """Add `name`'s recorded scores (0 on prompts it has no score for). Raises ValueError if already a candidate."""
        column = np.nan_to_num(data.select_models([name]).scores[:, 0])
        _append(self, name)
        new = dict(zip(self._keys(features, data.suites), column)) | dict(zip(self._keys(features, None), column))
        self.table = {k: np.append(v, new.get(k, 0.0)) for k, v in self.table.items()}


class BestPerTaskRouter(Router):
    """Each model's mean training score on the prompt's suite (its global mean for an unknown suite).

    Attributes:
        overall: [M] mean training score per model.
        by_suite: suite -> [M] mean training score (a model without prompts in a suite: its global mean).
    """

    type = "best-per-task"

    def __init__(self, models: Sequence[str]):
        super().__init__(models)
        self.overall = np.zeros(self.num_models)
        self.by_suite: dict[str, np.ndarray] = {}

    @staticmethod
    def _means(scores: np.ndarray, suites: Sequence[str]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        overall = _nanmean(scores)
        labels = np.asarray(suites, dtype=object)
        by_suite = {}
        for s in dict.fromkeys(suites):
            m = _nanmean(scores[labels == s])
            by_suite[s] = np.where(np.isfinite(m), m, overall)
        return overall, by_suite

    def fit(self, data: RoutingData, features: Features) -> BestPerTaskRouter:
        """Per-suite mean scores of `data` [P, M] (this router's models)."""
        data = self.aligned(data)
        self.overall, self.by_suite = self._means(data.scores, data.suites)
        return self

    def predict(self, features: Features, suites: list[str] | None = None) -> np.ndarray:
        """[N, M] float64: row n is the training accuracy table of suites[n]."""
        if suites is None:
            return np.tile(self.overall, (features.num_rows, 1))
        if not suites:
            return np.zeros((0, self.num_models))
        return np.stack([self.by_suite.get(s, self.overall) for s in suites])

    def add_model(self, name: str, data: RoutingData, features: Features) -> None:
        """Per-suite means of `name` from its labelled prompts (suites it lacks: its global mean).

        Raises:
            ValueError: already a candidate or no labelled prompt. KeyError: no column `name`.
        """
        column = data.select_models([name]).scores
        if not np.isfinite(column).any():
            raise ValueError(f"no labelled prompt for {name!r}")
        overall, by_suite = self._means(column, data.suites)
        _append(self, name)
        self.overall = np.append(self.overall, overall)
        self.by_suite = {s: np.append(v, by_suite.get(s, overall)) for s, v in self.by_suite.items()}

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        suites = list(self.by_suite)
        table = np.stack([self.by_suite[s] for s in suites]) if suites else np.zeros((0, self.num_models))
        return {"overall": self.overall, "by_suite": table}, {"suites": suites}

    @classmethod
    def from_state(cls, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> BestPerTaskRouter:
        router = cls(meta["models"])
        router.overall = np.asarray(arrays["overall"], dtype=np.float64)
        router.by_suite = {s: np.asarray(arrays["by_suite"][i], dtype=np.float64) for i, s in enumerate(meta["suites"])}
        return router


def _append(router: Router, name: str) -> None:
    if name in router.models:
        raise ValueError(f"{name!r} is already one of the router's models")
    router.models.append(name)


def _nanmean(x: np.ndarray) -> np.ndarray:
    """Column means ignoring NaN; NaN for an all-NaN column (without numpy's warning)."""
    count = np.isfinite(x).sum(axis=0)
    return np.where(count > 0, np.nansum(x, axis=0) / np.maximum(count, 1), np.nan)


class PromptLengthRouter(Router):
    """Prompt length alone: each model's mean training score per decile of prompt length (RouteLLM's
    length baseline, about 0.60 APGR on its MMLU and GSM8K pairs)."""

    type = "length"

    def __init__(self, models: Sequence[str], num_bins: int = 10):
        super().__init__(models)
        self.num_bins = num_bins
        self.edges = np.zeros(0)
        self.table = np.zeros((1, len(self.models)))

    def fit(self, data: RoutingData, features: Features) -> PromptLengthRouter:
        data = self.aligned(data)
        length = features.text[:, 0]                       # log1p(characters), TEXT_FEATURE_NAMES[0]
        self.edges = np.unique(np.quantile(length, np.linspace(0, 1, self.num_bins + 1)[1:-1]))
        bins = np.searchsorted(self.edges, length, side="right")
        overall = np.nanmean(data.scores, axis=0)
        self.table = np.stack([np.nanmean(data.scores[bins == b], axis=0) if (bins == b).any() else overall
                               for b in range(len(self.edges) + 1)])
        self.table = np.where(np.isnan(self.table), overall, self.table)
        return self

    def predict(self, features: Features, suites: list[str] | None = None) -> np.ndarray:
        return self.table[np.searchsorted(self.edges, features.text[:, 0], side="right")]

    def state(self):
        return {"edges": self.edges, "table": self.table}, {"num_bins": self.num_bins}

    @classmethod
    def from_state(cls, arrays, meta):
        router = cls(meta["models"], num_bins=meta["num_bins"])
        router.edges, router.table = arrays["edges"], arrays["table"]
        return router
