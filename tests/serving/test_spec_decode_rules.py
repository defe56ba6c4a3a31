"""Pure parts of speculative decoding: the n-gram drafter, the acceptance rules, the lookahead policy.

The distribution test follows Leviathan et al. 2023 (Theorem 3.5): tokens emitted by rejection
sampling are distributed as the target p, whatever the draft q. A chi-square test with a fixed seed
checks that on a vocabulary of 6 tokens, and the same check rejects a rule that always accepts.
"""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from serving.spec_decode.config import SpeculativeConfig
from serving.spec_decode.ngram import propose_ngram
from serving.spec_decode.policy import AcceptanceState, LookaheadPolicy
from serving.spec_decode.rejection import num_greedy_accepted, rejection_sample

# -- n-gram drafting ------------------------------------------------------------------------------


@pytest.mark.parametrize("tokens, k, ngram_max, ngram_min, expected", [
    ([1, 2, 3, 4, 1, 2], 3, 2, 1, [3, 4, 1]),            # "1 2" seen at 0: continue with 3 4 1
    ([1, 2, 3, 4, 1, 2], 5, 2, 1, [3, 4, 1, 2]),         # the continuation runs to the end
    ([5, 1, 2, 9, 7, 1, 2, 8, 3, 2], 2, 3, 1, [8, 3]),   # only "2" matches; its latest earlier match is at 6
    ([1, 2, 3, 9, 2, 3, 7, 2, 3], 2, 2, 1, [7, 2]),      # "2 3" twice: the most recent (at 4) wins
    ([1, 2, 3, 4], 3, 3, 1, []),                         # no earlier occurrence of any suffix
    ([7, 7, 7], 2, 4, 1, [7]),                           # "7 7" at 0 -> continuation [7] (position 2)
    ([1, 2, 3, 1, 2], 0, 2, 1, []),                      # k = 0 drafts nothing
    ([4], 3, 2, 1, []),                                  # one token: nothing earlier
    ([1, 2, 3, 8, 2, 3], 2, 3, 3, []),                   # n = 3 only: "8 2 3" never seen before
])
def test_propose_ngram_hand_cases(tokens, k, ngram_max, ngram_min, expected):
    assert propose_ngram(tokens, k, ngram_max, ngram_min) == expected


def test_propose_ngram_prefers_the_longest_suffix():
    # suffix "1 2 3": seen at 0 (-> 4); suffix "3" alone was seen later, at 6 (-> 5): n = 3 wins.
    tokens = [1, 2, 3, 4, 9, 9, 3, 5, 1, 2, 3]
    assert propose_ngram(tokens, 1, 3, 1) == [4]
    assert propose_ngram(tokens, 1, 1, 1) == [5]


# -- greedy acceptance -----------------------------------------------------------------------------


@pytest.mark.parametrize("draft, target, expected", [
    ([5, 6, 7], [5, 6, 7, 8], 3),
    ([5, 6, 7], [5, 9, 7, 8], 1),
    ([5, 6, 7], [4, 6, 7, 8], 0),
    ([], [3], 0),
])
def test_num_greedy_accepted(draft, target, expected):
    assert num_greedy_accepted(draft, target) == expected


def test_deterministic_targets_accept_the_matching_prefix_then_correct():
    g = torch.Generator().manual_seed(0)
    assert rejection_sample([5, 6, 7], [5, 6, 9, 1], g) == [5, 6, 9]
    assert rejection_sample([5, 6, 7], [5, 6, 7, 1], g) == [5, 6, 7, 1]
    assert rejection_sample([], [4], g) == [4]
    with pytest.raises(ValueError, match="k \\+ 1"):
        rejection_sample([5, 6], [5, 6], g)


# -- the sampled rule keeps the target distribution --------------------------------------------------

P = torch.tensor([[0.05, 0.30, 0.10, 0.25, 0.20, 0.10],   # target after the last verified token
                  [0.40, 0.05, 0.15, 0.10, 0.20, 0.10]])  # target after draft 0 (the bonus position)
Q = torch.tensor([[0.30, 0.05, 0.30, 0.05, 0.20, 0.10]])  # draft distribution of token 0
NUM_SAMPLES = 24_000


def _first_tokens(rule, seed=1234) -> torch.Tensor:
    """Counts [6] of the first emitted token over NUM_SAMPLES one-token drafts drawn from Q."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros(6)
    for _ in range(NUM_SAMPLES):
        x = int(torch.multinomial(Q[0], 1, generator=g))
        counts[rule(x, g)[0]] += 1
    return counts


def _p_value(counts: torch.Tensor, p: torch.Tensor) -> float:
    return float(chisquare(counts.numpy(), (p * counts.sum()).numpy()).pvalue)


def test_rejection_sampling_with_a_draft_distribution_keeps_the_target_distribution():
    counts = _first_tokens(lambda x, g: rejection_sample([x], [P[0], P[1]], g, Q))
    assert _p_value(counts, P[0]) > 0.01


def test_rejection_sampling_with_a_point_mass_draft_keeps_the_target_distribution():
    # A deterministic drafter always proposes token 2 (q = point mass): keep it with p(2), else draw
    # from p without token 2.
    g = torch.Generator().manual_seed(99)
    counts = torch.zeros(6)
    second = torch.zeros(6)
    for _ in range(NUM_SAMPLES):
        out = rejection_sample([2], [P[0], P[1]], g)
        counts[out[0]] += 1
        if out[0] == 2:
            second[out[1]] += 1  # the bonus token after an accepted draft follows P[1]
    assert _p_value(counts, P[0]) > 0.01
    assert _p_value(second, P[1]) > 0.01


def test_the_check_rejects_a_wrong_rule():
    always_accept = _first_tokens(lambda x, g: [x])                                   # emits q, not p
    forget_residual = _first_tokens(lambda x, g: rejection_sample([x], [P[0], P[1]], g, torch.zeros_like(Q) + 1 / 6))
    assert _p_value(always_accept, P[0]) < 1e-6
    assert _p_value(forget_residual, P[0]) < 1e-6  # a wrong q in the ratio distorts the output


# -- adaptive lookahead ----------------------------------------------------------------------------


def test_batch_cap_backs_off_with_the_decode_batch():
    policy = LookaheadPolicy(SpeculativeConfig(num_speculative_tokens=6, max_batch_size=4))
    assert [policy.batch_cap(b) for b in (1, 2, 3, 4, 5, 16)] == [6, 5, 3, 2, 0, 0]
    fixed = LookaheadPolicy(SpeculativeConfig(num_speculative_tokens=6, max_batch_size=4, adaptive=False))
    assert [fixed.batch_cap(b) for b in (1, 4, 5)] == [6, 6, 0]


def test_draft_length_follows_the_acceptance_rate():
    policy = LookaheadPolicy(SpeculativeConfig(num_speculative_tokens=5, min_speculative_tokens=1, ema_alpha=0.5))
    state = AcceptanceState()
    assert policy.num_draft(state, cap=5) == 5  # optimistic start
    policy.update(state, 5, 0)
    policy.update(state, 5, 0)
    assert state.acceptance_ema == pytest.approx(0.25) and policy.num_draft(state, cap=5) == 2
    policy.update(state, 2, 0)
    policy.update(state, 2, 0)
    assert policy.num_draft(state, cap=5) == 1  # k_min: never below
    for _ in range(6):
        policy.update(state, 1, 1)
    assert policy.num_draft(state, cap=5) == 5 and policy.num_draft(state, cap=3) == 3
    assert (state.num_draft_tokens, state.num_accepted_tokens, state.num_draft_steps) == (20, 6, 10)
