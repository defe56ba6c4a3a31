"""The replay harness (serving/tuning/replay.py) on the real SmolLM2: every recorded shape is replayed with
its lengths, on the scaled schedule, and measured."""

from __future__ import annotations

import random

import pytest

from serving.engine.llm_engine import EngineConfig
from serving.tuning.replay import pooled_prompt, replay, synthetic_prompt
from serving.tuning.traffic import RequestShape


def test_synthetic_prompts_are_seeded_and_avoid_the_special_ids():
    a = synthetic_prompt(50, 49152, random.Random(3))
    assert a == synthetic_prompt(50, 49152, random.Random(3)) and len(a) == 50
    assert all(256 <= t < 49152 - 256 for t in a)


def test_pooled_prompts_take_the_pool_in_turn_repeated_or_cut():
    pool = [[1, 2, 3], [4, 5]]
    assert pooled_prompt(7, pool, 0) == [1, 2, 3, 1, 2, 3, 1]
    assert pooled_prompt(1, pool, 3) == [4] and pooled_prompt(4, pool, 1) == [4, 5, 4, 5]


@pytest.mark.slow
def test_replay_generates_the_recorded_lengths_on_the_scaled_schedule(smollm2_fp32):
    mix = [RequestShape(30, 5, 0.0), RequestShape(12, 3, 0.0, "sampled"), RequestShape(40, 4, 2.0)]
    result = replay(smollm2_fp32, EngineConfig(max_num_batched_tokens=32), mix, speedup=4.0)
    assert result.num_requests == 3 and result.num_output_tokens == 12
    assert len(result.ttft_s) == 3 and all(t > 0 for t in result.ttft_s) and len(result.itl_s) == 3
    assert result.duration_s >= 0.5  # the last request arrives at 2.0 s / 4
    assert result.output_tokens_per_s == pytest.approx(12 / result.duration_s)
    assert result.ttft_p99_s >= result.ttft_p50_s > 0
    assert result.summary()["num_output_tokens"] == 12
    with pytest.raises(ValueError, match="exceed"):
        replay(smollm2_fp32, EngineConfig(num_blocks=2), [RequestShape(100, 2)])
    with pytest.raises(ValueError):
        replay(smollm2_fp32, EngineConfig(), [])
