"""routers.signals: hand-checked entropy, confidence, agreement, checks and the feature vector.

    .venv/bin/python -m pytest -q tests/routers/test_signals.py
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from routers.signals import (SIGNAL_FEATURE_NAMES, agreement, answer_checks, answer_signals, confidence,
                             signal_vector, top_k_entropy)


def test_top_k_entropy_counts_the_rest_as_one_outcome():
    # p = 1/2, 1/4 and the rest 1/4: H = 1/2 ln 2 + 1/4 ln 4 + 1/4 ln 4 = 1.5 ln 2
    assert top_k_entropy({"a": math.log(0.5), "b": math.log(0.25)}) == pytest.approx(1.5 * math.log(2))
    # the whole mass in the top-k: the exact entropy of a fair coin
    assert top_k_entropy({"a": math.log(0.5), "b": math.log(0.5)}) == pytest.approx(math.log(2))
    assert top_k_entropy({"a": 0.0}) == 0.0
    with pytest.raises(ValueError):
        top_k_entropy({})


def test_confidence_of_an_answer():
    conf = confidence([-0.1, -2.0, -0.3], [{"x": -0.1}, {"y": math.log(0.5), "z": math.log(0.5)}, {}])
    assert conf.tokens == 3
    assert conf.logprob_mean == pytest.approx(-0.8) and conf.logprob_min == -2.0
    # entropies over the positions with alternatives: exp(-0.1) and its rest (1 - 0.904837), then ln 2
    p = math.exp(-0.1)
    assert conf.entropy_mean == pytest.approx((-(p * math.log(p)) - (1 - p) * math.log(1 - p) + math.log(2)) / 2)
    assert confidence(None) is None and confidence([]) is None
    assert confidence([-1.0]).entropy_mean is None
    assert confidence([-math.inf]).logprob_min == -1e4          # finite


def test_agreement_is_the_share_of_samples_that_agree():
    assert agreement("18", ["18", "17", "18"]) == pytest.approx(2 / 3)
    assert agreement("18", ["18", None]) == 0.5                  # a sample without an answer disagrees
    assert agreement(None, ["18"]) is None and agreement("18", []) is None


def test_answer_checks_recheck_the_arithmetic():
    checks = answer_checks("16 - 3 = 13 eggs, then 13 - 4 = 8. The answer is 8")
    assert checks == {"has_final_answer": 1.0, "arithmetic_steps": 2.0, "arithmetic_wrong": 1.0}
    assert answer_checks("no numbers here")["has_final_answer"] == 0.0


def test_signals_and_their_vector_leave_missing_signals_missing():
    with_logprobs = answer_signals("It is 4", [-0.5, -1.5], key="4", sample_keys=["4", "5"], sample_scores=[1, 0],
                                   samples_cost_usd=0.002)
    assert with_logprobs["logprob_mean"] == -1.0 and with_logprobs["agreement"] == 0.5
    assert with_logprobs["sample_scores"] == [1.0, 0.0] and with_logprobs["samples_cost_usd"] == 0.002
    vector = signal_vector(with_logprobs)
    names = list(SIGNAL_FEATURE_NAMES)
    assert vector.shape == (len(names),)
    assert vector[names.index("logprob_mean")] == -1.0 and vector[names.index("log_tokens")] == pytest.approx(math.log(3))
    assert np.isnan(vector[names.index("entropy_mean")])         # no alternatives were asked for
    provider = signal_vector(answer_signals("It is 4", None, key="4"))   # no logprobs, no samples
    assert np.isnan(provider[[names.index(n) for n in ("logprob_mean", "logprob_min", "log_tokens", "agreement")]]).all()
    assert provider[names.index("has_final_answer")] == 1.0
    assert np.isnan(signal_vector(None)).all()
