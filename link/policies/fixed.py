"""`fixed`: always the one model named. Every public model name is an implicit fixed policy of itself."""

from __future__ import annotations

from link.config import PolicyConfig
from link.policies.base import Plan, Policy, PolicyError, PolicyRequest


class FixedPolicy(Policy):
    """One model; its replicas are still retried before the first byte (the deployment pool's job)."""

    type = "fixed"
    OPTIONS = ()  # only the common ones (capture_traces)

    @classmethod
    def check(cls, config: PolicyConfig, model_names: tuple[str, ...]) -> None:
        if len(config.models) != 1:
            raise PolicyError(f"a 'fixed' policy names exactly one model, got {len(config.models)}", param="models")
        super().check(config, model_names)

    async def plan(self, request: PolicyRequest) -> Plan:
        return Plan(self.name, [self.config.models[0]], {"type": self.type})


def implicit_fixed(model_name: str, model_names: tuple[str, ...]) -> FixedPolicy:
    """The fixed policy a bare model name stands for (named after the model)."""
    return FixedPolicy(PolicyConfig(name=model_name, type="fixed", models=[model_name]), model_names)
