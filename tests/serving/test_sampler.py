"""Tests for `serving.sampling_params` and `serving.sampler`.

Expected values are computed independently: by hand on small vocabularies, or with numpy
references. Statistical tests use fixed seeds, so they are deterministic; their tolerances are
still several standard deviations wide so they would pass for any seed.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from serving.errors import InvalidSamplingParamsError, ServingError
from serving.sampler import (
    Sampler,
    apply_penalties,
    apply_temperature_and_truncation,
    compute_logprobs,
)
from serving.sampling_params import SamplingParams, SamplingType

# A 5-token distribution with distinct, hand-friendly probabilities.
PROBS5 = [0.4, 0.25, 0.2, 0.1, 0.05]
LOGITS5 = torch.tensor(PROBS5, dtype=torch.float64).log().to(torch.float32)
INF = float("-inf")


def _draws(params: SamplingParams, logits: torch.Tensor, n: int, **kw) -> np.ndarray:
    sampler = Sampler(params)
    return np.array([sampler.sample(logits, **kw) for _ in range(n)])


def _freqs(draws: np.ndarray, vocab_size: int) -> np.ndarray:
    return np.bincount(draws, minlength=vocab_size) / len(draws)


def _kept(logits: torch.Tensor) -> set[int]:
    return set(torch.nonzero(torch.isfinite(logits)).flatten().tolist())


def _np_softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


# ---------------------------------------------------------------------------------------------
# SamplingParams: defaults, normalization, properties
# ---------------------------------------------------------------------------------------------


def test_defaults():
    p = SamplingParams()
    assert (p.n, p.temperature, p.top_p, p.top_k, p.min_p, p.seed) == (1, 1.0, 1.0, 0, 0.0, None)
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0.0, 0.0, 1.0)
    assert (p.stop, p.stop_token_ids, p.ignore_eos, p.max_tokens) == ((), (), False, 16)
    assert (p.logprobs, p.include_stop_str_in_output, p.skip_special_tokens) == (None, False, True)
    assert not p.is_greedy
    assert p.sampling_type is SamplingType.RANDOM


def test_frozen_and_hashable():
    p = SamplingParams(stop=["a"], stop_token_ids=[1])
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.temperature = 0.5  # type: ignore[misc]
    assert hash(p) == hash(SamplingParams(stop=("a",), stop_token_ids=(1,)))


@pytest.mark.parametrize(
    "given, expected",
    [("###", ("###",)), (["a", "bc"], ("a", "bc")), (("x",), ("x",)), ([], ()), (None, ())],
)
def test_stop_normalized_to_tuple(given, expected):
    p = SamplingParams(stop=given)
    assert p.stop == expected and isinstance(p.stop, tuple)


@pytest.mark.parametrize(
    "given, expected", [([2, 7], (2, 7)), ((5,), (5,)), (3, (3,)), ([], ()), (None, ())]
)
def test_stop_token_ids_normalized_to_tuple(given, expected):
    p = SamplingParams(stop_token_ids=given)
    assert p.stop_token_ids == expected and isinstance(p.stop_token_ids, tuple)


def test_fields_are_stored():
    # Fields consumed by the engine / detokenizer: the sampler ignores them, so the contract here
    # is that they are stored as given (and validated, below).
    p = SamplingParams(
        n=3,
        max_tokens=None,
        ignore_eos=True,
        include_stop_str_in_output=True,
        skip_special_tokens=False,
        logprobs=5,
        seed=-7,
    )
    assert (p.n, p.max_tokens, p.ignore_eos) == (3, None, True)
    assert (p.include_stop_str_in_output, p.skip_special_tokens, p.logprobs, p.seed) == (
        True,
        False,
        5,
        -7,
    )
    assert SamplingParams(max_tokens=1).max_tokens == 1
    assert SamplingParams(logprobs=0).logprobs == 0 and SamplingParams(logprobs=20).logprobs == 20


@pytest.mark.parametrize(
    "kwargs, greedy, kind",
    [
        ({"temperature": 0.0}, True, SamplingType.GREEDY),
        ({"temperature": 0.0, "seed": 1}, True, SamplingType.GREEDY),
        ({"top_k": 1}, True, SamplingType.GREEDY),
        ({"top_k": 2}, False, SamplingType.RANDOM),
        ({"temperature": 0.01}, False, SamplingType.RANDOM),
        ({"seed": 0}, False, SamplingType.RANDOM_SEED),
    ],
)
def test_is_greedy_and_sampling_type(kwargs, greedy, kind):
    p = SamplingParams(**kwargs)
    assert p.is_greedy is greedy
    assert p.sampling_type is kind


# ---------------------------------------------------------------------------------------------
# SamplingParams: validation
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field, value, fragments",
    [
        ("n", 0, ["n must be", ">= 1", "got 0"]),
        ("n", 1.5, ["n must be", "got 1.5"]),
        ("temperature", -0.1, ["temperature must be", ">= 0", "got -0.1"]),
        ("temperature", float("nan"), ["temperature", "got nan"]),
        ("top_p", 0.0, ["top_p must be in (0, 1]", "got 0.0"]),
        ("top_p", 1.01, ["top_p must be in (0, 1]", "got 1.01"]),
        ("top_k", -2, ["top_k must be", ">= -1", "got -2"]),
        ("top_k", 2.0, ["top_k", "got 2.0"]),
        ("min_p", -0.01, ["min_p must be in [0, 1]", "got -0.01"]),
        ("min_p", 1.5, ["min_p must be in [0, 1]", "got 1.5"]),
        ("seed", 2**63, ["seed must be", str(2**63)]),
        ("seed", "42", ["seed must be", "'42'"]),
        ("presence_penalty", 2.5, ["presence_penalty must be in [-2, 2]", "got 2.5"]),
        ("presence_penalty", -2.01, ["presence_penalty must be in [-2, 2]", "got -2.01"]),
        ("frequency_penalty", -3, ["frequency_penalty must be in [-2, 2]", "got -3"]),
        ("frequency_penalty", 2.01, ["frequency_penalty must be in [-2, 2]", "got 2.01"]),
        ("repetition_penalty", 0.0, ["repetition_penalty must be", "> 0", "got 0.0"]),
        ("repetition_penalty", -1.0, ["repetition_penalty must be", "> 0", "got -1.0"]),
        ("max_tokens", 0, ["max_tokens must be at least 1, got 0"]),
        ("max_tokens", -5, ["max_tokens must be at least 1, got -5"]),
        ("max_tokens", 2.0, ["max_tokens must be", "got 2.0"]),
        ("logprobs", -1, ["logprobs must be", "[0, 20]", "got -1"]),
        ("logprobs", 21, ["logprobs must be", "[0, 20]", "got 21"]),
        ("stop", "", ["stop must be", "non-empty", "''"]),
        ("stop", ["ok", ""], ["stop must be", "non-empty"]),
        ("stop", [1], ["stop must be"]),
        ("stop_token_ids", [-1], ["stop_token_ids must be", ">= 0", "-1"]),
        ("stop_token_ids", ["a"], ["stop_token_ids must be"]),
        ("ignore_eos", "yes", ["ignore_eos must be a bool"]),
    ],
)
def test_validation_errors(field, value, fragments):
    with pytest.raises(InvalidSamplingParamsError) as info:
        SamplingParams(**{field: value})
    message = str(info.value)
    assert message.startswith(field)
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    # The gateway maps ServingError (a ValueError) to a 400.
    assert isinstance(info.value, ServingError) and isinstance(info.value, ValueError)


def test_max_tokens_message_exact():
    with pytest.raises(InvalidSamplingParamsError, match=r"^max_tokens must be at least 1, got 0$"):
        SamplingParams(max_tokens=0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"top_p": 1e-9},
        {"top_k": -1},
        {"min_p": 1.0},
        {"presence_penalty": -2, "frequency_penalty": 2},
        {"repetition_penalty": 1e-3},
        {"temperature": 5.0},
        {"seed": -(2**63)},
        {"seed": 2**63 - 1},
    ],
)
def test_boundary_values_accepted(kwargs):
    params = SamplingParams(**kwargs)
    for name, value in kwargs.items():
        assert getattr(params, name) == value, name  # stored as given, not clamped


# ---------------------------------------------------------------------------------------------
# Penalties
# ---------------------------------------------------------------------------------------------

PEN_LOGITS = torch.tensor([2.0, -1.0, 0.5, 3.0, 0.0])


def test_repetition_penalty_hand_computed():
    p = SamplingParams(repetition_penalty=2.0)
    # prompt has token 0 three times: the penalty applies once per distinct token.
    out = apply_penalties(PEN_LOGITS, p, prompt_ids=[0, 0, 0, 1], output_ids=[3])
    # 0: 2/2=1; 1: -1*2=-2; 2: untouched; 3: 3/2=1.5; 4: untouched.
    torch.testing.assert_close(out, torch.tensor([1.0, -2.0, 0.5, 1.5, 0.0]))


def test_repetition_penalty_below_one_encourages():
    p = SamplingParams(repetition_penalty=0.5)
    out = apply_penalties(PEN_LOGITS, p, prompt_ids=[1], output_ids=[3])
    torch.testing.assert_close(out, torch.tensor([2.0, -0.5, 0.5, 6.0, 0.0]))


def test_presence_penalty_output_only():
    p = SamplingParams(presence_penalty=1.0)
    out = apply_penalties(PEN_LOGITS, p, prompt_ids=[0, 1], output_ids=[3, 3, 2])
    # prompt tokens 0, 1 are not penalized; 3 (twice) and 2 (once) lose exactly 1.
    torch.testing.assert_close(out, torch.tensor([2.0, -1.0, -0.5, 2.0, 0.0]))


def test_frequency_penalty_scales_with_count():
    p = SamplingParams(frequency_penalty=0.5)
    out = apply_penalties(PEN_LOGITS, p, prompt_ids=[0, 1], output_ids=[3, 3, 3, 2])
    torch.testing.assert_close(out, torch.tensor([2.0, -1.0, 0.0, 1.5, 0.0]))


def test_negative_presence_and_frequency():
    p = SamplingParams(presence_penalty=-1.0, frequency_penalty=-0.25)
    out = apply_penalties(PEN_LOGITS, p, prompt_ids=[], output_ids=[1, 1])
    torch.testing.assert_close(out, torch.tensor([2.0, 0.5, 0.5, 3.0, 0.0]))


def test_all_penalties_combined_hand_computed():
    p = SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=1.0)
    out = apply_penalties(PEN_LOGITS, p, prompt_ids=[0, 1], output_ids=[3, 3, 2])
    # repetition on {0,1,2,3}: [1, -2, 0.25, 1.5, 0]; then token 3: 1.5 - 2*0.5 - 1 = -0.5,
    # token 2: 0.25 - 0.5 - 1 = -1.25.
    torch.testing.assert_close(out, torch.tensor([1.0, -2.0, -1.25, -0.5, 0.0]))


def test_penalties_match_numpy_reference():
    rng = np.random.default_rng(0)
    vocab = 64
    logits = rng.normal(0, 3, vocab).astype(np.float32)
    prompt = rng.integers(0, vocab, 30).tolist()
    output = rng.integers(0, vocab, 40).tolist()
    rep, freq, pres = 1.3, 0.7, -0.4

    ref = logits.astype(np.float64).copy()
    for t in set(prompt) | set(output):
        ref[t] = ref[t] / rep if ref[t] > 0 else ref[t] * rep
    counts = np.bincount(output, minlength=vocab)
    ref = ref - freq * counts - pres * (counts > 0)

    p = SamplingParams(repetition_penalty=rep, frequency_penalty=freq, presence_penalty=pres)
    out = apply_penalties(torch.from_numpy(logits), p, prompt, output)
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-6, atol=1e-5)


def test_penalties_do_not_mutate_and_return_new_tensor():
    logits = PEN_LOGITS.clone()
    p = SamplingParams(repetition_penalty=2.0, frequency_penalty=1.0, presence_penalty=1.0)
    out = apply_penalties(logits, p, [0], [1, 2])
    torch.testing.assert_close(logits, PEN_LOGITS)
    neutral = apply_penalties(logits, SamplingParams(), [0], [1, 2])
    torch.testing.assert_close(neutral, PEN_LOGITS)
    assert neutral.data_ptr() != logits.data_ptr() and out.data_ptr() != logits.data_ptr()
    assert neutral.dtype == torch.float32


def test_penalties_accept_half_precision_and_tensor_ids():
    p = SamplingParams(repetition_penalty=2.0)
    out = apply_penalties(PEN_LOGITS.to(torch.bfloat16), p, torch.tensor([0]), torch.tensor([3]))
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, torch.tensor([1.0, -1.0, 0.5, 1.5, 0.0]))


def test_penalties_reject_out_of_range_ids():
    p = SamplingParams(repetition_penalty=2.0)
    with pytest.raises(ValueError, match="output_ids"):
        apply_penalties(PEN_LOGITS, p, [0], [5])
    with pytest.raises(ValueError, match="prompt_ids"):
        apply_penalties(PEN_LOGITS, p, [-1], [])
    with pytest.raises(ValueError, match="shape"):
        apply_penalties(PEN_LOGITS[None], p, [], [])


# ---------------------------------------------------------------------------------------------
# Temperature and truncation (deterministic masks)
# ---------------------------------------------------------------------------------------------


def test_temperature_divides_logits():
    out = apply_temperature_and_truncation(PEN_LOGITS, SamplingParams(temperature=0.5))
    torch.testing.assert_close(out, PEN_LOGITS * 2)
    # greedy: temperature skipped (no division by zero)
    out = apply_temperature_and_truncation(PEN_LOGITS, SamplingParams(temperature=0.0))
    torch.testing.assert_close(out, PEN_LOGITS)


@pytest.mark.parametrize(
    "k, kept",
    [
        (0, {0, 1, 2, 3, 4}),
        (-1, {0, 1, 2, 3, 4}),
        (2, {0, 1}),
        (3, {0, 1, 2}),
        (5, {0, 1, 2, 3, 4}),
        (99, {0, 1, 2, 3, 4}),
    ],
)
def test_top_k_mask(k, kept):
    # shuffle the order so "top" is not simply "first"
    perm = torch.tensor([3, 0, 4, 1, 2])
    logits = LOGITS5[perm]  # logits[i] = LOGITS5[perm[i]]
    out = apply_temperature_and_truncation(logits, SamplingParams(top_k=k))
    expected = {i for i in range(5) if int(perm[i]) in kept}
    assert _kept(out) == expected
    torch.testing.assert_close(out[list(expected)], logits[list(expected)])


def test_top_k_keeps_ties_at_boundary():
    logits = torch.tensor([3.0, 1.0, 1.0, 0.0])
    assert _kept(apply_temperature_and_truncation(logits, SamplingParams(top_k=2))) == {0, 1, 2}


@pytest.mark.parametrize(
    "top_p, kept",
    [
        # PROBS5 = [0.4, 0.25, 0.2, 0.1, 0.05]; cumulative 0.4, 0.65, 0.85, 0.95, 1.0
        (0.3, {0}),  # top token alone already has 0.4 >= 0.3
        (0.39, {0}),
        (0.41, {0, 1}),
        (0.6, {0, 1}),
        (0.66, {0, 1, 2}),
        (0.9, {0, 1, 2, 3}),
        (0.96, {0, 1, 2, 3, 4}),
        (1.0, {0, 1, 2, 3, 4}),
        (1e-6, {0}),  # the top token is always kept
    ],
)
def test_top_p_hand_computed(top_p, kept):
    out = apply_temperature_and_truncation(LOGITS5, SamplingParams(top_p=top_p))
    assert _kept(out) == kept


def test_top_p_applies_to_top_k_renormalized_distribution():
    # After top_k=3 the survivors renormalize to [0.4, 0.25, 0.2] / 0.85 = [0.47, 0.294, 0.235];
    # cumulative 0.47, 0.765 >= 0.7, so top_p=0.7 keeps {0, 1} (on the raw distribution it would
    # need 0.85 and keep {0, 1, 2}).
    out = apply_temperature_and_truncation(LOGITS5, SamplingParams(top_k=3, top_p=0.7))
    assert _kept(out) == {0, 1}
    assert _kept(apply_temperature_and_truncation(LOGITS5, SamplingParams(top_p=0.7))) == {0, 1, 2}


def test_top_p_uses_temperature_scaled_distribution():
    # T=0.5 squares and renormalizes: [0.16, .0625, .04, .01, .0025]/0.275 -> top token 0.582,
    # so top_p=0.55 keeps only token 0 (at T=1 it would keep {0, 1}).
    out = apply_temperature_and_truncation(LOGITS5, SamplingParams(temperature=0.5, top_p=0.55))
    assert _kept(out) == {0}
    assert _kept(apply_temperature_and_truncation(LOGITS5, SamplingParams(top_p=0.55))) == {0, 1}


@pytest.mark.parametrize(
    "min_p, kept",
    [
        # threshold = min_p * 0.4
        (0.0, {0, 1, 2, 3, 4}),
        (0.1, {0, 1, 2, 3, 4}),  # 0.04
        (0.2, {0, 1, 2, 3}),  # 0.08
        (0.45, {0, 1, 2}),  # 0.18
        (0.55, {0, 1}),  # 0.22
        (0.7, {0}),  # 0.28
        (1.0, {0}),
    ],
)
def test_min_p_hand_computed(min_p, kept):
    assert _kept(apply_temperature_and_truncation(LOGITS5, SamplingParams(min_p=min_p))) == kept


def test_truncation_matches_numpy_reference():
    rng = np.random.default_rng(1)
    logits = rng.normal(0, 2, 200).astype(np.float32)
    temp, k, top_p, min_p = 0.8, 50, 0.75, 0.05

    x = logits.astype(np.float64) / temp
    order = np.argsort(-x)
    keep = np.zeros_like(x, dtype=bool)
    keep[order[:k]] = True
    probs = _np_softmax(np.where(keep, x, -np.inf))
    mass = 0.0
    nucleus = np.zeros_like(keep)
    for i in order:  # reference loop over the vocabulary is fine in a test
        if mass >= top_p:
            break
        nucleus[i] = True
        mass += probs[i]
    keep &= nucleus
    probs = _np_softmax(np.where(keep, x, -np.inf))
    keep &= probs >= min_p * probs.max()

    params = SamplingParams(temperature=temp, top_k=k, top_p=top_p, min_p=min_p)
    out = apply_temperature_and_truncation(torch.from_numpy(logits), params).numpy()
    np.testing.assert_array_equal(np.isfinite(out), keep)
    np.testing.assert_allclose(out[keep], x[keep], rtol=1e-6)


def test_truncation_does_not_mutate_input():
    logits = LOGITS5.clone()
    apply_temperature_and_truncation(logits, SamplingParams(temperature=0.5, top_k=2, top_p=0.5))
    torch.testing.assert_close(logits, LOGITS5)


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
