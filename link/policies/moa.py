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
        layers: 1                           # proposer layers, 1..4 (later layers see the previous answers)
        deadline_s: 60                      # each proposer's time from its layer's start, (0, 3600] s; late
                                            #   ones are dropped
        proposer_max_tokens: 512            # cap of a proposer's answer, 1..131072 or null (the request's
                                            #   max_tokens when smaller)
        min_proposals: 1                    # answers a layer needs, 1..proposers (fewer: the request fails with 503)

Temperatures are numbers in [0, 2]; a layer has at most 16 proposers; an unknown option or field is refused
(400 naming it, e.g. `options.layers`).

A streamed answer starts at once: SSE keep-alive comments flow while the proposers work, then the
aggregator's answer streams. Every proposer's output (or error) and the aggregator go into the request
log's decision ("moa"); each call's usage and cost add up in the request's (link/executor.py). The answer's
`usage` is the aggregator's call; `usage.link_billed` the sum over every call.
"""

from __future__ import annotations

from typing import Any, AsyncIterator, Callable

from link.accounting import DEFAULT_MAX_COMPLETION_TOKENS, max_request_cost
from link.backends import BackendError, BackendUnavailable
from link.config import PolicyConfig
from link.policies.base import (MULTI_CALL_OPTIONS, CostBound, Plan, PlanExecutor, Policy, PolicyError, PolicyRequest,
                               without_stream_resume)
from link.policies.options import check_options, int_option, number_option, number_value, str_option

OPTIONS = ("aggregator", "temperatures", "proposers", "layers", "deadline_s", "proposer_max_tokens", "min_proposals")
# Bounds of the options (the module docstring's defaults inside them): a layer calls every proposer, so layers and
# proposers multiply the cost of one request.
MAX_LAYERS = 4              # the MoA paper's best configuration used 3
MAX_PROPOSERS = 16          # proposers of one layer (models x temperatures, or spelled out)
MAX_DEADLINE_S = 3600.0
MAX_PROPOSER_TOKENS = 131_072
MAX_TEMPERATURE = 2.0       # OpenAI's range


def _proposer_list(options: dict[str, Any], models: list[str], prefix: str) -> list[tuple[str, float | None]]:
    """(model, temperature or None) of one layer's proposers. Raises PolicyError naming the field."""
    spelled = options.get("proposers")
    if spelled is not None:
        param = f"{prefix}.proposers"
        if not isinstance(spelled, list) or not spelled or not all(isinstance(p, dict) and isinstance(p.get("model"), str)
                                                                    and p["model"] for p in spelled):
            raise PolicyError(f"{param} must be a non-empty list of {{model, temperature}}", param=param)
        pairs = []
        for i, proposer in enumerate(spelled):
            extra = [k for k in proposer if k not in ("model", "temperature")]
            if extra:
                raise PolicyError(f"unknown field {extra[0]!r} of {param}[{i}]; its fields: model, temperature",
                                  param=f"{param}[{i}].{extra[0]}")
            temperature = proposer.get("temperature")
            if temperature is not None:
                temperature = number_value(temperature, f"{param}[{i}].temperature", 0.0, MAX_TEMPERATURE)
            pairs.append((proposer["model"], temperature))
    else:
        temperatures = options.get("temperatures")
        if temperatures is None:
            pairs = [(m, None) for m in models]
        else:
            param = f"{prefix}.temperatures"
            if not isinstance(temperatures, list) or not temperatures:
                raise PolicyError(f"{param} must be a non-empty list of numbers in [0, {MAX_TEMPERATURE:g}]", param=param)
            values = [number_value(t, f"{param}[{i}]", 0.0, MAX_TEMPERATURE) for i, t in enumerate(temperatures)]
            pairs = [(m, t) for m in models for t in values]
    if len(pairs) > MAX_PROPOSERS:
        raise PolicyError(f"a MoA layer has at most {MAX_PROPOSERS} proposers, got {len(pairs)}",
                          param=f"{prefix}.proposers" if spelled is not None else f"{prefix}.temperatures")
    return pairs


def build_moa(options: dict[str, Any], models: list[str], model_names: tuple[str, ...] | None = None, *,
              prefix: str = "options"):
    """A `routers.moa.MixtureOfAgents` from a policy's options (see the module docstring for each option;
    the bounds are MAX_* above).

    Args:
        prefix: where the options sit, for error params ("options"; a hybrid policy's: "options.moa").
    Raises:
        PolicyError: an unknown option, a value of the wrong type or out of its range, or (with `model_names`) a
            model the gateway does not serve; `param` names the field ("options.layers").
    """
    from routers.moa import MixtureOfAgents, Proposer

    check_options("moa", without_stream_resume("moa", options), (*OPTIONS, *MULTI_CALL_OPTIONS), prefix)
    aggregator = str_option(options, "aggregator", models[0], prefix)
    pairs = _proposer_list(options, models, prefix)
    if model_names is not None:
        missing = [m for m in dict.fromkeys([aggregator, *(m for m, _ in pairs)]) if m not in model_names]
        if missing:
            raise PolicyError(f"MoA model(s) {missing} are not served; the gateway serves {sorted(model_names)}",
                              param=f"{prefix}.aggregator" if aggregator in missing else f"{prefix}.proposers")
    settings = {"layers": int_option(options, "layers", 1, 1, MAX_LAYERS, prefix=prefix),
                "deadline_s": number_option(options, "deadline_s", 60.0, 0.0, MAX_DEADLINE_S, low_open=True, prefix=prefix),
                "proposer_max_tokens": int_option(options, "proposer_max_tokens", 512, 1, MAX_PROPOSER_TOKENS,
                                                  nullable=True, prefix=prefix),
                "min_proposals": int_option(options, "min_proposals", 1, 1, len(pairs), prefix=prefix)}
    try:
        return MixtureOfAgents([Proposer(m, t) for m, t in pairs], aggregator, **settings)
    except (TypeError, ValueError) as exc:
        raise PolicyError(f"MoA options: {exc}", param=prefix) from None


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
    OPTIONS = OPTIONS
    CONTINUES_STREAMS = False  # the answer comes from several calls

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
