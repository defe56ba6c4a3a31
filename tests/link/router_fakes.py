"""A fixed-score test router saved with `routers.base.save_router`, for the router, hybrid and cascade policy tests.

    path = save_table_router(tmp_path / "r.safetensors", ["small", "big"], cost_penalty=20.0)

Predicted quality per model comes from a table: one row for prompts that mention "math" (`MATH`), one for the
rest (`PLAIN`); the expected cost per model is the cost model's mean cost (`COSTS`; no prices, no fitted line).
"""

from __future__ import annotations

import numpy as np

from routers.base import Router, register_router, save_router
from routers.decision import CostModel
from routers.request import RoutingRequest

COSTS = {"small": 0.001, "big": 0.01, "down": 0.0005, "moa-col": 0.02}
PLAIN = {"small": 0.6, "big": 0.7, "down": 0.1, "moa-col": 0.75}  # small wins for lambda > 0.1 / 0.009 = 11.1
MATH = {"small": 0.2, "big": 0.9, "down": 0.1, "moa-col": 0.99}   # big wins for lambda < 0.7 / 0.009 = 77.8


class TableRouter(Router):
    """Fixed predicted quality: `math` for requests whose text (`RoutingRequest.text`) mentions "math", `plain`
    otherwise."""

    type = "table-test"

    def __init__(self, models, plain=None, math=None):
        super().__init__(models)
        self.plain = np.asarray(plain if plain is not None else np.zeros(len(models)), dtype=np.float64)
        self.math = np.asarray(math if math is not None else np.zeros(len(models)), dtype=np.float64)

    def fit(self, data, features):
        return self

    def predict(self, features, suites=None):
        raise NotImplementedError("scores come from `score`")

    def score(self, request):
        row = self.math if "math" in RoutingRequest.of(request).text else self.plain
        return dict(zip(self.models, map(float, row)))

    def state(self):
        return {"plain": self.plain, "math": self.math}, {}

    @classmethod
    def from_state(cls, arrays, meta):
        return cls(meta["models"], arrays["plain"], arrays["math"])


def save_table_router(path, models: list[str], cost_penalty: float = 20.0, plain: dict | None = None):
    """Save a TableRouter over `models` (its PLAIN row updated by `plain`) with the lambda rule at `cost_penalty`."""
    register_router(TableRouter.type, "tests.link.router_fakes:TableRouter")
    nan = np.full(len(models), np.nan)
    costs = CostModel(models, nan, nan, nan, np.array([COSTS[m] for m in models]))
    plain = {**PLAIN, **(plain or {})}
    router = TableRouter(models, [plain[m] for m in models], [MATH[m] for m in models])
    return save_router(router, path, costs=costs, decision={"rule": "lambda", "cost_penalty": cost_penalty})
