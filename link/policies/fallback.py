"""`fallback`: an ordered list of models.

The gateway tries the first model; on an error or timeout before the first byte reached the client it
tries the next (after the current model's other replicas). Once bytes were sent, a failure ends the
stream with one OpenAI error event (`data: {"error": {...}}`) and `data: [DONE]`: a half-sent answer
cannot be retried without the client seeing two answers spliced together.
"""

from __future__ import annotations

from link.config import PolicyConfig
from link.policies.base import Plan, Policy, PolicyError, PolicyRequest


class FallbackPolicy(Policy):
    """Models in order of preference (at least two, each once)."""

    type = "fallback"
    OPTIONS = ()  # only the common ones (capture_traces)

    @classmethod
    def check(cls, config: PolicyConfig, model_names: tuple[str, ...]) -> None:
        if len(config.models) < 2:
            raise PolicyError("a 'fallback' policy needs at least two models in order of preference", param="models")
        if len(set(config.models)) != len(config.models):
            raise PolicyError(f"a 'fallback' policy names each model once, got {config.models}", param="models")
        super().check(config, model_names)

    async def plan(self, request: PolicyRequest) -> Plan:
        return Plan(self.name, list(self.config.models), {"type": self.type})
