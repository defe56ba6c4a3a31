"""Seeded requests with n > 1 on a tiny random model: sample i draws from seed + i wrapped into the signed 64-bit
range, so a valid OpenAI seed at the top of that range (2**63 - 1) forks its samples instead of raising inside
an engine step, which stopped the engine loop for every request."""

from __future__ import annotations

import pytest

from serving import SamplingParams
from serving.engine.llm_engine import EngineConfig, LLMEngine
from tests.serving.engine.test_sliding_window import _tiny_llama

PROMPT = [5, 17, 42, 8, 61, 3]


@pytest.fixture(scope="module")
def tiny():
    """A tiny random Llama (vocabulary 97) with a toy tokenizer."""
    return _tiny_llama()


def _first_tokens(model, params: SamplingParams) -> list[int]:
    """The first token of each of the request's samples, in sample order."""
    engine = LLMEngine(model, EngineConfig(block_size=4, num_blocks=64, max_num_batched_tokens=12, max_num_seqs=4))
    engine.add_request("r", PROMPT, params)
    while engine.has_unfinished_requests:
        finished = [out for out in engine.step() if out.finished]
    return [c.token_ids[0] for c in sorted(finished[0].outputs, key=lambda c: c.index)]


def test_a_seed_at_the_top_of_the_range_forks_to_wrapped_seeds(tiny):
    forked = _first_tokens(tiny, SamplingParams(n=3, seed=2**63 - 1, temperature=1.0, max_tokens=1))
    # each sample alone, seeded as the wrap gives it: 2**63 - 1, then -2**63, then -2**63 + 1
    alone = [_first_tokens(tiny, SamplingParams(seed=seed, temperature=1.0, max_tokens=1))[0]
             for seed in (2**63 - 1, -(2**63), -(2**63) + 1)]
    assert forked == alone
