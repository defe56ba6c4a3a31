"""benchmarks/routing_agreement.py (routing_eval.py --part agreement): unanimity cascades replayed by hand on four prompts."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from routers.offline.data import RoutingData

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from routing_agreement import agreement_cascades, answer_letter  # noqa: E402


def test_answer_letter_reads_the_first_standalone_choice():
    assert answer_letter("['B']") == "B"
    assert answer_letter("['A)']") == "A"
    assert answer_letter("Answer: D.") == "D"
    assert answer_letter("no choice in here") is None
    assert answer_letter(None) is None


def _data() -> RoutingData:
    # models a, b and the reference; prompts 0-2 multiple choice, prompt 3 a code task
    responses = [["['B']", "['B)']", "A"],
                 ["['A']", "['C']", "['C']"],
                 ["I cannot answer", "['A']", "['A']"],
                 ["def f(): pass", "def f(): return 1", "def f(): return 1"]]
    scores = [[1, 1, 0], [0, 1, 1], [0, 1, 1], [0, 1, 1]]
    costs = [[1, 2, 10]] * 4
    return RoutingData([f"p{i}" for i in range(4)], [f"q{i}" for i in range(4)], ["mc", "mc", "mc", "code"],
                       ["a", "b", "ref"], scores, costs, responses=np.array(responses, dtype=object))


def test_unanimity_cascades_by_hand():
    sets = {tuple(s["models"]): s for s in agreement_cascades(_data(), "ref", ["a", "b"], {"mc"})}
    assert set(sets) == {("a",), ("b",), ("a", "b")}
    # a alone: p0 kept (right, 1), p1 kept (wrong, 1), p2 has no letter -> ref (right, 1 + 10), p3 -> b (right, 2)
    assert sets[("a",)]["accuracy"] == pytest.approx(0.75)
    assert sets[("a",)]["cost_ratio"] == pytest.approx((1 + 1 + 11 + 2) / 4 / 10)
    assert sets[("a",)]["escalated"] == pytest.approx(0.25)
    # b alone answers every prompt right at 2
    assert (sets[("b",)]["accuracy"], sets[("b",)]["cost_ratio"], sets[("b",)]["escalated"]) == pytest.approx((1.0, 0.2, 0.0))
    # a and b agree on p0 only ("B" and "B)"): p1 and p2 pay both and the reference
    both = sets[("a", "b")]
    assert both["accuracy"] == pytest.approx(1.0)
    assert both["cost_ratio"] == pytest.approx((3 + 13 + 13 + 2) / 4 / 10)
    assert both["escalated"] == pytest.approx(0.5)


def test_an_unknown_reference_is_refused():
    with pytest.raises(KeyError):
        agreement_cascades(_data(), "gpt-4", ["a"], {"mc"})
