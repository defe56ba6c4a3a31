"""What an offline evaluation measures and how (`EvalSettings`), shared by the split evaluation
(`routers.offline.evaluate`), the measurement of one router (`routers.offline.measure`) and the repeated
evaluations (`routers.offline.crossval`).

    settings = EvalSettings(types=("knn", "lgbm"), baselines=("random", "oracle"), cascade=False)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from routers.offline.metrics import ROUTELLM_NUM_THRESHOLDS

LEARNED_TYPES = ("knn", "lgbm", "mf")
BASELINES = ("random", "best-per-task", "length", "oracle")


@dataclass(frozen=True)
class EvalSettings:
    """What to evaluate and how.

    Attributes:
        types: learned router types (registry names).
        baselines: any of BASELINES.
        options: router type -> constructor options.
        num_lambdas: lambda grid size per router (`calibration.lambda_grid`).
        pair: (strong, weak) model names for APGR/CPT; default: the two single models when there are two.
        num_thresholds: RouteLLM's threshold count (10).
        seed: seeds the random baseline and any router option "seed" not given.
        keep_curves: keep each router's curve in the report (the plot needs it).
        cascade: also measure each learned router's cascade and the perfect-judge cascade.
        cascade_models: the cascade's steps, cheapest first (default: the training frontier).
        ensembles: columns of multi-call policies (e.g. "link/moa"): left to the "hybrid:<type>" entries.
        answer_check: with cascade and recorded answers, also the cascade scored by an answer checker fitted
            on each step's training answers ("cascade:answer"; options["answer"]: `AnswerChecker` arguments;
            the embeddings of prompts and answers come from the featurizer's encoder).
    """

    types: tuple[str, ...] = LEARNED_TYPES
    baselines: tuple[str, ...] = BASELINES
    options: dict[str, dict[str, Any]] = field(default_factory=dict)
    num_lambdas: int = 256
    pair: tuple[str, str] | None = None
    num_thresholds: int = ROUTELLM_NUM_THRESHOLDS
    seed: int = 0
    keep_curves: bool = True
    cascade: bool = True
    cascade_models: tuple[str, ...] | None = None
    ensembles: tuple[str, ...] = ()
    answer_check: bool = False

    def __post_init__(self) -> None:
        unknown = set(self.baselines) - set(BASELINES)
        if unknown:
            raise ValueError(f"unknown baselines {sorted(unknown)}; baselines: {', '.join(BASELINES)}")
        if self.cascade_models is not None and len(self.cascade_models) < 2:
            raise ValueError(f"a cascade needs at least two models, got {list(self.cascade_models)}")
