"""`logit_bias` and `min_tokens`: SamplingParams validation, the sampler's logits against hand-computed
values, empirical draws against hand-computed probabilities, and the stop checker's `min_tokens` gate."""

from __future__ import annotations

import math

import pytest
import torch

from serving.engine.stop import check_stop
from serving.errors import InvalidSamplingParamsError
from serving.sampling.logits_processors import apply_logit_bias, mask_stop_tokens
from serving.sampling.params import SamplingParams
from serving.sampling.sampler import Sampler

INF = float("inf")


def test_logit_bias_is_normalized_sorted_and_hashable():
    params = SamplingParams(logit_bias={7: -1.5, 2: 100})
    assert params.logit_bias == ((2, 100), (7, -1.5))
    assert hash(params) == hash(SamplingParams(logit_bias=[(2, 100), (7, -1.5)]))
    assert SamplingParams().logit_bias == () and SamplingParams().min_tokens == 0


@pytest.mark.parametrize("kwargs,needle", [
    (dict(logit_bias={1: 100.5}), "logit_bias must be a mapping of token ids >= 0 to biases in [-100, 100]"),
    (dict(logit_bias={-1: 1.0}), "logit_bias"),
    (dict(logit_bias={"3": 1.0}), "logit_bias"),
    (dict(logit_bias={1: math.nan}), "logit_bias"),
    (dict(min_tokens=-1), "min_tokens must be an integer >= 0, got -1"),
    (dict(min_tokens=2.0), "min_tokens must be an integer >= 0"),
    (dict(min_tokens=17, max_tokens=16), "min_tokens must be at most max_tokens (16), got 17"),
])
def test_invalid_values_name_the_field(kwargs, needle):
    with pytest.raises(InvalidSamplingParamsError) as info:
        SamplingParams(**kwargs)
    assert needle in str(info.value)


def test_logit_bias_adds_to_the_listed_logits():
    logits = torch.tensor([1.0, 2.0, 3.0, 4.0])
    out = apply_logit_bias(logits, SamplingParams(logit_bias={0: 5.0, 3: -2.5}))
    assert out.tolist() == [6.0, 2.0, 3.0, 1.5]
    assert logits.tolist() == [1.0, 2.0, 3.0, 4.0]  # not modified
    with pytest.raises(ValueError, match="logit_bias token ids"):
        apply_logit_bias(logits, SamplingParams(logit_bias={4: 1.0}))


def test_mask_stop_tokens_until_min_tokens():
    logits = torch.tensor([0.5, 1.0, 2.0, 3.0, 4.0])
    params = SamplingParams(min_tokens=3, stop_token_ids=[4])
    for done in (0, 1, 2):
        assert mask_stop_tokens(logits, params, done, eos_token_ids=(2,)).tolist() == [0.5, 1.0, -INF, 3.0, -INF]
    assert mask_stop_tokens(logits, params, 3, eos_token_ids=(2,)).tolist() == logits.tolist()
    ignoring = SamplingParams(min_tokens=3, stop_token_ids=[4], ignore_eos=True)
    assert mask_stop_tokens(logits, ignoring, 0, eos_token_ids=(2,)).tolist() == [0.5, 1.0, 2.0, 3.0, -INF]


def test_greedy_follows_the_bias_and_min_tokens():
    logits = torch.tensor([0.0, 10.0, 9.0, 0.0])  # EOS (1) is the argmax, 2 the runner-up
    assert Sampler(SamplingParams(temperature=0)).sample(logits) == 1
    assert Sampler(SamplingParams(temperature=0, logit_bias={1: -100})).sample(logits) == 2
    assert Sampler(SamplingParams(temperature=0, logit_bias={3: 10.5})).sample(logits) == 3  # 0 + 10.5 > 10
    sampler = Sampler(SamplingParams(temperature=0, min_tokens=2), eos_token_ids=(1,))
    assert sampler.sample(logits, output_ids=[0]) == 2  # one token so far: EOS masked
    assert sampler.sample(logits, output_ids=[0, 0]) == 1  # two tokens: EOS allowed again


def test_random_draws_follow_the_biased_distribution():
    # logits [0, 0] + bias [0, ln 3] -> p = [1/4, 3/4].
    sampler = Sampler(SamplingParams(temperature=1.0, seed=0, logit_bias={1: math.log(3)}))
    draws = [sampler.sample(torch.zeros(2)) for _ in range(4000)]
    assert sum(draws) / len(draws) == pytest.approx(0.75, abs=0.03)  # 4 sigma = 0.027


def test_random_draws_never_end_before_min_tokens():
    # Uniform over [EOS, 1, 2] with EOS masked -> 1 and 2 at 1/2 each, EOS never.
    sampler = Sampler(SamplingParams(temperature=1.0, seed=5, min_tokens=1), eos_token_ids=(0,))
    draws = [sampler.sample(torch.zeros(3)) for _ in range(2000)]
    assert 0 not in draws
    assert draws.count(1) / len(draws) == pytest.approx(0.5, abs=0.045)  # 4 sigma


def test_stop_checks_wait_for_min_tokens():
    params = SamplingParams(min_tokens=3, stop=["ab"], stop_token_ids=[9], max_tokens=10)
    assert check_stop(params, 0, 2, "xab", 1, eos_token_ids=(0,)) is None
    assert check_stop(params, 9, 2, "x", 1, eos_token_ids=(0,)) is None
    assert check_stop(params, 0, 3, "x", 1, eos_token_ids=(0,)).finish_reason == "stop"
    stopped = check_stop(params, 5, 3, "xyab", 2, eos_token_ids=(0,))
    assert (stopped.finish_reason, stopped.stop_reason, stopped.text) == ("stop", "ab", "xy")
