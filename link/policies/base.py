"""The policy interface: given a request and the models on offer, an ordered plan of candidate models.

    policy = make_policy(PolicyConfig(name="cheap-first", type="fallback", models=["a", "b"]), model_names)
    plan = await policy.plan(PolicyRequest(endpoint="chat", body=body, model_names=model_names))
    plan.models     # ["a", "b"]: the gateway tries them in order (next one only before the first byte)
    plan.decision   # JSON-able details, stored in the request log's `decision` column

A policy type is a subclass of `Policy` registered by name (fixed, fallback, router, cascade, moa,
hybrid), built by `make_policy`, which imports the type's module only when first needed. A subclass
implements `plan` and may tighten `check` (called when a policy is created or loaded).

Most plans are "the first candidate that answers". A plan that needs several model calls per request
(a cascade, a Mixture-of-Agents) also carries a `PlanExecutor`, which the gateway runs with a
`routers.calls.ModelCaller` over its deployments (link/executor.py).
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Literal

from pydantic import ValidationError

from link.config import PolicyConfig
from link.policies.cache_options import CacheOptions, cache_options
from link.policies.options import PolicyError, bool_option, check_name, check_options
from link.policies.registry import POLICIES


@dataclass(frozen=True)
class PolicyRequest:
    """What a policy sees of one request.

    Attributes:
        endpoint: "chat" or "completion".
        body: the validated OpenAI request as a dict (read-only by convention).
        model_names: the public model names the gateway serves (the registry).
    """

    endpoint: Literal["chat", "completion"]
    body: dict[str, Any]
    model_names: tuple[str, ...]


@dataclass
class Plan:
    """A policy's answer: candidate models in order of preference and why.

    Attributes:
        policy: the policy's name (the `x-link-policy` header).
        models: public model names, first choice first; never empty. With an executor: every model it may
            call (the request log's "candidates").
        decision: JSON-able details (type, scores, thresholds...) for the request log.
        executor: runs a plan of several calls (cascade, MoA); None: the first of `models` that answers.
    """

    policy: str
    models: list[str]
    decision: dict[str, Any] = field(default_factory=dict)
    executor: PlanExecutor | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.models:
            raise ValueError(f"policy {self.policy!r} planned no model")


class PlanExecutor(ABC):
    """Runs one request through several model calls and returns the final answer.

    The `caller` is a `routers.calls.ModelCaller` that the gateway builds per request: every call it makes
    is accounted (tokens, cost) in the request's record. `decision` is the request log's decision dict;
    an executor adds what it did (every proposal, every cascade step) there, also when it fails.

    Attributes:
        keepalive: a streamed answer starts at once (200, headers, SSE keep-alive comments while the first
            calls run); False: the gateway waits for the first chunk, so errors before it are plain HTTP errors.
        final_model: the model named in `x-link-model` of an answer that starts before it is known (None:
            unknown until the answer exists).
    """

    keepalive: bool = False
    final_model: str | None = None
    recorded_as: str | None = None

    def replay_model(self, body: dict[str, Any]) -> str | None:
        """Offline replay (evals/replay.py): the one outcome column whose recorded answer is this plan's
        answer to `body`, paid alone; None when no single recorded answer is (a MoA, a judge-scored
        cascade). Default: `recorded_as`, a column holding this plan's own outcomes (e.g. those that
        `link eval run` recorded for a MoA policy). May block (a router's embedding): call it in a thread."""
        return self.recorded_as

    @abstractmethod
    async def complete(self, caller: Any, body: dict[str, Any], decision: dict[str, Any]) -> dict:
        """The whole final answer (an OpenAI response dict whose `model` names the model that wrote it).
        Raises link.backends.BackendError."""

    @abstractmethod
    def stream(self, caller: Any, body: dict[str, Any], decision: dict[str, Any]) -> AsyncIterator[dict]:
        """The final answer's OpenAI chunks. Raises link.backends.BackendError while iterating."""

    @abstractmethod
    def max_cost_usd(self, endpoint: str, body: dict[str, Any], deployments: Callable[[str], list]) -> float:
        """The most the request can cost (USD) over all its calls; `deployments(model)` gives a model's
        replicas (link.config.ModelDeployment). Reserved in the key's budget before the first call."""


@dataclass(frozen=True)
class CostBound:
    """The most one request to a policy can cost, in a form a client prices without the gateway's config
    (published on the policy's /v1/models card as `link.cost_bound`; `link eval run --max-cost` reserves it):
    at most `calls` model calls, each at the prices of the priciest of `models`, each reading the request's
    prompt plus `prompt_tokens_per_max_token` x the request's max tokens plus `extra_prompt_tokens` (earlier
    answers and instructions: the assumptions of the executor's own `max_cost_usd`), and each writing at most
    the request's max tokens.

    Raises:
        ValueError: calls < 1, no models, or a negative token count.
    """

    calls: int
    models: tuple[str, ...]
    prompt_tokens_per_max_token: int = 0
    extra_prompt_tokens: int = 0

    def __post_init__(self) -> None:
        if self.calls < 1 or not self.models or self.prompt_tokens_per_max_token < 0 or self.extra_prompt_tokens < 0:
            raise ValueError(f"invalid cost bound {self}")

    def to_dict(self) -> dict[str, Any]:
        return {"calls": self.calls, "models": list(self.models),
                "prompt_tokens_per_max_token": self.prompt_tokens_per_max_token,
                "extra_prompt_tokens": self.extra_prompt_tokens}


# Options every policy type takes beside its own; the gateway acts on them, not the policy:
#   capture_traces (bool, default false): record the policy's chat requests with `tools` as tool-call traces
#   (link/traces.py; GET /api/traces).
#   continue_on_failure (bool, default false): a stream one model answers whose backend dies after its first
#   byte is continued by the next candidate (link/proxy.py, link/stream_resume.py); refused by the types whose
#   plans make several calls (`CONTINUES_STREAMS` false: cascade, moa).
#   cache (object, default none): serve repeated requests from the response cache (link/response_cache.py; its
#   fields in link/policies/cache_options.py).
COMMON_OPTIONS = ("capture_traces", "continue_on_failure", "cache")
# What the types whose plans make several calls take (continue_on_failure false is accepted and means nothing).
MULTI_CALL_OPTIONS = ("capture_traces", "cache")


def without_stream_resume(kind: str, options: dict) -> dict:
    """`options` of a policy of several calls per answer, with a false `continue_on_failure` left out.

    Raises:
        PolicyError: `continue_on_failure` true (it applies to streams one model answers), naming the field.
    """
    if "continue_on_failure" not in options:
        return options
    if bool_option(options, "continue_on_failure", False):
        raise PolicyError(f"continue_on_failure applies to streams one model answers; a {kind!r} policy's "
                          "answer comes from several calls: remove the option", param="options.continue_on_failure")
    return {k: v for k, v in options.items() if k != "continue_on_failure"}


class Policy(ABC):
    """A named policy over public model names.

    Args:
        config: the policy's definition (name, type, models, options).
        model_names: the models the gateway serves; `check` validates `config` against them.
    Raises:
        PolicyError: the definition does not fit this type or names unknown models.
    """

    type: str = ""
    # The type's own option names (besides COMMON_OPTIONS); another key is refused. None (a user's subclass
    # that declares nothing): any key, still only finite numbers.
    OPTIONS: tuple[str, ...] | None = None
    # Whether the type's plans stream from one model, so that `continue_on_failure` can apply.
    CONTINUES_STREAMS: bool = True

    def __init__(self, config: PolicyConfig, model_names: tuple[str, ...] | list[str]):
        self.config = config
        self.check(config, tuple(model_names))

    @property
    def name(self) -> str:
        return self.config.name

    @classmethod
    def check(cls, config: PolicyConfig, model_names: tuple[str, ...]) -> None:
        """Validate a definition before it is stored or used: the name, the option keys (`OPTIONS`), finite
        numbers only, the models served. Subclasses check their options' values. Raises PolicyError."""
        check_name(config.name)
        options = config.options if cls.CONTINUES_STREAMS else without_stream_resume(config.type, config.options)
        common = COMMON_OPTIONS if cls.CONTINUES_STREAMS else MULTI_CALL_OPTIONS
        check_options(config.type, options, None if cls.OPTIONS is None else (*cls.OPTIONS, *common))
        unknown = [m for m in config.models if m not in model_names]
        if unknown:
            raise PolicyError(f"unknown model(s) {unknown}; the gateway serves {sorted(model_names)}", param="models")
        bool_option(config.options, "capture_traces", False)
        bool_option(config.options, "continue_on_failure", False)
        cache_options(config.options)

    @property
    def capture_traces(self) -> bool:
        """True when the policy's requests with `tools` are recorded as tool-call traces (`COMMON_OPTIONS`)."""
        return self.config.options.get("capture_traces") is True

    @property
    def continue_on_failure(self) -> bool:
        """True when a stream whose backend dies after its first byte is continued by the next candidate
        (`COMMON_OPTIONS`)."""
        return self.config.options.get("continue_on_failure") is True

    @property
    def cache(self) -> CacheOptions | None:
        """The policy's response-cache settings, None when it does not cache (`COMMON_OPTIONS`)."""
        if "_cache" not in self.__dict__:
            self._cache = cache_options(self.config.options)
        return self._cache

    @abstractmethod
    async def plan(self, request: PolicyRequest) -> Plan:
        """The ordered candidates for `request`; never raises for a valid request."""

    def cost_bound(self) -> CostBound | None:
        """The most a request can cost when a plan may make several calls (`CostBound`); None (the default):
        one call to one of the plan's models, which are among the policy's `models`."""
        return None

    def describe(self) -> dict[str, Any]:
        """The policy as JSON (for /v1/models and /api/policies), with its "cost_bound" when it has one."""
        out = {"name": self.name, "type": self.type, "models": list(self.config.models), "options": dict(self.config.options)}
        bound = self.cost_bound()
        if bound is not None:
            out["cost_bound"] = bound.to_dict()
        return out


def policy_class(type_: str) -> type[Policy]:
    """Import and return the class of policy type `type_`. Raises PolicyError for an unknown type."""
    try:
        module_name, _, class_name = POLICIES[type_].partition(":")
    except KeyError:
        raise PolicyError(f"unknown policy type {type_!r}; available: {', '.join(sorted(POLICIES))}", param="type") from None
    return getattr(importlib.import_module(module_name), class_name)


def make_policy(config: PolicyConfig, model_names: tuple[str, ...] | list[str]) -> Policy:
    """Build the policy of `config` against the served `model_names`. Raises PolicyError."""
    return policy_class(config.type)(config, model_names)


def policy_entry_problems(index: int, entry: Any, model_names: set[str]) -> list[str]:
    """The policy type's own checks (`Policy.check`: option keys and ranges, a router file) of the raw config entry
    `policies[index]`, against `model_names`; none for an entry whose fields are invalid (pydantic reports those).
    The `check_policy` of `link.config.load_config` (link/config_checks.py).

    `Policy.check` stops at its first problem, so an option it names ("options.layers") is set aside and the entry
    checked again, until it passes or a problem is not one option's: every option problem is reported in one pass.

    Returns:
        one line per problem, "policies[i].<param> (name 'x'): what to fix".
    """
    try:
        policy = PolicyConfig.model_validate(entry)
    except ValidationError:
        return []
    problems: list[str] = []
    reported: set[str] = set()
    options = dict(policy.options) if isinstance(policy.options, dict) else policy.options
    for _ in range(64):
        try:
            policy_class(policy.type).check(policy.model_copy(update={"options": options}), tuple(sorted(model_names)))
            break
        except PolicyError as exc:
            param = exc.param or "options"
            if param not in reported:  # an option set aside may be required: its absence is not a second problem
                message = exc.message.removeprefix(f"{param}: ").removeprefix(f"{param} ")
                problems.append(f"policies[{index}].{param} (name {policy.name!r}): {message}")
                reported.add(param)
            key = param.removeprefix("options.")
            if not (param.startswith("options.") and isinstance(options, dict) and key in options):
                break
            options = {k: v for k, v in options.items() if k != key}
    return problems
    try:
        policy_class(policy.type).check(policy, tuple(sorted(model_names)))
    except PolicyError as exc:
        param = exc.param or "options"
        message = exc.message.removeprefix(f"{param}: ").removeprefix(f"{param} ")
        return [f"policies[{index}].{param} (name {policy.name!r}): {message}"]
    return []
