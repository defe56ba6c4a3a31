"""Pure parts of speculative decoding: the n-gram drafter, the acceptance rules, the lookahead policy.

The distribution test follows Leviathan et al. 2023 (Theorem 3.5): tokens emitted by rejection
sampling are distributed as the target p, whatever the draft q. A chi-square test with a fixed seed
checks that on a vocabulary of 6 tokens, and the same check rejects a rule that always accepts.
"""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from serving.engine.sequence import Sequence
from serving.sampling.params import SamplingParams
from serving.sampling.sampler import Sampler
from serving.spec_decode.config import SpeculativeConfig
from serving.spec_decode.ngram import propose_ngram
from serving.spec_decode.policy import PRIOR_ALPHA, AcceptanceState, LookaheadPolicy, summarize
from serving.spec_decode.rejection import num_greedy_accepted, rejection_sample
from serving.spec_decode.speculator import Speculator
from serving.spec_decode.step_cost import StepCostModel

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


def test_batch_cap_backs_off_and_stops_at_the_threshold():
    # T = 4 running sequences: ceil(6 (4 - b) / 3) drafts below it, none from it on.
    policy = LookaheadPolicy(SpeculativeConfig(num_speculative_tokens=6, disable_by_batch_size=4))
    assert [policy.batch_cap(b) for b in (0, 1, 2, 3, 4, 5, 16)] == [6, 6, 4, 2, 0, 0, 0]
    fixed = LookaheadPolicy(SpeculativeConfig(num_speculative_tokens=6, disable_by_batch_size=4, adaptive=False))
    assert [fixed.batch_cap(b) for b in (1, 3, 4, 5)] == [6, 6, 0, 0]
    never = LookaheadPolicy(SpeculativeConfig(disable_by_batch_size=1))
    assert [never.batch_cap(b) for b in (0, 1, 2)] == [0, 0, 0]
    # k_min is a floor below the threshold: T = 8, b = 7 gives ceil(5 / 7) = 1 < k_min = 2.
    floor = LookaheadPolicy(SpeculativeConfig(num_speculative_tokens=5, min_speculative_tokens=2, disable_by_batch_size=8))
    assert [floor.batch_cap(b) for b in (1, 7, 8)] == [5, 2, 0]


def _decoding(seq_id: int, prompt: list[int], output: list[int] = ()) -> Sequence:
    """A sequence whose KV holds all but its last token (the state `Speculator.propose` drafts for)."""
    seq = Sequence(seq_id, prompt, output_token_ids=list(output))
    seq.num_computed_tokens = seq.num_tokens - 1
    return seq


REPEATING = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]  # "3 4 1 2" recurs: prompt lookup continues with 3 4 1 2


def test_speculator_drafts_below_the_threshold_and_not_at_it():
    speculator = Speculator(SpeculativeConfig(num_speculative_tokens=4, disable_by_batch_size=3), loaded=None)
    seqs = [_decoding(i, REPEATING) for i in range(3)]
    candidates = [(seq, AcceptanceState(), None) for seq in seqs]
    speculator.propose(candidates, num_running=3, max_model_len=100)
    assert [seq.draft_token_ids for seq in seqs] == [[], [], []]
    speculator.propose(candidates[:2], num_running=2, max_model_len=100)
    assert [seq.draft_token_ids for seq in seqs] == [[3, 4], [3, 4], []]  # cap ceil(4 (3 - 2) / 2) = 2
    speculator.propose(candidates[:1], num_running=1, max_model_len=100)
    assert seqs[0].draft_token_ids == [3, 4, 1, 2]


def test_speculator_keeps_drafts_within_max_tokens_and_the_context():
    speculator = Speculator(SpeculativeConfig(num_speculative_tokens=4, disable_by_batch_size=8), loaded=None)  # cap 3
    # 9 prompt tokens and 1 output token each; the target's own token follows the drafts.
    near_max_tokens, near_context = _decoding(0, REPEATING[:9], [2]), _decoding(1, REPEATING[:9], [2])
    prefilling = Sequence(2, REPEATING)
    speculator.propose([(near_max_tokens, AcceptanceState(), 3), (near_context, AcceptanceState(), None),
                        (prefilling, AcceptanceState(), None)], num_running=3, max_model_len=13)
    assert near_max_tokens.draft_token_ids == [3]  # max_tokens 3 - 1 output - 1
    assert near_context.draft_token_ids == [3, 4]  # context 13 - 10 tokens - 1
    assert prefilling.draft_token_ids == []


def test_step_cost_model_drafts_when_tokens_per_second_are_higher():
    cost = StepCostModel(ema_alpha=1.0, probe_every=4)
    assert cost.pays(2, 0.5)  # nothing measured at b = 2: try a step with drafts ...
    cost.record(2, True, 0.030)
    assert not cost.pays(2, 0.5)  # ... then a plain one
    cost.record(2, False, 0.020)
    # plain: 2 tokens / 20 ms = 100 tokens/s; drafts: (2 + A) / 30 ms, better when A > 1
    assert [cost.pays(2, a) for a in (0.5, 1.5, 0.9)] == [False, True, False]
    assert cost.pays(2, 0.5) and not cost.pays(2, 0.5)  # the 4th decision probes the other choice, once
    assert cost.pays(3, 0.0)  # each batch size has its own times
    averaged = StepCostModel(ema_alpha=0.5)
    averaged.record(1, False, 0.030)
    averaged.record(1, False, 0.010)
    assert averaged.plain_seconds == {1: pytest.approx(0.020)} and averaged.spec_seconds == {}


def test_step_cost_calibration_scales_predictions_by_what_drafted_steps_kept():
    cost = StepCostModel(ema_alpha=0.5, probe_every=100)
    assert cost.calibration == 1.0
    cost.record(2, True, 0.030)
    cost.record(2, False, 0.020)
    assert cost.pays(2, 1.2)                     # uncalibrated: drafts pay when A > 1
    cost.observe_accepted(2.0, 0)                # first drafted step, from the prior (2, 2): kept 0.5 * 2 + 0.5 * 0
    assert cost.calibration == 0.5
    assert not cost.pays(2, 1.9) and cost.pays(2, 2.1)   # now when 0.5 A > 1
    cost.observe_accepted(4.0, 0)                # averages: predicted 0.5 * 2 + 0.5 * 4 = 3, kept 0.5
    assert cost.calibration == pytest.approx(0.5 / 3)
    cost.observe_accepted(0.0, 3)                # nothing was predicted: no evidence either way
    assert cost.calibration == pytest.approx(0.5 / 3)
    slow = StepCostModel(ema_alpha=0.2)
    slow.observe_accepted(5.0, 0)                # one failed step moves c by alpha, not to 0
    assert slow.calibration == pytest.approx(0.8)


def test_drafting_probes_that_lose_back_off_and_one_that_wins_resets():
    cost = StepCostModel(ema_alpha=1.0, probe_every=4, max_probe_every=16)
    cost.record(2, True, 0.030)
    cost.record(2, False, 0.020)          # drafts pay when A > 1 (2 tokens / 20 ms against (2 + A) / 30 ms)

    def decisions(n):
        return [cost.pays(2, 0.2) for _ in range(n)]

    assert decisions(4) == [False, False, False, True]      # the 4th decision probes with drafts
    cost.observe_probe(2, accepted=0, seconds=0.030)         # (2 + 0) / 30 ms < 2 / 20 ms: lost
    assert cost.probe_interval[2] == 8
    assert decisions(8) == [False] * 7 + [True]
    cost.observe_probe(2, accepted=1, seconds=0.030)         # 3 / 30 ms = 2 / 20 ms: not a win, lost
    assert cost.probe_interval[2] == 16
    assert decisions(16)[-1] and cost.probe_interval[2] == 16
    cost.observe_probe(2, accepted=0, seconds=0.030)
    assert cost.probe_interval[2] == 16                      # capped at max_probe_every
    assert decisions(16)[-1]
    cost.observe_probe(2, accepted=3, seconds=0.030)         # 5 / 30 ms > 2 / 20 ms: the text turned repetitive
    assert cost.probe_interval[2] == 4
    cost.observe_probe(2, accepted=0, seconds=0.030)         # not after a probe: ignored
    assert cost.probe_interval[2] == 4
    assert decisions(4) == [False, False, False, True]
    cost.observe_probe(3, accepted=0, seconds=0.030)         # another batch size: not that probe
    assert cost.probe_interval == {2: 4}
    with pytest.raises(ValueError):
        StepCostModel(probe_every=8, max_probe_every=4)


def test_speculator_calibrates_on_the_drafts_verify_keeps():
    speculator = Speculator(SpeculativeConfig(num_speculative_tokens=4, step_cost=True), loaded=None)
    seq, state = _decoding(0, REPEATING), AcceptanceState(acceptance_ema=0.5)
    speculator.propose([(seq, state, None)], num_running=1, max_model_len=100)   # nothing timed: drafts
    k = len(seq.draft_token_ids)
    assert seq.draft_token_ids == [3, 4, 1, 2][:k] and k == 1 + round(0.5 * 3)
    speculator.begin_step([(seq, 1 + k)])
    rows = torch.full((k + 1, 8), -1.0)
    rows[0, 3], rows[1, 4], rows[2, 7] = 1.0, 1.0, 1.0   # the target agrees with "3 4", then says 7
    tokens = speculator.verify(Sampler(SamplingParams(temperature=0)), seq, rows, state)
    assert tokens == [3, 4, 7]
    speculator.end_step(0.050)
    predicted, a = 0.5 * k, speculator.cost.ema_alpha   # r k, what the decision assumed
    assert speculator.cost.predicted_ema == pytest.approx(predicted)
    assert speculator.cost.accepted_ema == pytest.approx((1 - a) * predicted + a * 2)   # from the prior c = 1
    assert speculator.cost.calibration == pytest.approx(1 - a + a * 2 / predicted)


def test_speculator_times_decode_only_steps_and_skips_drafts_that_do_not_pay():
    speculator = Speculator(SpeculativeConfig(num_speculative_tokens=4, step_cost=True), loaded=None)
    seq = _decoding(0, REPEATING)
    speculator.propose([(seq, AcceptanceState(), None)], num_running=1, max_model_len=100)
    assert seq.draft_token_ids == [3, 4, 1, 2]
    speculator.begin_step([(seq, 5)])
    speculator.end_step(0.060)
    seq.draft_token_ids = []
    speculator.propose([(seq, AcceptanceState(), None)], num_running=1, max_model_len=100)
    assert seq.draft_token_ids == []  # no plain step timed yet at b = 1
    speculator.begin_step([(seq, 1)])
    speculator.end_step(0.010)
    assert (speculator.cost.spec_seconds, speculator.cost.plain_seconds) == ({1: 0.060}, {1: 0.010})
    # 1 + 4 expected tokens per 60 ms loses to 1 token per 10 ms; a prefill step is not timed
    speculator.propose([(seq, AcceptanceState(), None)], num_running=1, max_model_len=100)
    assert seq.draft_token_ids == []
    speculator.begin_step([(Sequence(1, REPEATING), 10)])
    speculator.end_step(1.0)
    assert (speculator.cost.spec_seconds, speculator.cost.plain_seconds) == ({1: 0.060}, {1: 0.010})
    fixed = Speculator(SpeculativeConfig(num_speculative_tokens=4, adaptive=False, step_cost=True), loaded=None)
    assert fixed.cost is None  # only with adaptive lookahead
    assert Speculator(SpeculativeConfig(), loaded=None).cost is not None  # on by default
    assert Speculator(SpeculativeConfig(step_cost=False), loaded=None).cost is None


def test_a_step_without_drafts_still_checks_the_n_gram_proposal():
    # Drafts do not pay (1 token per 10 ms plain, 1 + r k per 100 ms with drafts): no one drafts, but the
    # proposal for the next position is checked against the token the target emits there.
    speculator = Speculator(SpeculativeConfig(num_speculative_tokens=4, ema_alpha=0.5, step_cost=True), loaded=None)
    speculator.cost.record(1, True, 0.100)
    speculator.cost.record(1, False, 0.010)
    seq, state = _decoding(0, REPEATING), AcceptanceState(acceptance_ema=0.5)
    speculator.propose([(seq, state, None)], num_running=1, max_model_len=100)
    assert seq.draft_token_ids == [] and state.acceptance_ema == 0.5
    seq.append_token(3)  # the target agrees with the proposal "3"
    seq.num_computed_tokens += 1
    speculator.propose([(seq, state, None)], num_running=1, max_model_len=100)
    assert state.acceptance_ema == 0.75 and state.num_draft_tokens == 0  # the average moves; the counts do not
    seq.append_token(9)  # proposed "4"
    seq.num_computed_tokens += 1
    speculator.propose([(seq, state, None)], num_running=1, max_model_len=100)
    assert state.acceptance_ema == 0.375
    speculator.release(seq.seq_id)
    assert speculator._unsent == {}


def test_a_new_request_starts_from_the_engine_wide_acceptance_rate():
    # R <- 0.9 R + 0.1 (a / d) over every verification step and unsent check of every request, from 1.
    policy = LookaheadPolicy(SpeculativeConfig(num_speculative_tokens=5, min_speculative_tokens=1, ema_alpha=0.5))
    assert PRIOR_ALPHA == 0.1 and policy.new_state().acceptance_ema == 1.0  # the first request: optimistic
    first, second = policy.new_state(), policy.new_state()
    policy.update(first, 5, 0)        # R = 0.9
    policy.update(second, 4, 1)       # R = 0.9 * 0.9 + 0.1 * 0.25 = 0.835
    policy.observe(first, 1, 0)       # an unsent check counts too: R = 0.7515
    assert policy.engine_acceptance == pytest.approx(0.7515)
    late = policy.new_state()
    assert late.acceptance_ema == pytest.approx(0.7515) and late.num_draft_tokens == 0
    assert policy.num_draft(late, cap=5) == 1 + round(0.7515 * 4)  # 4, where a fresh r = 1 would draft 5
    policy.update(first, 2, 0)        # a sequence's own average moves at its own rate
    assert first.acceptance_ema == pytest.approx(0.5 * (0.5 * 0.5 * 1.0))
    for _ in range(60):               # text where drafts keep failing: new requests start near 0
        policy.update(first, 3, 0)
    assert policy.new_state().acceptance_ema < 0.002 and policy.num_draft(policy.new_state(), cap=5) == 1


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
    total = summarize([state, AcceptanceState(num_draft_tokens=3, num_accepted_tokens=1, num_draft_steps=1)])
    assert (total.num_draft_tokens, total.num_accepted_tokens, total.num_draft_steps) == (23, 7, 11)
