"""A bag of LightGBM boosters: several fitted on one training set with different seeds, predicting their mean.

    bag = BoosterBag.train(params, x, y, num_rounds=200, num_bags=5)    # seeds params["seed"] + 0..4
    p = bag.predict(x)                                                  # [N] mean of the boosters
    text = bag.to_state(); BoosterBag.from_state(text)                  # LightGBM text models, no pickle

With row and feature subsampling on (`bagging_fraction`, `feature_fraction`), each seed sees other rows and
columns, so the mean has less variance than one booster (bagging, Breiman 1996). The per-prompt signal of a
router is weak, which is where that pays: RouteLLM's MMLU pair, 5-fold CV (`benchmarks/routing_eval.py --part
routellm`), LightGBM router APGR 0.711 with one booster per model and 0.713 with five (subjects as suites 0.721 ->
0.724); RouterBench's AIQ is unchanged.
"""

from __future__ import annotations

from typing import Any

import numpy as np


# LightGBM's seeds: "seed" derives the others unless they are given, so a given one is moved along too
SEED_KEYS = ("seed", "bagging_seed", "feature_fraction_seed", "data_random_seed", "extra_seed", "drop_seed",
             "objective_seed")


def bag_params(params: dict[str, Any], b: int) -> dict[str, Any]:
    """`params` for the bag's booster `b`: "seed" (default 0) and every seed given explicitly, plus b."""
    out = {**params, "seed": int(params.get("seed", 0)) + b}
    out.update({k: int(params[k]) + b for k in SEED_KEYS[1:] if k in params})
    return out


class BoosterBag:
    """Boosters whose predictions are averaged.

    Args:
        boosters: fitted `lightgbm.Booster`s (at least one).
    Raises:
        ValueError: no booster.
    """

    def __init__(self, boosters: list[Any]):
        if not boosters:
            raise ValueError("a booster bag needs at least one booster")
        self.boosters = list(boosters)

    @classmethod
    def train(cls, params: dict[str, Any], x: np.ndarray, y: np.ndarray, *, num_rounds: int, num_bags: int = 1,
              categorical: list[int] | None = None) -> BoosterBag:
        """Fit `num_bags` boosters on x [N, F], labels y [N], seeds `bag_params(params, 0 .. num_bags - 1)`.

        Raises:
            ValueError: num_bags < 1.
        """
        import lightgbm

        if num_bags < 1:
            raise ValueError(f"num_bags must be at least 1, got {num_bags}")
        boosters = []
        for b in range(num_bags):
            dataset = lightgbm.Dataset(x, label=y, categorical_feature=categorical or "auto", free_raw_data=True,
                                       params={"verbose": -1})
            boosters.append(lightgbm.train(bag_params(params, b), dataset, num_boost_round=num_rounds))
        return cls(boosters)

    def predict(self, x: np.ndarray) -> np.ndarray:
        """[N] float64 mean prediction of the boosters on x [N, F]."""
        return np.mean([b.predict(x) for b in self.boosters], axis=0)

    def to_state(self) -> str | list[str]:
        """LightGBM text models: one string for a single booster (the format of files saved before bags), else
        a list of them."""
        texts = [b.model_to_string() for b in self.boosters]
        return texts[0] if len(texts) == 1 else texts

    @classmethod
    def from_state(cls, state: str | list[str]) -> BoosterBag:
        """The bag of `to_state`'s text models (a string or a list of strings)."""
        import lightgbm

        texts = [state] if isinstance(state, str) else list(state)
        return cls([lightgbm.Booster(model_str=t) for t in texts])
