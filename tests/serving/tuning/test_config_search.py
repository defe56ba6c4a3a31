"""The configuration search (serving/tuning/config_search.py) with fake measurements whose best candidate is
worked out by hand, the p99 TTFT constraint included."""

from __future__ import annotations

import pytest

from serving.engine.llm_engine import EngineConfig
from serving.spec_decode.config import SpeculativeConfig
from serving.tuning.config_search import Measurement, apply, canonical, describe, from_json, search, to_json

SPACE = {"max_num_batched_tokens": (256, 512, 2048), "max_num_seqs": (8, 32), "block_size": (16, 32)}
# Per override: (throughput delta in tokens/s, p99 TTFT delta in s) over the default's 100 tok/s and 1.0 s.
EFFECT = {("max_num_batched_tokens", 256): (-10, -0.2), ("max_num_batched_tokens", 2048): (30, 0.2),
          ("max_num_seqs", 8): (5, 0.5), ("block_size", 32): (20, 0.0)}


def fake(candidate: dict) -> Measurement:
    thr, ttft = 100.0, 1.0
    for item in candidate.items():
        d_thr, d_ttft = EFFECT.get(item, (0, 0))
        thr, ttft = thr + d_thr, ttft + d_ttft
    return Measurement(thr, ttft)


def test_picks_the_fastest_candidate_within_the_default_p99_ttft():
    seen = []
    outcome = search(fake, space=SPACE, budget=20, confirm=1, progress=lambda c, m: seen.append(c))
    # chunk 2048 is faster (130) but its p99 TTFT (1.2 s) is over the default's 1.0 s; 256 is slower;
    # max_num_seqs 8 is over the TTFT limit; block size 32 is faster at the same TTFT: 120 tok/s.
    assert outcome.winner == {"block_size": 32}
    assert outcome.winner_measurement == Measurement(120.0, 1.0)
    assert outcome.default_measurement == Measurement(100.0, 1.0)
    assert outcome.speedup == pytest.approx(1.2)
    # default, 256, 2048, seqs 8, block 32, then the confirmation pair
    assert seen == [{}, {"max_num_batched_tokens": 256}, {"max_num_batched_tokens": 2048}, {"max_num_seqs": 8},
                    {"block_size": 32}, {}, {"block_size": 32}]


def test_a_ttft_slack_admits_the_bigger_chunk_and_dimensions_combine():
    outcome = search(fake, space=SPACE, budget=20, confirm=0, ttft_slack=0.25)
    assert outcome.winner == {"max_num_batched_tokens": 2048, "block_size": 32}
    assert outcome.winner_measurement == Measurement(150.0, 1.2)


def test_the_budget_limits_measurements_and_the_default_wins_when_nothing_beats_it():
    outcome = search(fake, space=SPACE, budget=2)
    assert outcome.winner == {} and len(outcome.trials) == 2 and outcome.speedup == 1.0


def test_a_winner_that_loses_its_confirmation_is_dropped():
    calls = {"n": 0}

    def lucky_once(candidate: dict) -> Measurement:
        if candidate == {"block_size": 32}:
            calls["n"] += 1
            return Measurement(120.0 if calls["n"] == 1 else 90.0, 1.0)
        return Measurement(100.0, 1.0)

    outcome = search(lucky_once, space={"block_size": (16, 32)}, budget=5, confirm=2)
    # block 32 measured 120, 90, 90 (median 90) against the default's 100, 100, 100
    assert outcome.winner == {} and outcome.winner_measurement.output_tokens_per_s == 100.0


def test_repeats_compare_medians_and_count_against_the_budget():
    noisy = {"n": 0}

    def one_lucky_run(candidate: dict) -> Measurement:
        if candidate == {"block_size": 32}:
            noisy["n"] += 1
            return Measurement(150.0 if noisy["n"] == 1 else 95.0, 1.0)  # median of 150, 95, 95: 95
        return Measurement(100.0, 1.0)

    outcome = search(one_lucky_run, space={"block_size": (16, 32)}, budget=6, repeats=3)
    assert outcome.winner == {} and len(outcome.trials) == 6
    assert search(fake, space=SPACE, budget=5, repeats=2).trials[-1][0] == {"max_num_batched_tokens": 256}
    with pytest.raises(ValueError):
        search(fake, repeats=0)


def test_candidates_round_trip_and_apply_to_the_engine_config():
    spec = SpeculativeConfig(num_speculative_tokens=3, disable_by_batch_size=5)
    candidate = canonical({"max_num_seqs": 32, "block_size": 32, "speculative": spec})
    assert candidate == {"block_size": 32, "speculative": spec}  # 32 sequences is the default
    assert from_json(to_json(candidate)) == candidate
    config = apply(EngineConfig(), candidate)
    assert config.block_size == 32 and config.speculative == spec and config.max_num_seqs == 32
    assert describe(candidate) == "block_size=32 speculative=ngram k1-3 b<5" and describe({}) == "default"
    # A winner stored before disable_by_batch_size: max_batch_size B (off above B) is the threshold B + 1.
    legacy = {"speculative": {**to_json({"speculative": spec})["speculative"], "max_batch_size": 4}}
    del legacy["speculative"]["disable_by_batch_size"]
    assert from_json(legacy) == {"speculative": spec}
    with pytest.raises(ValueError):
        search(fake, budget=0)
