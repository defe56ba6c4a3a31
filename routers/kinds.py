"""The two kinds of prompt (its request offered tools, or not) and the evidence rule of the learned routers.

    kinds = labelled_kinds(data.scores, features.has_tools)              # [M, 2] bool, at fit time
    kinds = np.vstack([kinds, labelled_kinds(column[:, None], tools)])    # add_model appends a row
    quality = apply_evidence_rule(quality, query.has_tools, kinds, unseen_quality)      # at predict time

A model with no labelled prompt of a query's kind has no evidence there and is predicted `unseen_quality`
(0: it fails), so a model added from tool-calling prompts only does not draw plain traffic, and the reverse.
When no model has labels of the query's kind the predictions stand. Before the rule, kNN predicted a
fine-tune added from BFCL traces only from its tool-call accuracy on plain prompts too, and its cost model,
fitted on short tool calls, made it the cheapest MMLU answer: 74.5% of MMLU went to it.

A router saves the array as "model_kinds" (`kinds_state`); a file written before it existed loads with every
model labelled on both kinds (`kinds_from_state`), so it predicts exactly as before. kNN derives the kinds
from its bank of prompts instead.
"""

from __future__ import annotations

from typing import Any

import numpy as np

KINDS = (False, True)           # the columns of a kinds array: prompts without tools, with tools
STATE_KEY = "model_kinds"


def check_unseen_quality(unseen_quality: float) -> float:
    """`unseen_quality` as a float. Raises ValueError outside [0, 1]."""
    if not 0 <= unseen_quality <= 1:
        raise ValueError(f"unseen_quality must be in [0, 1], got {unseen_quality}")
    return float(unseen_quality)


def labelled_kinds(scores: np.ndarray, has_tools: np.ndarray) -> np.ndarray:
    """[M, 2] bool: whether each model has a labelled (finite) score on a prompt without tools (column 0) and
    on one with tools (column 1). `scores` [P, M] (NaN: no label), `has_tools` [P] bool.

    Raises:
        ValueError: `has_tools` is not [P].
    """
    labelled = np.isfinite(np.asarray(scores, dtype=np.float64))
    tools = np.asarray(has_tools, dtype=bool)
    if tools.shape != labelled.shape[:1]:
        raise ValueError(f"has_tools {tools.shape} for {labelled.shape[0]} prompts")
    return np.stack([labelled[tools == kind].any(axis=0) for kind in KINDS], axis=1)


def apply_evidence_rule(quality: np.ndarray, has_tools: np.ndarray, kinds: np.ndarray,
                        unseen_quality: float) -> np.ndarray:
    """`quality` [N, M] (a new float64 array) with model m's prediction set to `unseen_quality` on the queries
    of a kind m has no labels of, unless no model has labels of that kind. `has_tools` [N] bool per query,
    `kinds` [M, 2] from `labelled_kinds`.

    Raises:
        ValueError: shapes disagree.
    """
    out = np.array(quality, dtype=np.float64)
    tools = np.asarray(has_tools, dtype=bool)
    kinds = np.asarray(kinds, dtype=bool)
    if out.ndim != 2 or tools.shape != out.shape[:1] or kinds.shape != (out.shape[1], len(KINDS)):
        raise ValueError(f"quality {out.shape}, has_tools {tools.shape} and kinds {kinds.shape} disagree")
    for column, kind in enumerate(KINDS):
        if kinds[:, column].any():
            out[np.ix_(tools == kind, ~kinds[:, column])] = unseen_quality
    return out


def kinds_state(kinds: np.ndarray) -> dict[str, np.ndarray]:
    """The arrays a router saves for `kinds` [M, 2] bool: {"model_kinds": [M, 2] uint8}."""
    return {STATE_KEY: np.asarray(kinds, dtype=bool).astype(np.uint8)}


def kinds_from_state(arrays: dict[str, Any], num_models: int) -> np.ndarray:
    """[M, 2] bool saved as "model_kinds" (uint8), or all True for a file written before it existed."""
    saved = arrays.get(STATE_KEY)
    if saved is None:
        return np.ones((num_models, len(KINDS)), dtype=bool)
    return np.asarray(saved).astype(bool).reshape(num_models, len(KINDS))
