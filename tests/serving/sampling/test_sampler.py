"""Tests for `serving.sampling.sampler`: the draws' empirical distributions, greedy ties, seeds and RNG isolation,
and logprobs.

Expected values are computed independently (by hand or with numpy). Statistical tests use fixed seeds, so
they are deterministic; their tolerances are still several standard deviations wide so they would pass
for any seed.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from serving.sampling.params import SamplingParams
from serving.sampling.sampler import Sampler, compute_logprobs

# A 5-token distribution with distinct, hand-friendly probabilities.
PROBS5 = [0.4, 0.25, 0.2, 0.1, 0.05]
LOGITS5 = torch.tensor(PROBS5, dtype=torch.float64).log().to(torch.float32)
INF = float("-inf")


def _draws(params: SamplingParams, logits: torch.Tensor, n: int, **kw) -> np.ndarray:
    sampler = Sampler(params)
    return np.array([sampler.sample(logits, **kw) for _ in range(n)])


def _freqs(draws: np.ndarray, vocab_size: int) -> np.ndarray:
    return np.bincount(draws, minlength=vocab_size) / len(draws)


def _np_softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


# ---------------------------------------------------------------------------------------------
# Sampler: empirical distributions (fixed seeds)
# ---------------------------------------------------------------------------------------------

FLAT10 = torch.linspace(0.5, 0.0, 10)  # nearly uniform over 10 tokens, descending


def test_top_k_never_samples_outside_top_k():
    draws = _draws(SamplingParams(top_k=2, seed=0), FLAT10, 2000)
    assert set(draws.tolist()) == {0, 1}
    # without top-k, tokens outside the top 2 are drawn (~77% of the time)
    draws = _draws(SamplingParams(top_k=0, seed=0), FLAT10, 2000)
    assert (draws >= 2).mean() > 0.5


def test_top_p_empirical_distribution_is_renormalized_nucleus():
    draws = _draws(SamplingParams(top_p=0.6, seed=1), LOGITS5, 3000)
    freqs = _freqs(draws, 5)
    np.testing.assert_allclose(freqs, [0.4 / 0.65, 0.25 / 0.65, 0, 0, 0], atol=0.03)


def test_min_p_empirical_distribution():
    draws = _draws(SamplingParams(min_p=0.45, seed=2), LOGITS5, 3000)
    np.testing.assert_allclose(
        _freqs(draws, 5), [0.4 / 0.85, 0.25 / 0.85, 0.2 / 0.85, 0, 0], atol=0.03
    )


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_temperature_empirical_distribution(temperature):
    logits = torch.tensor([1.0, 0.5, 0.0, -0.5])
    expected = _np_softmax(logits.numpy().astype(np.float64) / temperature)
    freqs = _freqs(_draws(SamplingParams(temperature=temperature, seed=3), logits, 5000), 4)
    np.testing.assert_allclose(freqs, expected, atol=0.03)
    # the prediction is distinguishable: at T != 1 it differs from softmax(logits) by > 0.1
    if temperature != 1.0:
        assert np.abs(expected - _np_softmax(logits.numpy().astype(np.float64))).max() > 0.1


def test_penalties_change_sampled_distribution():
    # Token 0 is strongly preferred until a presence penalty of 2 (x2 via repetition 4) flips it.
    logits = torch.tensor([2.0, 1.5, -5.0])
    plain = _freqs(_draws(SamplingParams(seed=4), logits, 1000, output_ids=[0]), 3)
    assert plain[0] > 0.55
    pen = _freqs(
        _draws(SamplingParams(seed=4, presence_penalty=2.0), logits, 1000, output_ids=[0]), 3
    )
    # softmax([0, 1.5, -5]) = [0.182, 0.816, 0.002]
    np.testing.assert_allclose(pen, [0.182, 0.816, 0.002], atol=0.04)


def test_greedy_is_argmax_after_penalties():
    logits = torch.tensor([2.0, 1.9, -1.0, 0.0])
    greedy = Sampler(SamplingParams(temperature=0.0))
    assert all(greedy.sample(logits) == 0 for _ in range(20))
    # repetition 1.5 on token 0: 2/1.5 = 1.33 < 1.9
    rep = Sampler(SamplingParams(temperature=0.0, repetition_penalty=1.5))
    assert rep.sample(logits, prompt_ids=[0], output_ids=[]) == 1
    freq = Sampler(SamplingParams(temperature=0.0, frequency_penalty=0.05))
    assert freq.sample(logits, [], [0, 0, 0]) == 1  # 2 - 0.15 = 1.85 < 1.9
    assert freq.sample(logits, [], [0]) == 0  # 2 - 0.05 = 1.95 > 1.9
    # top_k=1 is greedy even at high temperature
    k1 = Sampler(SamplingParams(top_k=1, temperature=5.0, seed=0))
    assert all(k1.sample(FLAT10) == 0 for _ in range(50))


def test_greedy_tie_breaks_to_lowest_id_and_returns_int():
    token = Sampler(SamplingParams(temperature=0)).sample(torch.tensor([0.0, 3.0, 3.0]))
    assert token == 1 and type(token) is int


def test_tiny_temperature_behaves_like_greedy():
    # 30 / 1e-40 and 29 / 1e-40 both overflow float32 to +inf; the negative row overflows to -inf.
    for logits in (torch.tensor([29.0, 30.0, 0.0]), torch.tensor([-30.0, -29.0, -31.0])):
        params = [SamplingParams(temperature=1e-40, seed=s) for s in range(10)]
        assert {Sampler(p).sample(logits) for p in params} == {1}
    # a small but representable temperature still samples (almost surely the top token)
    assert Sampler(SamplingParams(temperature=1e-3, seed=0)).sample(torch.tensor([0.0, 1.0])) == 1


def test_sample_rejects_bad_logits():
    s = Sampler(SamplingParams(seed=0))
    with pytest.raises(ValueError, match="NaN"):
        s.sample(torch.tensor([0.0, float("nan")]))
    with pytest.raises(ValueError, match="-inf"):
        s.sample(torch.tensor([INF, INF]))
    with pytest.raises(ValueError, match="shape"):
        s.sample(torch.zeros(2, 3))


# ---------------------------------------------------------------------------------------------
# Sampler: seeds and RNG isolation
# ---------------------------------------------------------------------------------------------


def test_same_seed_same_draws_different_seed_differs():
    a = _draws(SamplingParams(seed=1234), FLAT10, 50)
    b = _draws(SamplingParams(seed=1234), FLAT10, 50)
    c = _draws(SamplingParams(seed=1235), FLAT10, 50)
    np.testing.assert_array_equal(a, b)
    assert (a != c).any()
    assert Sampler(SamplingParams(seed=1234)).seed == 1234


def test_seeded_sampler_ignores_global_rng_and_other_requests():
    reference = _draws(SamplingParams(seed=99), FLAT10, 50)

    torch.manual_seed(0)
    s = Sampler(SamplingParams(seed=99))
    other = Sampler(SamplingParams(seed=5))
    unseeded = Sampler(SamplingParams())
    got = []
    for i in range(50):
        torch.manual_seed(i)  # global RNG reset / consumed between draws
        torch.rand(7)
        other.sample(FLAT10)  # another request draws in between
        unseeded.sample(FLAT10)
        got.append(s.sample(FLAT10))
    np.testing.assert_array_equal(np.array(got), reference)


def test_unseeded_sampler_seeded_from_global_rng():
    torch.manual_seed(2024)
    a = _draws(SamplingParams(), FLAT10, 50)
    torch.manual_seed(2024)
    b = _draws(SamplingParams(), FLAT10, 50)
    np.testing.assert_array_equal(a, b)
    # without re-seeding, the next unseeded sampler gets a different generator seed
    s1, s2 = Sampler(SamplingParams()), Sampler(SamplingParams())
    assert s1.seed != s2.seed


# ---------------------------------------------------------------------------------------------
# Logprobs
# ---------------------------------------------------------------------------------------------


def test_compute_logprobs_matches_numpy_log_softmax():
    rng = np.random.default_rng(5)
    logits = rng.normal(0, 4, 100).astype(np.float32)
    x = logits.astype(np.float64)
    ref = x - x.max() - np.log(np.exp(x - x.max()).sum())
    chosen, top = compute_logprobs(torch.from_numpy(logits), token_id=17, k=5)
    assert chosen == pytest.approx(ref[17], abs=1e-5)
    ref_top = np.argsort(-ref)[:5]
    assert [t for t, _ in top] == ref_top.tolist()
    np.testing.assert_allclose([lp for _, lp in top], ref[ref_top], atol=1e-5)
    assert all(isinstance(t, int) and isinstance(lp, float) for t, lp in top)


def test_compute_logprobs_hand_computed_and_edge_cases():
    logits = torch.tensor([math.log(0.5), math.log(0.3), math.log(0.2)])
    chosen, top = compute_logprobs(logits, 2, 2)
    assert chosen == pytest.approx(math.log(0.2), abs=1e-6)
    assert [t for t, _ in top] == [0, 1]
    assert [lp for _, lp in top] == pytest.approx([math.log(0.5), math.log(0.3)], abs=1e-6)
    assert compute_logprobs(logits, 0, 0) == (pytest.approx(math.log(0.5), abs=1e-6), [])
    assert len(compute_logprobs(logits, 0, 20)[1]) == 3  # k clamped to V
    # shift invariance: raw logits need not be normalized
    assert compute_logprobs(logits + 7.0, 1, 0)[0] == pytest.approx(math.log(0.3), abs=1e-5)
    with pytest.raises(ValueError, match="token_id"):
        compute_logprobs(logits, 3, 1)
    with pytest.raises(ValueError, match="k must"):
        compute_logprobs(logits, 0, -1)
