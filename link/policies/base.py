"""The policy interface: given a request and the models on offer, an ordered plan of candidate models.

    policy = make_policy(PolicyConfig(name="cheap-first", type="fallback", models=["a", "b"]), model_names)
    plan = await policy.plan(PolicyRequest(endpoint="chat", body=body, model_names=model_names))
    plan.models     # ["a", "b"]: the gateway tries them in order (next one only before the first byte)
    plan.decision   # JSON-able details, stored in the request log's `decision` column

A policy type is a subclass of `Policy` registered by name ("fixed", "fallback"; the router issue
registers "router"), built by `make_policy`, which imports the type's module only when first needed.
A subclass implements `plan` and may tighten `check` (called when a policy is created or loaded).
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Literal

from link.config import PolicyConfig


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
        models: public model names, first choice first; never empty.
        decision: JSON-able details (type, scores, thresholds...) for the request log.
    """

    policy: str
    models: list[str]
    decision: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.models:
            raise ValueError(f"policy {self.policy!r} planned no model")


class PolicyError(ValueError):
    """An invalid policy definition. `param` names the offending field ("models", "type", "options")."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.message, self.param = message, param


class Policy(ABC):
    """A named policy over public model names.

    Args:
        config: the policy's definition (name, type, models, options).
        model_names: the models the gateway serves; `check` validates `config` against them.
    Raises:
        PolicyError: the definition does not fit this type or names unknown models.
    """

    type: str = ""

    def __init__(self, config: PolicyConfig, model_names: tuple[str, ...] | list[str]):
        self.config = config
        self.check(config, tuple(model_names))

    @property
    def name(self) -> str:
        return self.config.name

    @classmethod
    def check(cls, config: PolicyConfig, model_names: tuple[str, ...]) -> None:
        """Validate a definition before it is stored or used. Raises PolicyError."""
        unknown = [m for m in config.models if m not in model_names]
        if unknown:
            raise PolicyError(f"unknown model(s) {unknown}; the gateway serves {sorted(model_names)}", param="models")

    @abstractmethod
    async def plan(self, request: PolicyRequest) -> Plan:
        """The ordered candidates for `request`; never raises for a valid request."""

    def describe(self) -> dict[str, Any]:
        """The policy as JSON (for /v1/models and /api/policies)."""
        return {"name": self.name, "type": self.type, "models": list(self.config.models), "options": dict(self.config.options)}


# type -> "module:Class"; a module is imported when a policy of its type is first built.
POLICIES: dict[str, str] = {
    "fixed": "link.policies.fixed:FixedPolicy",
    "fallback": "link.policies.fallback:FallbackPolicy",
}


def register_policy(type_: str, target: str) -> None:
    """Register a policy class by "module:Class" under `type_` (the config's and API's `type`)."""
    POLICIES[type_] = target


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
