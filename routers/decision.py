"""The decision rule: predicted quality against expected cost, and the knob that trades one for the other.

    costs = CostModel.from_data(train)                                  # USD per answer, per model
    expected = costs.expected_cost(estimate_prompt_tokens(prompts))     # [N, M]
    picks = choose(quality, expected, cost_penalty=200.0)               # [N] argmax_m q - lambda * c
    ranking = rank({"a": 0.6, "b": 0.8}, {"a": 0.001, "b": 0.0015}, 200.0, max_cost=0.01)
    ranking.order                                                       # ("b", "a"): one request's plan

`rank` is the one routing objective: the router and hybrid policies order their candidates with it, and
offline evaluation and calibration (`routers.offline`, where the knob is set on held-out prompts) sweep its
first place, `choose`, over many prompts.

The cost penalty lambda (quality points per USD) is the inverse of a willingness to pay: a model is worth
its extra cost when its predicted quality gain exceeds lambda times the extra dollars (RouterBench,
Hu et al. 2024, sweeps the same trade-off). For a strong/weak pair the rule can instead be RouteLLM's
threshold on the predicted gain (Ong et al. 2024), calibrated as a quantile.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

CHARS_PER_TOKEN = 4


def estimate_prompt_tokens(texts: list[str]) -> np.ndarray:
    """[N] float64 ceil(characters / 4): the prompt tokens assumed when none were counted (as evals.prices)."""
    return np.array([math.ceil(len(t) / CHARS_PER_TOKEN) for t in texts], dtype=np.float64)


@dataclass
class CostModel:
    """Expected USD cost of each model's answer to a prompt.

    With prices: input_per_million * prompt_tokens / 1e6 + output_per_million * expected_output_tokens / 1e6.
    Without (a recorded set with per-row costs only, like RouterBench): a least-squares line in the prompt
    tokens, cost = per_prompt_token * tokens + intercept, the intercept per suite when the suite is known
    (output lengths differ by task), else `base_cost`; `mean_cost` when no line was fitted.

    Attributes:
        models: [M] names.
        input_per_million, output_per_million: [M] USD per million tokens, NaN where no price is known.
        expected_output_tokens: [M] mean completion tokens, NaN where unknown.
        mean_cost: [M] mean recorded USD per answer.
        per_prompt_token, base_cost: [M] the fitted line (NaN: none fitted).
        suite_base_cost: suite -> [M] intercepts.
    """

    models: list[str]
    input_per_million: np.ndarray
    output_per_million: np.ndarray
    expected_output_tokens: np.ndarray
    mean_cost: np.ndarray
    per_prompt_token: np.ndarray | None = None
    base_cost: np.ndarray | None = None
    suite_base_cost: dict[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        m = len(self.models)
        nan = np.full(m, np.nan)
        self.per_prompt_token = nan.copy() if self.per_prompt_token is None else self.per_prompt_token
        self.base_cost = nan.copy() if self.base_cost is None else self.base_cost
        for name in ("input_per_million", "output_per_million", "expected_output_tokens", "mean_cost",
                     "per_prompt_token", "base_cost"):
            value = np.asarray(getattr(self, name), dtype=np.float64).reshape(-1)
            if value.shape != (m,):
                raise ValueError(f"{name} must have one value per model ({m}), got shape {value.shape}")
            setattr(self, name, value)
        self.suite_base_cost = {s: np.asarray(v, dtype=np.float64).reshape(m) for s, v in self.suite_base_cost.items()}

    @property
    def num_models(self) -> int:
        return len(self.models)

    @property
    def has_price(self) -> np.ndarray:
        """[M] bool: the model has input and output prices."""
        return np.isfinite(self.input_per_million) & np.isfinite(self.output_per_million)

    def expected_cost(self, prompt_tokens: np.ndarray, suites: list[str] | None = None,
                      max_output_tokens: np.ndarray | None = None) -> np.ndarray:
        """[N, M] expected USD of each model's answer to N prompts of `prompt_tokens` [N] tokens.

        Args:
            suites: [N] task labels, for the per-suite intercepts (None or an unknown suite: the global one).
            max_output_tokens: [N] the requests' completion-token limits (`max_tokens`; NaN: none): a priced
                model's expected output is capped there (a model without prices keeps its fitted cost).
        """
        t = np.asarray(prompt_tokens, dtype=np.float64).reshape(-1, 1)
        out = np.broadcast_to(self.mean_cost, (len(t), self.num_models)).copy()
        fitted = np.isfinite(self.per_prompt_token) & np.isfinite(self.base_cost)
        if fitted.any():
            intercept = np.broadcast_to(self.base_cost, out.shape).copy()
            if suites is not None:
                for i, s in enumerate(suites):
                    if s in self.suite_base_cost:
                        intercept[i] = self.suite_base_cost[s]
            line = np.maximum(self.per_prompt_token * t + intercept, 0.0)
            out[:, fitted] = line[:, fitted]
        priced = self.has_price
        if priced.any():
            out_tokens = np.broadcast_to(np.nan_to_num(self.expected_output_tokens, nan=0.0), out.shape)
            if max_output_tokens is not None:
                limit = np.asarray(max_output_tokens, dtype=np.float64).reshape(-1, 1)
                out_tokens = np.minimum(out_tokens, np.where(np.isnan(limit), np.inf, limit))
            by_price = (self.input_per_million * t + self.output_per_million * out_tokens) / 1e6
            out[:, priced] = by_price[:, priced]
        return out

    def select_models(self, names: list[str]) -> CostModel:
        """The cost model of `names` (in that order). Raises KeyError for an unknown model."""
        missing = [n for n in names if n not in self.models]
        if missing:
            raise KeyError(f"no costs for {missing}; models: {self.models}")
        cols = [self.models.index(n) for n in names]
        return CostModel(list(names), self.input_per_million[cols], self.output_per_million[cols],
                         self.expected_output_tokens[cols], self.mean_cost[cols], self.per_prompt_token[cols],
                         self.base_cost[cols], {s: v[cols] for s, v in self.suite_base_cost.items()})

    def with_models(self, other: CostModel) -> CostModel:
        """This cost model with `other`'s models appended (e.g. one fitted on a newly added model's rows).

        Suite intercepts missing on either side fall back to that model's global intercept.
        Raises:
            ValueError: a model of `other` is already here.
        """
        clash = [m for m in other.models if m in self.models]
        if clash:
            raise ValueError(f"the cost model already has {clash}")
        suites = dict.fromkeys([*self.suite_base_cost, *other.suite_base_cost])
        table = {s: np.concatenate([self.suite_base_cost.get(s, self.base_cost), other.suite_base_cost.get(s, other.base_cost)])
                 for s in suites}
        return CostModel([*self.models, *other.models],
                         *(np.concatenate([getattr(self, name), getattr(other, name)])
                           for name in ("input_per_million", "output_per_million", "expected_output_tokens", "mean_cost",
                                        "per_prompt_token", "base_cost")), table)

    @classmethod
    def from_data(cls, data, prices: dict[str, tuple[float, float]] | None = None) -> CostModel:
        """Fit from recorded costs (`routers.offline.data.RoutingData`), with optional prices.

        Per model, over the prompts it answered: mean cost; the line cost ~ a * tokens + b by least squares
        on tokens = ceil(prompt chars / 4), with a >= 0 and b >= 0 (a negative slope becomes a = 0, b = mean;
        a negative intercept a line through the origin); per-suite intercepts mean(cost - a * tokens) >= 0.
        With `prices` (model -> (input, output) USD per million tokens): expected output tokens are the mean
        recorded completion tokens, else solved from the mean cost, and the price formula is used.
        """
        prices = prices or {}
        m = data.num_models
        tokens = estimate_prompt_tokens(data.prompts)
        suites = np.asarray(data.suites)
        inp, outp, exp_out = np.full(m, np.nan), np.full(m, np.nan), np.full(m, np.nan)
        mean, slope, base = np.full(m, np.nan), np.full(m, np.nan), np.full(m, np.nan)
        suite_base = {s: np.full(m, np.nan) for s in dict.fromkeys(data.suites)}
        for j, model in enumerate(data.models):
            ok = np.isfinite(data.costs[:, j])
            if not ok.any():
                continue
            c, t = data.costs[ok, j], tokens[ok]
            mean[j] = c.mean()
            if len(np.unique(t)) >= 2:
                a, b = np.linalg.lstsq(np.stack([t, np.ones_like(t)], axis=1), c, rcond=None)[0]
                if a < 0:
                    a, b = 0.0, c.mean()
                elif b < 0:
                    a, b = float(t @ c / (t @ t)), 0.0
                slope[j], base[j] = a, b
                for s in suite_base:
                    in_suite = suites[ok] == s
                    if in_suite.any():
                        suite_base[s][j] = max(0.0, float(np.mean(c[in_suite] - a * t[in_suite])))
            if model in prices:
                inp[j], outp[j] = prices[model]
                if data.completion_tokens is not None and np.isfinite(data.completion_tokens[:, j]).any():
                    exp_out[j] = np.nanmean(data.completion_tokens[:, j])
                else:
                    exp_out[j] = max(0.0, (mean[j] - inp[j] * t.mean() / 1e6) / (outp[j] / 1e6)) if outp[j] > 0 else 0.0
        # suites where a model has no rows fall back to its global intercept
        for s, v in suite_base.items():
            suite_base[s] = np.where(np.isfinite(v), v, base)
        return cls(list(data.models), inp, outp, exp_out, mean, slope, base, suite_base)

    # --- persistence (routers.base.save_router) -----------------------------------------------------------

    def state(self) -> tuple[dict[str, np.ndarray], dict]:
        """(arrays, JSON metadata) for a safetensors file."""
        suites = list(self.suite_base_cost)
        arrays = {"input_per_million": self.input_per_million, "output_per_million": self.output_per_million,
                  "expected_output_tokens": self.expected_output_tokens, "mean_cost": self.mean_cost,
                  "per_prompt_token": self.per_prompt_token, "base_cost": self.base_cost,
                  "suite_base_cost": (np.stack([self.suite_base_cost[s] for s in suites]) if suites
                                      else np.zeros((0, self.num_models)))}
        return arrays, {"models": self.models, "suites": suites}

    @classmethod
    def from_state(cls, arrays: dict[str, np.ndarray], meta: dict) -> CostModel:
        table = arrays["suite_base_cost"]
        return cls(list(meta["models"]), arrays["input_per_million"], arrays["output_per_million"],
                   arrays["expected_output_tokens"], arrays["mean_cost"], arrays["per_prompt_token"],
                   arrays["base_cost"], {s: table[i] for i, s in enumerate(meta["suites"])})


# --- the rule -------------------------------------------------------------------------------------------

TIE_TOLERANCE = 1e-12   # objectives this close are a tie (float noise in q - lambda * c is far smaller)


def objective(quality, expected_cost, cost_penalty: float) -> np.ndarray:
    """quality - cost_penalty * expected_cost, elementwise (any shapes that broadcast), float64.

    With cost_penalty 0 the objective is the quality itself, so an unknown (NaN) cost does not matter.
    """
    quality = np.asarray(quality, dtype=np.float64)
    return quality - cost_penalty * np.asarray(expected_cost, dtype=np.float64) if cost_penalty else quality.copy()


def choose(quality: np.ndarray, expected_cost: np.ndarray, cost_penalty: float, *,
           available: np.ndarray | None = None) -> np.ndarray:
    """[N] int64 index of argmax_m quality[n, m] - cost_penalty * expected_cost[n, m]: the first place of
    `rank`, for N prompts at once (offline sweeps call it once per knob setting).

    Args:
        quality: [N, M] predicted quality (NaN: the model is chosen only when no available model has one).
        expected_cost: [N, M] USD (NaN: unknown, loses every cost tie).
        cost_penalty: lambda >= 0, quality points per USD.
        available: [N, M] or [M] bool, the models that may be chosen (default: all).
    Ties (objectives within TIE_TOLERANCE) go to the cheaper model, then the lower index. A row whose
    available models all lack an objective gets its cheapest available model; a row with none available,
    index 0. Raises ValueError for a negative or NaN penalty or mismatched shapes.
    """
    quality, expected_cost = np.asarray(quality, dtype=np.float64), np.asarray(expected_cost, dtype=np.float64)
    if quality.shape != expected_cost.shape or quality.ndim != 2:
        raise ValueError(f"quality {quality.shape} and expected_cost {expected_cost.shape} must both be [N, M]")
    if not cost_penalty >= 0:
        raise ValueError(f"cost_penalty must be >= 0, got {cost_penalty}")
    available = np.broadcast_to(True if available is None else np.asarray(available, dtype=bool), quality.shape)
    utility = objective(quality, expected_cost, cost_penalty)
    utility[np.isnan(utility) | ~available] = -np.inf
    best = utility.max(axis=1, keepdims=True)
    tied = (utility >= best - TIE_TOLERANCE) & available
    tie_cost = np.where(tied, np.nan_to_num(expected_cost, nan=np.inf), np.inf)
    return ((tie_cost == tie_cost.min(axis=1, keepdims=True)) & tied).argmax(axis=1)


@dataclass(frozen=True)
class Ranked:
    """One candidate of a ranking: predicted quality, expected USD, its objective quality - lambda * cost,
    and whether its expected cost is over the request's ceiling."""

    name: str
    quality: float
    cost: float
    objective: float
    is_over_max_cost: bool = False


@dataclass(frozen=True)
class Ranking:
    """`rank`'s answer: every candidate as given, and the names that may answer, best first.

    Attributes:
        given: [M] every candidate, in the order given.
        order: the candidates that may answer (over the ceiling ones left out), best first; never empty.
        cost_penalty: the lambda ranked with. max_cost: the ceiling in USD (None: none).
    """

    given: tuple[Ranked, ...]
    order: tuple[str, ...]
    cost_penalty: float
    max_cost: float | None = None

    @property
    def candidates(self) -> list[Ranked]:
        """The candidates that may answer, best first."""
        by_name = {r.name: r for r in self.given}
        return [by_name[n] for n in self.order]

    @property
    def chosen(self) -> Ranked:
        return self.candidates[0]

    @property
    def excluded(self) -> list[str]:
        """The candidates over the ceiling, in the order given."""
        return [r.name for r in self.given if r.name not in self.order]

    @property
    def is_over_max_cost(self) -> bool:
        """Every candidate was expected over the ceiling: the cheapest answers."""
        return self.chosen.is_over_max_cost

    @property
    def objective(self) -> dict[str, float]:
        """name -> quality - lambda * cost, every candidate in the order given."""
        return {r.name: r.objective for r in self.given}


def rank(quality: Mapping[str, float], cost: Mapping[str, float], cost_penalty: float,
         max_cost: float | None = None) -> Ranking:
    """The candidates by the objective quality - cost_penalty * cost, with a cost ceiling: the routing rule
    of the router and hybrid policies (their plan's order), and, through its first place `choose`, of the
    offline sweeps.

    Args:
        quality: name -> predicted quality (the candidates, in a fixed order: ties fall back to it).
        cost: name -> expected USD of each candidate's answer.
        cost_penalty: lambda >= 0, quality points per USD.
        max_cost: USD; candidates expected to cost more are left out. When every one is, the cheapest
            stays (all those tied at the lowest cost, ranked by the objective) and is flagged over it.
    Each place goes to `choose` over the candidates not yet placed: ties (within TIE_TOLERANCE) to the
    cheaper candidate, then the one given first.
    Raises:
        ValueError: no candidates, `cost` missing a candidate, a negative or NaN penalty or ceiling.
    """
    names = list(quality)
    if not names or any(n not in cost for n in names):
        raise ValueError(f"rank needs a quality and a cost per candidate, got qualities of {names} and costs of "
                         f"{list(cost)}")
    if max_cost is not None and not max_cost >= 0:
        raise ValueError(f"max_cost must be >= 0 USD, got {max_cost}")
    q = np.array([quality[n] for n in names], dtype=np.float64)
    c = np.array([cost[n] for n in names], dtype=np.float64)
    over = np.zeros(len(names), dtype=bool) if max_cost is None else ~(c <= max_cost)
    left = ~over
    if not left.any():   # every candidate over the ceiling: the cheapest answers (all, when no cost is known)
        left = c == np.nanmin(c) if np.isfinite(c).any() else np.ones(len(names), dtype=bool)
    order = []
    for _ in range(int(left.sum())):
        pick = int(choose(q[None, :], c[None, :], cost_penalty, available=left)[0])
        order.append(names[pick])
        left[pick] = False
    value = objective(q, c, cost_penalty)
    given = tuple(Ranked(n, float(q[i]), float(c[i]), float(value[i]), bool(over[i])) for i, n in enumerate(names))
    return Ranking(given, tuple(order), float(cost_penalty), max_cost)


def choose_threshold(quality: np.ndarray, strong: int, weak: int, threshold: float) -> np.ndarray:
    """[N] int64: `strong` where the predicted gain quality[:, strong] - quality[:, weak] >= threshold, else
    `weak` (RouteLLM's rule, with the gain in place of the strong model's win probability)."""
    quality = np.asarray(quality, dtype=np.float64)
    gain = quality[:, strong] - quality[:, weak]
    return np.where(gain >= threshold, strong, weak).astype(np.int64)
