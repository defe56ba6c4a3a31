"""Swapping the engine configuration between steps (serving/tuning/reconfigure.py) on the real SmolLM2 in
float32: requests in flight finish with exactly the greedy tokens they get without the swap; the
AsyncLLMEngine applies a swap between steps and records the shapes of finished requests."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from serving.engine.llm_engine import EngineConfig, LLMEngine
from serving.sampling.params import SamplingParams
from serving.tuning.reconfigure import reconfigure, reconfigure_between_steps
from serving.tuning.traffic import TrafficRecorder

pytestmark = pytest.mark.slow  # loads a real model (tests/test_markers.py)

TEXTS = ["The capital of France is", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
         "Write a short poem about the sea. " * 14]
PARAMS = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
SMALL = EngineConfig(block_size=32, max_num_seqs=2, max_num_batched_tokens=64, kv_cache_bytes=64 * 2**20, tuned_kernels=False)


@pytest.fixture(scope="module")
def loaded(smollm2_fp32):
    return smollm2_fp32


@pytest.fixture(scope="module")
def prompts(loaded):
    return [loaded.tokenizer.encode(t) for t in TEXTS]


@pytest.fixture(scope="module")
def reference(loaded, prompts):
    engine = LLMEngine(loaded, EngineConfig(tuned_kernels=False))
    return _run(engine, prompts, steps_before_swap=None)


def _run(engine: LLMEngine, prompts, steps_before_swap: int | None, config: EngineConfig = SMALL) -> dict[str, list[int]]:
    for i, ids in enumerate(prompts):
        engine.add_request(f"r{i}", ids, PARAMS)
    tokens, steps = {}, 0
    while engine.has_unfinished_requests:
        if steps == steps_before_swap:
            assert reconfigure(engine, config) == len(prompts)
        for out in engine.step():
            if out.finished:
                tokens[out.request_id] = out.outputs[0].token_ids
        steps += 1
    return tokens


def test_requests_in_flight_keep_their_greedy_tokens_across_a_reconfigure(loaded, prompts, reference):
    assert len(prompts[2]) > 64  # re-prefilled in chunks of 64 after the swap
    engine = LLMEngine(loaded, EngineConfig(tuned_kernels=False))
    got = _run(engine, prompts, steps_before_swap=6)
    assert got == reference and all(len(t) == 12 for t in got.values())
    assert engine.config == SMALL and engine.block_manager.block_size == 32 and engine.runner.cache.block_size == 32
    assert engine.scheduler.config.max_num_seqs == 2 and engine.scheduler.num_preemptions >= 3
    assert engine.block_manager.num_used_blocks == 0


def test_a_configuration_too_small_for_the_live_requests_changes_nothing(loaded, prompts, reference):
    engine = LLMEngine(loaded, EngineConfig(tuned_kernels=False))
    for i, ids in enumerate(prompts):
        engine.add_request(f"r{i}", ids, PARAMS)
    engine.step()
    before = (engine.config, engine.scheduler, engine.block_manager)
    with pytest.raises(ValueError, match="do not fit"):
        reconfigure(engine, dataclasses.replace(SMALL, num_blocks=2))
    assert (engine.config, engine.scheduler, engine.block_manager) == before
    tokens = {}
    while engine.has_unfinished_requests:
        tokens.update({o.request_id: o.outputs[0].token_ids for o in engine.step() if o.finished})
    assert tokens == reference


def test_async_engine_reconfigures_between_steps_and_records_traffic(loaded, prompts, reference):
    from serving.engine.async_engine import AsyncLLMEngine

    async def main():
        engine = AsyncLLMEngine(LLMEngine(loaded, EngineConfig(tuned_kernels=False)))
        engine.traffic = TrafficRecorder()

        async def one(i: int) -> list[int]:
            tokens = []
            async for out in engine.generate(f"r{i}", prompts[i], PARAMS):
                tokens = out.outputs[0].token_ids
                if i == 0 and len(tokens) == 4:
                    reconfigure_between_steps(engine, SMALL)
            return tokens

        try:
            results = await asyncio.gather(*(one(i) for i in range(len(prompts))))
        finally:
            await engine.shutdown()
        return engine, results

    engine, results = asyncio.run(main())
    assert {f"r{i}": t for i, t in enumerate(results)} == reference
    assert engine.engine.config == SMALL
    shapes = engine.traffic.shapes()
    assert sorted((s.prompt_tokens, s.output_tokens, s.kind) for s in shapes) == sorted((len(p), 12, "greedy") for p in prompts)


def test_speculation_switched_on_then_off_mid_flight_keeps_the_greedy_tokens(loaded, prompts, reference):
    from serving.spec_decode.config import SpeculativeConfig

    spec = dataclasses.replace(SMALL, speculative=SpeculativeConfig(num_speculative_tokens=3, disable_by_batch_size=5))
    engine = LLMEngine(loaded, EngineConfig(tuned_kernels=False))
    for i, ids in enumerate(prompts):
        engine.add_request(f"r{i}", ids, PARAMS)
    tokens, steps = {}, 0
    while engine.has_unfinished_requests:
        if steps in (3, 7):  # speculation on (exact greedy acceptance), then off again
            reconfigure(engine, spec if steps == 3 else SMALL)
            assert (engine.speculator is not None) == (steps == 3)
        tokens.update({o.request_id: o.outputs[0].token_ids for o in engine.step() if o.finished})
        steps += 1
    assert tokens == reference


def test_a_swap_the_live_requests_do_not_fit_is_logged_and_they_finish_unchanged(caplog):
    # the toy model (milliseconds): the refused swap leaves the config and the greedy tokens as they were,
    # and `call_between_steps` hands its function the engine between two steps, in the order queued
    from serving.engine.async_engine import AsyncLLMEngine
    from tests.serving.toy_model import TOY_ENGINE, toy_chat_model

    loaded = toy_chat_model()
    prompt = loaded.tokenizer.encode("a prompt longer than one KV block of sixteen tokens")
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    plain = LLMEngine(loaded, TOY_ENGINE)
    plain.add_request("r0", prompt, params)
    expected = []
    while plain.has_unfinished_requests:
        expected += [o.outputs[0].token_ids for o in plain.step() if o.finished]
    seen: list[tuple[str, int]] = []

    async def main():
        engine = AsyncLLMEngine(LLMEngine(loaded, TOY_ENGINE))
        tokens = []
        async for out in engine.generate("r0", prompt, params):
            tokens = out.outputs[0].token_ids
            if len(tokens) == 2:
                engine.call_between_steps(lambda inner: seen.append(("before", len(inner.scheduler.running))))
                reconfigure_between_steps(engine, dataclasses.replace(TOY_ENGINE, num_blocks=1))
                engine.call_between_steps(lambda inner: seen.append(("after", inner.config.num_blocks)))
        await engine.shutdown()
        return engine, tokens

    with caplog.at_level("WARNING", logger="serving.tuning.reconfigure"):
        engine, tokens = asyncio.run(main())
    assert len(prompt) > TOY_ENGINE.block_size
    assert [tokens] == expected and len(tokens) == 6
    assert engine.engine.config == TOY_ENGINE and seen == [("before", 1), ("after", TOY_ENGINE.num_blocks)]
    assert [r.getMessage() for r in caplog.records] == [
        "engine configuration not applied: sequences [0] do not fit in the 1 KV blocks of the new configuration"]
