"""`hybrid`: a router chooses between the single models and a Mixture-of-Agents plan, by predicted gain
against cost.

    - name: link/hybrid
      type: hybrid
      models: [smollm2-135m-instruct, gemma-3-270m]   # the single-model candidates
      options:
        path: routers/trained/link-auto.safetensors   # a router over these models (and maybe the MoA's column)
        encoder: auto        # optional: the prompt encoder, as a router policy's (link/policies/router.py)
        moa: {models: [smollm2-135m-instruct, gemma-3-270m], aggregator: smollm2-135m-instruct}   # a moa policy's options
        moa_column: link/moa     # optional: the router's column that predicts the MoA's quality (trained on
                                 #   outcomes of the moa policy); default "link/moa" when the router has it
        moa_gain: 0.03           # without a column: predicted MoA quality = its best proposer's + moa_gain,
                                 #   in [0, 1]
        cost_penalty: 200        # optional, as a router policy's (default: the file's lambda rule knob, else 0)
        max_cost_usd: 0.01       # optional, as a router policy's

Every option, the MoA included, is ranked by predicted quality - lambda * expected cost
(`routers.decision.rank`, the router policy's rule); the best one is planned: a single model (then the other
single models by the objective, as fallbacks), or the MoA plan. Without a column the MoA's expected cost is
the sum of its calls' (proposers in every layer, then the aggregator), each priced by the router's cost model
(the aggregator's reading of the proposals is not priced); with one, the cost model's own estimate for it,
which the request's `max_tokens` does not cap as it caps a priced single model's output. The request's
`metadata` may override lambda and the ceiling like a router policy's.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from link.config import PolicyConfig
from link.policies.base import CostBound, Plan, Policy, PolicyError, PolicyRequest
from link.policies.moa import MoAExecutor, build_moa, moa_cost_bound
from link.policies.options import number_option, str_option
from link.policies.router import LazyRouter, encoder_option, knob_options, router_path, routing_request
from routers.request import RoutingRequest

OPTIONS = ("path", "moa", "moa_column", "moa_gain", "cost_penalty", "max_cost_usd", "encoder")
DEFAULT_MOA_COLUMN = "link/moa"
MOA = "moa"  # the MoA option's name in the decision


class HybridPolicy(Policy):
    """Single models or a MoA plan, whichever the router's objective prefers (see the module docstring)."""

    type = "hybrid"
    OPTIONS = OPTIONS

    @classmethod
    def check(cls, config: PolicyConfig, model_names: tuple[str, ...]) -> None:
        super().check(config, model_names)
        cls._parts(config, model_names)

    @classmethod
    def _parts(cls, config: PolicyConfig, model_names: tuple[str, ...] | None):
        options = config.options
        knob_options(options)
        router = LazyRouter(router_path(config), encoder_option(options))
        outside = [m for m in config.models if m not in router.models]
        if outside:
            raise PolicyError(f"model(s) {outside} are not among the router's models {router.models}", param="models")
        moa_options = options.get("moa") or {}
        if not isinstance(moa_options, dict):
            raise PolicyError(f"options.moa must be a moa policy's options (a JSON object), got {moa_options!r}",
                              param="options.moa")
        moa_options = dict(moa_options)
        moa_models = moa_options.pop("models", None) or list(config.models)
        if not isinstance(moa_models, list) or not all(isinstance(m, str) for m in moa_models):
            raise PolicyError(f"options.moa.models must be a list of model names, got {moa_models!r}",
                              param="options.moa.models")
        moa = build_moa(moa_options, list(moa_models), model_names, prefix="options.moa")
        column = str_option(options, "moa_column", DEFAULT_MOA_COLUMN if DEFAULT_MOA_COLUMN in router.models else None)
        if column is not None and column not in router.models:
            raise PolicyError(f"options.moa_column {column!r} is not among the router's models {router.models}",
                              param="options.moa_column")
        if column is None:
            unpriced = [m for m in moa.models if m not in router.models]
            if unpriced:
                raise PolicyError(f"MoA model(s) {unpriced} are not among the router's models {router.models}: without "
                                  "options.moa_column the MoA is predicted from its models' scores", param="options.moa")
        gain = number_option(options, "moa_gain", 0.0, 0.0, 1.0)
        return router, moa, column, gain

    def __init__(self, config: PolicyConfig, model_names: tuple[str, ...] | list[str]):
        super().__init__(config, model_names)
        self.router, self.moa, self.moa_column, self.moa_gain = self._parts(config, None)
        self.router.preload()
        self.executor = MoAExecutor(self.moa)
        self.executor.recorded_as = self.moa_column   # offline replay: the MoA option's recorded outcomes
        self.cost_penalty, self.max_cost_usd = knob_options(config.options)

    def cost_bound(self) -> CostBound:
        """The MoA plan's (a single model's one call costs less), priced over every model either plan calls."""
        return moa_cost_bound(self.moa, list(dict.fromkeys([*self.config.models, *self.moa.models])))

    def decide(self, request: RoutingRequest) -> dict[str, Any]:
        """The request log's decision dict, "order" holding the options ranked by `routers.decision.rank`
        (blocking; a worker thread)."""
        from routers.decision import rank

        loaded = self.router.get()                 # waits for the file and the encoder on the first request
        started = time.perf_counter()              # routing_ms: the decision itself
        scores = loaded.router.score(request)
        costs = dict(zip(loaded.models, (float(c) for c in loaded.expected_cost(request))))
        cost_penalty, max_cost_usd = request.cost_penalty, request.max_cost_usd
        if cost_penalty is None:
            saved = loaded.decision
            cost_penalty = float(saved.get("cost_penalty", 0.0)) if saved.get("rule", "lambda") == "lambda" else 0.0
        quality = {m: scores[m] for m in self.config.models}
        cost = {m: costs[m] for m in self.config.models}
        if self.moa_column is not None:
            quality[MOA], cost[MOA] = scores[self.moa_column], costs[self.moa_column]
        else:
            moa = self.moa
            quality[MOA] = min(1.0, max(scores[p.model] for p in moa.proposers) + self.moa_gain)
            cost[MOA] = moa.layers * sum(costs[p.model] for p in moa.proposers) + costs[moa.aggregator]
        ranking = rank(quality, cost, cost_penalty, max_cost_usd)
        decision = {"type": self.type, "router": loaded.router.type, "scores": quality, "expected_cost_usd": cost,
                    "cost_penalty": cost_penalty, "objective": ranking.objective, "chosen": ranking.order[0],
                    "excluded": ranking.excluded, "order": list(ranking.order),
                    "routing_ms": round((time.perf_counter() - started) * 1000, 3)}
        if max_cost_usd is not None:
            decision["max_cost_usd"] = max_cost_usd
            decision["over_max_cost"] = ranking.is_over_max_cost   # every option was over: the cheapest
        return decision

    async def plan(self, request: PolicyRequest) -> Plan:
        routing = routing_request(request, self.cost_penalty, self.max_cost_usd)
        decision = await asyncio.to_thread(self.decide, routing)
        ranked = decision.pop("order")
        if ranked[0] == MOA:
            decision["moa_plan"] = {"aggregator": self.moa.aggregator,
                                    "proposers": [{"model": p.model, "temperature": p.temperature} for p in self.moa.proposers]}
            return Plan(self.name, self.moa.models, decision, executor=self.executor)
        return Plan(self.name, [m for m in ranked if m != MOA], decision)
