"""The router interface, its registry, and the one-file format a trained router is saved in.

    router = make_router("knn", models, k=40).fit(data, featurizer.transform(data.prompts))
    router.score(request)                    # {model: predicted quality} for one RoutingRequest (or body)
    save_router(router, "auto.safetensors", costs=CostModel.from_data(data),
                decision={"rule": "lambda", "cost_penalty": 300.0})
    loaded = load_router("auto.safetensors")
    loaded.decide(request).chosen            # what the gateway's router policy sends the request to

A router predicts each candidate's quality for a prompt; it never decides by itself (the decision rule and
its knob live in `decision.py`: `decide` ranks with `decision.rank`, so one trained router serves every cost
preference). The file is
safetensors: the router's and the cost model's arrays, and one JSON header entry ("router") holding the
type, models, the router's own metadata, the cost model and the calibrated decision. Nothing is pickled,
so loading a file runs no code from it.
"""

from __future__ import annotations

import importlib
import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from routers.decision import CostModel, choose_threshold, estimate_prompt_tokens, objective, rank
from routers.features import Featurizer, Features
from routers.offline.data import RoutingData
from routers.request import RoutingRequest

FORMAT = "togetherlink-router"
FORMAT_VERSION = 1


class Router(ABC):
    """Predicts the quality of each candidate model on each prompt.

    Subclasses set `type` (their registry name), implement `fit` and `predict`, and for saving `state` and
    `from_state`; `add_model` is optional.

    Args:
        models: [M] candidate names, the column order of `predict`.
    Raises:
        ValueError: no models, or a name given twice.
    """

    type: ClassVar[str] = ""

    def __init__(self, models: Sequence[str]):
        models = list(models)
        if not models or len(set(models)) != len(models):
            raise ValueError(f"a router needs distinct candidate models, got {models}")
        self.models: list[str] = models
        self._featurizer: Featurizer | None = None

    @property
    def num_models(self) -> int:
        return len(self.models)

    @property
    def featurizer(self) -> Featurizer:
        """What `score` uses to read a request (a default `Featurizer` made on first use, with the choice
        embeddings when the router reads them)."""
        if self._featurizer is None:
            self._featurizer = Featurizer(choice_embeddings=self.reads_choice_embeddings)
        return self._featurizer

    @property
    def reads_choice_embeddings(self) -> bool:
        """Whether the router was fitted on `Featurizer(choice_embeddings=True)` features (its featurizer then
        must compute them too)."""
        return False

    @featurizer.setter
    def featurizer(self, value: Featurizer) -> None:
        self._featurizer = value

    def aligned(self, data: RoutingData) -> RoutingData:
        """`data` with exactly this router's model columns, in order. Raises KeyError for a missing model."""
        return data if data.models == self.models else data.select_models(self.models)

    @abstractmethod
    def fit(self, data: RoutingData, features: Features) -> Router:
        """Learn from labelled prompts: `data` [P prompts] and their `features` (N = P). Returns self."""

    @abstractmethod
    def predict(self, features: Features, suites: list[str] | None = None) -> np.ndarray:
        """[N, M] float64 predicted quality in the order of `self.models`; `suites` [N] when known."""

    def add_model(self, name: str, data: RoutingData, features: Features) -> None:
        """Learn one new candidate `name` from labelled prompts (`data` holds its column) without refitting
        the others; appends `name` to `self.models`.

        Raises:
            NotImplementedError: this router type cannot (the default).
        """
        raise NotImplementedError(f"the {self.type or type(self).__name__} router cannot add a model without "
                                  "retraining; train a new router on all models")

    def score(self, request: RoutingRequest | dict) -> dict[str, float]:
        """One request (a `RoutingRequest`, or an OpenAI chat/completion body read into one) -> {model:
        predicted quality}, with its suite when known (offline replay sets `metadata.suite`)."""
        request = RoutingRequest.of(request)
        suites = [request.suite] if request.suite else None
        quality = self.predict(self.featurizer.transform_request(request), suites)[0]
        return {m: float(q) for m, q in zip(self.models, quality)}

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """(arrays, JSON-able metadata) that `from_state` rebuilds the fitted router from."""
        raise NotImplementedError(f"the {self.type or type(self).__name__} router cannot be saved")

    @classmethod
    def from_state(cls, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> Router:
        """Rebuild a fitted router from `state()`; `meta` also holds "models" (the saved candidates)."""
        raise NotImplementedError(f"the {cls.type or cls.__name__} router cannot be loaded")


# --- registry -------------------------------------------------------------------------------------------

ROUTERS: dict[str, str] = {
    "knn": "routers.knn:KNNRouter",
    "lgbm": "routers.lgbm:LGBMRouter",
    "mf": "routers.mf:MFRouter",
    "random": "routers.baselines:RandomRouter",
    "single": "routers.baselines:SingleModelRouter",
    "oracle": "routers.baselines:OracleRouter",
    "best-per-task": "routers.baselines:BestPerTaskRouter",
    "length": "routers.baselines:PromptLengthRouter",
}


def register_router(type_: str, target: str) -> None:
    """Register a router class as "module:Class" under `type_`."""
    ROUTERS[type_] = target


def router_class(type_: str) -> type[Router]:
    """The class registered as `type_` (its module imported now). Raises ValueError for an unknown type."""
    if type_ not in ROUTERS:
        raise ValueError(f"unknown router type {type_!r}; types: {', '.join(sorted(ROUTERS))}")
    module, _, name = ROUTERS[type_].partition(":")
    return getattr(importlib.import_module(module), name)


def make_router(type_: str, models: Sequence[str], **options) -> Router:
    """An unfitted router of `type_` over `models`; `options` go to its constructor."""
    return router_class(type_)(list(models), **options)


# --- the decision a loaded router makes -----------------------------------------------------------------

@dataclass
class RoutingDecision:
    """One request's routing: predicted quality and expected USD per model, the rule and knob used, the
    objective quality - lambda * cost per model (lambda rule; empty for the threshold rule), and the models
    in order (the plan: chosen first, then the fallbacks by the same rule). JSON-able via `as_dict`.

    `over_max_cost`: every allowed model was expected over the request's ceiling, so the cheapest answers.
    """

    quality: dict[str, float]
    expected_cost: dict[str, float]
    rule: str
    knob: float
    chosen: str
    order: list[str]
    excluded: list[str] = field(default_factory=list)
    objective: dict[str, float] = field(default_factory=dict)
    over_max_cost: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"quality": self.quality, "expected_cost_usd": self.expected_cost, "rule": self.rule,
                "knob": self.knob, "chosen": self.chosen, "order": self.order, "excluded": self.excluded}


@dataclass
class LoadedRouter:
    """A router read from a file, with what the gateway needs to decide alone.

    Attributes:
        router: the fitted router.
        costs: its cost model (None: every model costs 0, the rule is argmax quality).
        decision: {"rule": "lambda", "cost_penalty": float} or {"rule": "threshold", "strong": name,
            "weak": name, "threshold": float}; default lambda 0.
        info: anything else saved with it (training data, command line, metrics).
    """

    router: Router
    costs: CostModel | None = None
    decision: dict[str, Any] = field(default_factory=lambda: {"rule": "lambda", "cost_penalty": 0.0})
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def models(self) -> list[str]:
        return self.router.models

    def expected_cost(self, request: RoutingRequest | dict) -> np.ndarray:
        """[M] expected USD of each model's answer to `request` (zeros without a cost model); a priced model's
        expected output is capped at the request's `max_output_tokens`."""
        if self.costs is None:
            return np.zeros(len(self.models))
        request = RoutingRequest.of(request)
        limit = np.nan if request.max_output_tokens is None else request.max_output_tokens
        return self.costs.select_models(self.models).expected_cost(
            estimate_prompt_tokens([request.text]), [request.suite] if request.suite else None, np.array([limit]))[0]

    def decide(self, request: RoutingRequest | dict, *, cost_penalty: float | None = None,
               max_cost_usd: float | None = None, allowed: Sequence[str] | None = None) -> RoutingDecision:
        """Route one request (a `RoutingRequest`, or an OpenAI body read into one) with the saved rule.

        The lambda rule's plan is `decision.rank`'s order. The threshold rule picks RouteLLM's way between its
        strong and weak model (the highest predicted quality when one of them is not allowed) and the others
        follow by predicted quality (rank at lambda 0).

        Args:
            cost_penalty: overrides the request's and the saved lambda (and switches a threshold rule to the
                lambda rule); default the request's `cost_penalty`.
            max_cost_usd: models expected to cost more are excluded (all excluded: the cheapest stays);
                default the request's `max_cost_usd`.
            allowed: only these models may be chosen (e.g. the ones the gateway serves now).
        Raises:
            ValueError: no allowed model among the router's.
        """
        request = RoutingRequest.of(request)
        cost_penalty = request.cost_penalty if cost_penalty is None else cost_penalty
        max_cost_usd = request.max_cost_usd if max_cost_usd is None else max_cost_usd
        scored = self.router.score(request)
        quality = {m: float(scored[m]) for m in self.models}
        cost = dict(zip(self.models, map(float, self.expected_cost(request))))
        candidates = [m for m in self.models if allowed is None or m in allowed]
        if not candidates:
            raise ValueError(f"none of the router's models {self.models} is allowed")
        rule = "lambda" if cost_penalty is not None else self.decision.get("rule", "lambda")
        if rule == "threshold":
            knob = float(self.decision["threshold"])
            ranking = rank({m: quality[m] for m in candidates}, {m: cost[m] for m in candidates}, 0.0, max_cost_usd)
            order = list(ranking.order)
            strong, weak = self.decision["strong"], self.decision["weak"]
            if strong in order and weak in order:
                s, w = self.models.index(strong), self.models.index(weak)
                pick = self.models[int(choose_threshold(np.array([list(quality.values())]), s, w, knob)[0])]
                order = [pick, *(m for m in order if m != pick)]
            values = {}
        else:
            knob = float(cost_penalty if cost_penalty is not None else self.decision.get("cost_penalty", 0.0))
            ranking = rank({m: quality[m] for m in candidates}, {m: cost[m] for m in candidates}, knob, max_cost_usd)
            order = list(ranking.order)
            values = dict(zip(self.models, map(float, objective(list(quality.values()), list(cost.values()), knob))))
        return RoutingDecision(quality, cost, rule, knob, order[0], order, [m for m in self.models if m not in order],
                               values, ranking.is_over_max_cost)


# --- files ----------------------------------------------------------------------------------------------

def save_router(router: Router, path: str | Path, *, costs: CostModel | None = None,
                decision: dict[str, Any] | None = None, info: dict[str, Any] | None = None) -> Path:
    """Write a fitted router, its cost model and its calibrated decision to one safetensors file.

    Arrays are stored as "router/<name>" and "costs/<name>"; the header's metadata entry "router" is JSON:
    {"format", "version", "type", "models", "router": router meta, "costs": cost meta or null,
    "decision", "info"}. Returns the path.

    Raises:
        NotImplementedError: the router cannot be saved. TypeError: non-JSON metadata.
    """
    from safetensors.numpy import save_file

    arrays, meta = router.state()
    tensors = {f"router/{k}": np.ascontiguousarray(v) for k, v in arrays.items()}
    cost_meta = None
    if costs is not None:
        cost_arrays, cost_meta = costs.state()
        tensors.update({f"costs/{k}": np.ascontiguousarray(v) for k, v in cost_arrays.items()})
    header = {"format": FORMAT, "version": FORMAT_VERSION, "type": router.type, "models": router.models,
              "router": meta, "costs": cost_meta, "decision": decision or {"rule": "lambda", "cost_penalty": 0.0},
              "info": info or {}}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata={"router": json.dumps(header)})
    return path


def read_header(path: str | Path) -> dict[str, Any]:
    """The JSON header of a saved router (no arrays read, no router class imported).

    Raises:
        FileNotFoundError: no such file. ValueError: not a router file.
    """
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no router file at {path}")
    try:
        with safe_open(str(path), framework="np") as f:
            raw = (f.metadata() or {}).get("router")
    except Exception as exc:  # safetensors raises its own error types for a malformed file
        raise ValueError(f"{path} is not a safetensors file: {exc}") from exc
    header = json.loads(raw) if raw else {}
    if header.get("format") != FORMAT:
        raise ValueError(f"{path} is not a saved router (no '{FORMAT}' header)")
    return header


def load_router(path: str | Path) -> LoadedRouter:
    """Read a file written by `save_router`, whatever its registered type.

    Raises:
        FileNotFoundError: no such file. ValueError: not a router file, a newer format version, or an
            unknown router type.
    """
    from safetensors.numpy import load_file

    header = read_header(path)
    if header.get("version", 0) > FORMAT_VERSION:
        raise ValueError(f"{path} has router format version {header['version']}; this build reads {FORMAT_VERSION}")
    tensors = load_file(str(path))
    router_arrays = {k.removeprefix("router/"): v for k, v in tensors.items() if k.startswith("router/")}
    cls = router_class(header["type"])
    router = cls.from_state(router_arrays, {**header["router"], "models": header["models"]})
    costs = None
    if header.get("costs") is not None:
        costs = CostModel.from_state({k.removeprefix("costs/"): v for k, v in tensors.items() if k.startswith("costs/")},
                                     header["costs"])
    return LoadedRouter(router, costs, header.get("decision") or {"rule": "lambda", "cost_penalty": 0.0},
                        header.get("info") or {})
