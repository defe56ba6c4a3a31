"""Tests for `serving.sampling.logits_processors`: penalties, temperature and truncation masks.

Expected values are computed independently: by hand on small vocabularies, or with numpy references.
(Logit bias and the `min_tokens` mask: test_logit_bias_min_tokens.py.)
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from serving.sampling.logits_processors import apply_penalties, apply_temperature_and_truncation
from serving.sampling.params import SamplingParams

# A 5-token distribution with distinct, hand-friendly probabilities.
PROBS5 = [0.4, 0.25, 0.2, 0.1, 0.05]
LOGITS5 = torch.tensor(PROBS5, dtype=torch.float64).log().to(torch.float32)


def _kept(logits: torch.Tensor) -> set[int]:
    return set(torch.nonzero(torch.isfinite(logits)).flatten().tolist())


def _np_softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


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
