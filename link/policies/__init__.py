"""Policies: which model(s) answer a request, in which order (see `base.py` for the interface).

    fixed       one model (every model name is also an implicit fixed policy of itself)   `fixed.py`
    fallback    an ordered list: the next model on an error or timeout before the first byte `fallback.py`
    router      a trained router file: argmax predicted quality - lambda * expected cost     `router.py`
    cascade     a cheap model first, escalated when its answer scores below a threshold      `cascade.py`
    moa         Mixture-of-Agents: proposers, then an aggregator writes the answer          `moa.py`
    hybrid      a router choosing between the single models and a MoA plan                  `hybrid.py`

`store.py` resolves a name to a policy: model names, then the config file's policies, then the
database table `policy` (managed over `/api/policies`).
"""

from link.policies.base import Plan, PlanExecutor, Policy, PolicyRequest, make_policy, policy_class
from link.policies.registry import register_policy

__all__ = ["Plan", "PlanExecutor", "Policy", "PolicyRequest", "make_policy", "policy_class", "register_policy"]
