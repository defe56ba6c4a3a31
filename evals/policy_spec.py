"""Build a routing policy from a command-line spec, over the models of an outcome table.

    build_policy("gpt-4-1106-preview", models)                 # a model name: the `fixed` policy of it
    build_policy("fallback:claude-instant-v1,claude-v2", models)   # "<type>:<model>,<model>..."
    build_policy("cheap", models, policy_type="fallback", models=["a", "b"])   # --policy-type/--models
    build_policy("mypkg.routing:TaskRouter", models, options={"path": "r.json"})   # a user's Policy subclass

Every policy is built with `link.policies.base.make_policy` (or, for "module:Class", by calling the
class the same way), so anything the gateway serves replays unchanged.
"""

from __future__ import annotations

import importlib
from typing import Any

from pydantic import ValidationError

from link.config import PolicyConfig
from link.policies.base import POLICIES, Policy, PolicyError, make_policy
from link.policies.fixed import implicit_fixed


def policy_config(name: str, type_: str, models: list[str], options: dict[str, Any] | None = None) -> PolicyConfig:
    """A `PolicyConfig`, validated when `type_` is a registered policy type (`register_policy`). Any other
    type (a "module:Class" spec) is built unvalidated; its class's `check` still runs.
    Raises PolicyError with pydantic's first message."""
    fields = {"name": name, "type": type_, "models": models, "options": dict(options or {})}
    if type_ not in POLICIES:
        return PolicyConfig.model_construct(**fields)
    try:
        return PolicyConfig(**fields)
    except ValidationError as exc:
        error = exc.errors()[0]
        raise PolicyError(f"policy {name!r}: {error['msg']}", param=str(error["loc"][0]) if error["loc"] else None) from None


def _import_class(spec: str) -> type[Policy]:
    module_name, _, class_name = spec.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise PolicyError(f"cannot import policy class {spec!r}: {exc}", param="type") from None
    if not (isinstance(cls, type) and issubclass(cls, Policy)):
        raise PolicyError(f"{spec!r} is not a subclass of link.policies.base.Policy", param="type")
    return cls


def build_policy(spec: str, model_names: tuple[str, ...] | list[str], *, policy_type: str | None = None,
                 models: list[str] | None = None, options: dict[str, Any] | None = None) -> Policy:
    """The policy a spec names, checked against `model_names` (the outcome table's models).

    Args:
        spec: with `policy_type`: the policy's name. Otherwise, tried in order: a model name (its
            `fixed` policy); "<type>:<m1>,<m2>..." with a registered type ("fallback:a,b"); "module:Class"
            naming a `Policy` subclass (named after the class; `models` default to all of `model_names`).
        policy_type: a registered type ("fixed", "fallback", or one added by `register_policy`).
        models: the policy's models (default: all of `model_names`).
        options: the policy's type-specific options.
    Raises:
        PolicyError: an unknown spec, type or model, or a definition its type refuses.
    """
    names = tuple(model_names)
    if policy_type is not None:
        return make_policy(policy_config(spec, policy_type, models or list(names), options), names)
    if spec in names:
        return implicit_fixed(spec, names)
    head, sep, tail = spec.partition(":")
    if sep and head in POLICIES:
        listed = [m.strip() for m in tail.split(",") if m.strip()]
        return make_policy(policy_config(spec, head, listed, options), names)
    if sep and tail.isidentifier():
        cls = _import_class(spec)
        return cls(policy_config(tail, cls.type or tail, models or list(names), options), names)
    shown = ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")
    raise PolicyError(f"unknown policy {spec!r}: not a model of the table ({shown}), '<type>:<model>,<model>' "
                      f"with a type in {sorted(POLICIES)}, nor 'module:Class'", param="model")
