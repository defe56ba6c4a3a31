"""`routing_eval.py --part agreement`: whether a cascade reading the cheap models' answers could reach
RouterBench's cost targets, judged with hindsight on the test rows.

Every set of cheap models answers each multiple-choice prompt (ARC, Winogrande); their answer is kept when all
of them give the same letter, else the reference model (gpt-4) answers too; every model asked is paid. Other
prompts (MBPP) go to the single model best on that task's rows. The best set, picked on the rows themselves,
bounds what such unanimity cascades reach on this data.
"""

from __future__ import annotations

import itertools
import re
from typing import Any

import numpy as np

LETTER = re.compile(r"\b([A-D])\b")
MULTIPLE_CHOICE = frozenset({"arc-challenge", "winogrande"})


def answer_letter(response: Any) -> str | None:
    """The first standalone capital A-D of a recorded answer (RouterBench's multiple-choice answers are
    stringified lists such as "['B']" or "['A)']"), None when it has none."""
    found = None if response is None else LETTER.search(str(response))
    return found.group(1) if found else None


def agreement_cascades(test, reference: str, cheap: list[str], multiple_choice: set[str]) -> list[dict[str, Any]]:
    """Every non-empty subset of `cheap` as a unanimity cascade on `test` (RoutingData with responses): on a
    prompt of a `multiple_choice` suite every model of the subset is paid, and the first one's recorded score
    counts when all of them give the same letter (`answer_letter`), else `reference` is paid too and its score
    counts; a prompt of another suite goes to the model best on that suite's rows (accuracy, then cost).

    Returns: [{"models", "accuracy", "cost_ratio" (mean cost / the reference's), "escalated" (share of
    prompts sent on to the reference)}], one per subset. Raises: KeyError for a model `test` lacks."""
    col = {m: j for j, m in enumerate(test.models)}
    ref = col[reference]
    letters = np.array([[answer_letter(r) for r in row] for row in test.responses], dtype=object)
    suites = np.asarray(test.suites)
    choice = np.isin(suites, sorted(multiple_choice))
    other_score, other_cost = np.zeros(test.num_prompts), np.zeros(test.num_prompts)
    for suite in np.unique(suites[~choice]):
        rows = suites == suite
        best = np.lexsort((test.costs[rows].mean(axis=0), -test.scores[rows].mean(axis=0)))[0]
        other_score[rows], other_cost[rows] = test.scores[rows, best], test.costs[rows, best]
    out = []
    for size in range(1, len(cheap) + 1):
        for subset in itertools.combinations(cheap, size):
            cols = [col[m] for m in subset]
            first = letters[:, cols[0]]
            agree = np.array([f is not None for f in first]) & np.all(letters[:, cols] == first[:, None], axis=1)
            score = np.where(agree, test.scores[:, cols[0]], test.scores[:, ref])
            cost = test.costs[:, cols].sum(axis=1) + np.where(agree, 0.0, test.costs[:, ref])
            score, cost = np.where(choice, score, other_score), np.where(choice, cost, other_cost)
            out.append({"models": list(subset), "accuracy": float(score.mean()),
                        "cost_ratio": float(cost.mean() / test.costs[:, ref].mean()),
                        "escalated": float(np.mean(choice & ~agree))})
    return out


def agreement_bound(test, reference: str, cost_ratio_target: float, accuracy_target: float) -> dict[str, Any]:
    """The unanimity cascades of every set of the models costing under a quarter of `reference` on `test`, and
    the best of them for each target: the cheapest reaching the reference's accuracy and `accuracy_target`,
    the most accurate at <= 25% and <= `cost_ratio_target` of the reference's cost (None where no set does)."""
    ref_cost = test.costs[:, test.models.index(reference)].mean()
    cheap = [m for j, m in enumerate(test.models) if m != reference and test.costs[:, j].mean() < ref_cost / 4]
    sets = agreement_cascades(test, reference, cheap, set(MULTIPLE_CHOICE))
    ref_accuracy = float(np.mean(test.scores[:, test.models.index(reference)]))

    def cheapest(accuracy: float) -> dict[str, Any] | None:
        return min((s for s in sets if s["accuracy"] >= accuracy), key=lambda s: s["cost_ratio"], default=None)

    def best(ratio: float) -> dict[str, Any] | None:
        return max((s for s in sets if s["cost_ratio"] <= ratio), key=lambda s: s["accuracy"], default=None)

    return {"reference_accuracy": ref_accuracy, "cheap": cheap, "num_sets": len(sets),
            "cheapest_at_reference_accuracy": cheapest(ref_accuracy),
            "cheapest_at_accuracy_target": cheapest(accuracy_target),
            "best_at_25pct_cost": best(0.25), "best_at_cost_ratio_target": best(cost_ratio_target)}


def print_agreement(result: dict[str, Any], cost_ratio_target: float, accuracy_target: float) -> None:
    print(f"\nAnswer-agreement cascades on RouterBench's test rows, with hindsight ({result['num_sets']} sets of "
          f"the {len(result['cheap'])} models under a quarter of gpt-4's cost)")

    def line(label: str, s: dict[str, Any] | None) -> None:
        text = "none" if s is None else (f"accuracy {s['accuracy']:.4f} at {s['cost_ratio']:.3f} of gpt-4's cost, "
                                         f"{s['escalated']:.1%} escalated: " + " + ".join(m.split('/')[-1] for m in s["models"]))
        print(f"  {label:44s}{text}")

    line(f"cheapest reaching gpt-4's accuracy {result['reference_accuracy']:.4f}", result["cheapest_at_reference_accuracy"])
    line(f"cheapest reaching {accuracy_target:g}", result["cheapest_at_accuracy_target"])
    line("most accurate at <= 25% of gpt-4's cost", result["best_at_25pct_cost"])
    line(f"most accurate at <= {cost_ratio_target:.0%} of gpt-4's cost", result["best_at_cost_ratio_target"])
    print(f"(targets: gpt-4's accuracy at <= {cost_ratio_target} of its cost, >= {accuracy_target} at <= 25%)")
