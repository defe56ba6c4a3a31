"""The batched greedy path (`batched_argmax`, `Sampler.is_plain_greedy`) against `Sampler.sample` row by row."""

from __future__ import annotations

import pytest
import torch

from serving.sampling.params import SamplingParams
from serving.sampling.sampler import Sampler, batched_argmax


def test_batched_argmax_equals_sample_row_by_row_including_ties():
    torch.manual_seed(0)
    rows = [torch.randn(50) for _ in range(6)]
    rows[1][[3, 17]] = 9.0  # a tie: the lowest id wins in both paths
    rows[2][:] = -float("inf")
    rows[2][44] = 0.0  # one finite logit
    greedy = Sampler(SamplingParams(temperature=0))
    assert batched_argmax(rows) == [greedy.sample(r) for r in rows]
    assert batched_argmax(rows)[1] == 3


@pytest.mark.parametrize("poison", ["nan", "all_-inf"])
def test_batched_argmax_defers_bad_rows_to_the_per_row_path(poison):
    rows = [torch.randn(10), torch.randn(10)]
    rows[1][:] = float("nan") if poison == "nan" else -float("inf")
    assert batched_argmax(rows) is None
    with pytest.raises(ValueError):
        Sampler(SamplingParams(temperature=0)).sample(rows[1])


@pytest.mark.parametrize("fields,num_output,expected", [
    ({"temperature": 0}, 0, True),
    ({"top_k": 1, "temperature": 0.7}, 0, True),
    ({"temperature": 0.7}, 0, False),
    ({"temperature": 0, "repetition_penalty": 1.1}, 0, False),
    ({"temperature": 0, "frequency_penalty": 0.5}, 0, False),
    ({"temperature": 0, "presence_penalty": -0.5}, 0, False),
    ({"temperature": 0, "logit_bias": {5: 3.0}}, 0, False),
    ({"temperature": 0, "min_tokens": 3, "max_tokens": 8}, 2, False),  # EOS still masked
    ({"temperature": 0, "min_tokens": 3, "max_tokens": 8}, 3, True),
])
def test_is_plain_greedy_only_when_sample_would_be_a_raw_argmax(fields, num_output, expected):
    assert Sampler(SamplingParams(**fields)).is_plain_greedy(num_output) is expected
