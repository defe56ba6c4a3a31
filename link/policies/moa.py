"""`moa`: Mixture-of-Agents (routers/moa.py): proposers answer concurrently, an aggregator writes the answer.

    - name: link/moa
      type: moa
      models: [smollm2-135m-instruct, gemma-3-270m]   # the proposers (one each; see `temperatures`)
      options:
        aggregator: smollm2-135m-instruct   # default: the first model
        temperatures: [0.7]                 # optional: every model proposes once per temperature (default:
                                            #   once, at the request's temperature); one model at several
                                            #   temperatures is `models: [m]`, `temperatures: [0.3, 0.7, 1.0]`
        proposers: [{model: m, temperature: 0.7}, ...]   # optional: the proposers spelled out (overrides both)
        layers: 1                           # proposer layers (later layers see the previous answers)
        deadline_s: 60                      # each proposer's time from its layer's start; late ones are dropped
        proposer_max_tokens: 512            # cap of a proposer's answer (the request's max_tokens when smaller)
        min_proposals: 1                    # answers a layer needs (fewer: the request fails with 503)

A streamed answer starts at once: SSE keep-alive comments flow while the proposers work, then the
aggregator's answer streams. Every proposer's output (or error) and the aggregator go into the request
log's decision ("moa"); each call's usage and cost add up in the request's (link/executor.py).
"""

from __future__ import annotations

from typing import Any, AsyncIterator, Callable

from link.accounting import DEFAULT_MAX_COMPLETION_TOKENS, max_request_cost
from link.backends import BackendError, BackendUnavailable
from link.config import PolicyConfig
from link.policies.base import COMMON_OPTIONS, CostBound, Plan, PlanExecutor, Policy, PolicyError, PolicyRequest

OPTIONS = ("aggregator", "temperatures", "proposers", "layers", "deadline_s", "proposer_max_tokens", "min_proposals")


def _proposer_list(options: dict[str, Any], models: list[str]) -> list[tuple[str, float | None]]:
    spelled = options.get("proposers")
    if spelled is not None:
        if not isinstance(spelled, list) or not spelled or not all(isinstance(p, dict) and isinstance(p.get("model"), str)
                                                                    for p in spelled):
            raise PolicyError("options.proposers must be a non-empty list of {model, temperature}", param="options.proposers")
        return [(p["model"], p.get("temperature")) for p in spelled]
    temperatures = options.get("temperatures")
    if temperatures is None:
        return [(m, None) for m in models]
    if not isinstance(temperatures, list) or not temperatures:
        raise PolicyError("options.temperatures must be a non-empty list of numbers in [0, 2]", param="options.temperatures")
    return [(m, t) for m in models for t in temperatures]


def build_moa(options: dict[str, Any], models: list[str], model_names: tuple[str, ...] | None = None):
    """A `routers.moa.MixtureOfAgents` from a policy's options (see the module docstring).

    Raises:
        PolicyError: an unknown option, a bad value, or (with `model_names`) a model the gateway does not serve.
    """
    from routers.moa import MixtureOfAgents, Proposer

    unknown = sorted(set(options) - set(OPTIONS) - set(COMMON_OPTIONS))
    if unknown:
        raise PolicyError(f"unknown MoA option(s) {unknown}; options: {list(OPTIONS)}", param="options")
    aggregator = options.get("aggregator", models[0])
    pairs = _proposer_list(options, models)
    if model_names is not None:
        missing = [m for m in dict.fromkeys([aggregator, *(m for m, _ in pairs)]) if m not in model_names]
        if missing:
            raise PolicyError(f"MoA model(s) {missing} are not served; the gateway serves {sorted(model_names)}",
                              param="options.aggregator" if aggregator in missing else "options.proposers")
    try:
        proposers = [Proposer(m, None if t is None else float(t)) for m, t in pairs]
        settings = {k: options[k] for k in ("layers", "deadline_s", "proposer_max_tokens", "min_proposals") if k in options}
        return MixtureOfAgents(proposers, aggregator, **settings)
    except (TypeError, ValueError) as exc:
        raise PolicyError(f"MoA options: {exc}", param="options") from None


# Prompt tokens of the synthesis instruction around the references (as MoAExecutor.max_cost_usd assumes).
SYNTHESIS_TOKENS = 256


def moa_cost_bound(moa, models: list[str] | None = None) -> CostBound:
    """A `CostBound` of one MoA request: every proposer of every layer and the aggregator, each reading at most
    the prompt plus one layer's answers (one request's max tokens per proposer) and the synthesis instruction.

    Args:
        models: the models priced (default: the MoA's own).
    """
    return CostBound(calls=moa.layers * len(moa.proposers) + 1, models=tuple(models or moa.models),
                     prompt_tokens_per_max_token=len(moa.proposers), extra_prompt_tokens=SYNTHESIS_TOKENS)


class MoAExecutor(PlanExecutor):
    """Runs a `MixtureOfAgents` for one request; maps "no proposer answered" to a BackendError."""

    keepalive = True

    def __init__(self, moa):
        self.moa = moa
        self.final_model = moa.aggregator

    @staticmethod
    def _failure(exc) -> BackendError:
        """Every proposer refused the request itself (a 4xx): that error; else 503 `no_proposals` (retryable)."""
        errors = [p.exception for p in exc.proposals]
        if errors and all(isinstance(e, BackendError) and 400 <= e.status_code < 500 for e in errors):
            return errors[0]
        return BackendUnavailable(str(exc), code="no_proposals")

    async def complete(self, caller, body: dict[str, Any], decision: dict[str, Any]) -> dict:
        from routers.moa import MoATrace, NoProposalError

        trace = MoATrace()
        try:
            return await self.moa.complete(caller, body, trace)
        except NoProposalError as exc:
            raise self._failure(exc) from exc
        finally:
            decision["moa"] = trace.to_dict()

    async def stream(self, caller, body: dict[str, Any], decision: dict[str, Any]) -> AsyncIterator[dict]:
        from routers.moa import MoATrace, NoProposalError

        trace = MoATrace()
        try:
            async for chunk in self.moa.stream(caller, body, trace):
                yield chunk
        except NoProposalError as exc:
            raise self._failure(exc) from exc
        finally:
            decision["moa"] = trace.to_dict()

    def max_cost_usd(self, endpoint: str, body: dict[str, Any], deployments: Callable[[str], list]) -> float:
        """Every proposer of every layer at its cap, then the aggregator reading every last-layer answer in full."""
        moa = self.moa
        total, references = 0.0, 0
        for _ in range(moa.layers):
            answers = 0
            for i, proposer in enumerate(moa.proposers):
                sent = moa.proposer_body(body, proposer, i, [])
                total += max_request_cost(endpoint, sent, deployments(proposer.model), extra_prompt_tokens=references)
                answers += int(sent.get("max_tokens") or DEFAULT_MAX_COMPLETION_TOKENS)
            references = answers + SYNTHESIS_TOKENS
        return total + max_request_cost(endpoint, body, deployments(moa.aggregator), extra_prompt_tokens=references)


class MoAPolicy(Policy):
    """A Mixture-of-Agents over the policy's models (see the module docstring)."""

    type = "moa"

    @classmethod
    def check(cls, config: PolicyConfig, model_names: tuple[str, ...]) -> None:
        super().check(config, model_names)
        build_moa(dict(config.options), list(config.models), model_names)

    def __init__(self, config: PolicyConfig, model_names: tuple[str, ...] | list[str]):
        super().__init__(config, model_names)
        self.moa = build_moa(dict(config.options), list(config.models))
        self.executor = MoAExecutor(self.moa)
        self.executor.recorded_as = self.name   # offline replay: the outcomes `link eval run` recorded for it

    def cost_bound(self) -> CostBound:
        return moa_cost_bound(self.moa)

    def describe_plan(self) -> dict[str, Any]:
        moa = self.moa
        return {"type": self.type, "aggregator": moa.aggregator, "layers": moa.layers, "deadline_s": moa.deadline_s,
                "proposers": [{"model": p.model, "temperature": p.temperature} for p in moa.proposers]}

    async def plan(self, request: PolicyRequest) -> Plan:
        return Plan(self.name, self.moa.models, self.describe_plan(), executor=self.executor)
