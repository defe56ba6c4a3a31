"""A simple learned policy for the replay tests: per task, the model with the best mean training score.

    link eval replay routerbench:test --policy tests.evals.best_per_task:BestPerTask --options '{"data_dir": "../shared/data"}'
"""

from __future__ import annotations

from pathlib import Path

from evals.outcomes import OutcomeTable
from evals.recorded import load_routerbench
from link.config import PolicyConfig
from link.policies.base import Plan, Policy, PolicyRequest


def rank_per_suite(train: OutcomeTable, models: list[str]) -> dict[str, list[str]]:
    """suite -> models by mean training score on that suite, best first (ties: name)."""
    scores: dict[tuple[str, str], list[float]] = {}
    for o in train:
        scores.setdefault((o.suite, o.model), []).append(o.score)
    suites = {s for s, _ in scores}
    mean = {key: sum(v) / len(v) for key, v in scores.items()}
    return {s: sorted(models, key=lambda m: (-mean.get((s, m), -1.0), m)) for s in suites}


class BestPerTask(Policy):
    """Plans, for the request's `metadata.suite`, every model by its mean training score on that suite
    (the first is the pick, the rest are fallbacks). Options: data_dir, split (default "train")."""

    type = "router"

    def __init__(self, config: PolicyConfig, model_names, train: OutcomeTable | None = None):
        super().__init__(config, model_names)
        if train is None:
            train = load_routerbench(Path(config.options["data_dir"]), config.options.get("split", "train"))
        self.ranking = rank_per_suite(train, list(config.models))

    async def plan(self, request: PolicyRequest) -> Plan:
        suite = request.body.get("metadata", {}).get("suite", "")
        return Plan(self.name, list(self.ranking.get(suite, self.config.models)), {"type": self.type, "suite": suite})
