"""Policies: which model(s) answer a request, in which order (see `base.py` for the interface).

    fixed       one model (every model name is also an implicit fixed policy of itself)   `fixed.py`
    fallback    an ordered list: the next model on an error or timeout before the first byte `fallback.py`

`store.py` resolves a name to a policy: model names, then the config file's policies, then the
database table `policy` (managed over `/api/policies`).
"""

from link.policies.base import Plan, Policy, PolicyRequest, make_policy, policy_class, register_policy

__all__ = ["Plan", "Policy", "PolicyRequest", "make_policy", "policy_class", "register_policy"]
