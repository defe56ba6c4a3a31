"""The policy types by name: type -> "module:Class", the class imported when a policy of the type is first built.

    POLICIES["fallback"]                                  # "link.policies.fallback:FallbackPolicy"
    register_policy("mine", "mypkg.routing:MyPolicy")     # a user's own type

Read by the config's check of a policy's `type` (`link.config.PolicyConfig`) and by `link.policies.base`
(`policy_class`, `make_policy`); this module imports neither, so the config and the policy interface do not
import each other.
"""

from __future__ import annotations

# type -> "module:Class"; a module is imported when a policy of its type is first built.
POLICIES: dict[str, str] = {
    "fixed": "link.policies.fixed:FixedPolicy",
    "fallback": "link.policies.fallback:FallbackPolicy",
    "router": "link.policies.router:RouterPolicy",
    "cascade": "link.policies.cascade:CascadePolicy",
    "moa": "link.policies.moa:MoAPolicy",
    "hybrid": "link.policies.hybrid:HybridPolicy",
}


def register_policy(type_: str, target: str) -> None:
    """Register a policy class by "module:Class" under `type_` (the config's and API's `type`)."""
    POLICIES[type_] = target
