"""The batching engine on the real models: batch invariance, prefix caching, preemption, abort, n > 1.

Every engine here is built with `tuned_kernels=False`: the kernels the session's first engine installed stay in
effect process-wide (`kernels.dispatch`), and warming up the stored winners again for each of these engines would
take seconds and test nothing about scheduling. The solo runs of a test share one engine without prefix caching,
which keeps no state between requests.
"""

from __future__ import annotations

import pytest

from serving import SamplingParams
from serving.engine.llm_engine import EngineConfig, LLMEngine

pytestmark = pytest.mark.slow  # loads a real model (tests/test_markers.py)

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
# Batch invariance: 16 tokens per prompt, alone and in the batch of 8 (a batching error shows from the first step).
INVARIANCE = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
TOP2_TOLERANCE = 1e-4


def _config(**settings) -> EngineConfig:
    return EngineConfig(tuned_kernels=False, **settings)


def _solo(engine: LLMEngine, prompts: dict[str, list[int]], params=GREEDY) -> dict[str, list[int]]:
    """Each prompt's output run alone, one after the other, on `engine`."""
    return {rid: _run_all(engine, {rid: ids}, params)[rid] for rid, ids in prompts.items()}


def _run_all(engine: LLMEngine, prompts: dict[str, list[int]], params=GREEDY) -> dict[str, list[int]]:
    for request_id, ids in prompts.items():
        engine.add_request(request_id, ids, params)
    done = {}
    for _ in range(10_000):
        if not engine.has_unfinished_requests:
            break
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.outputs[0].token_ids
    assert not engine.has_unfinished_requests, "engine did not finish"
    return done


def _prompts(llm, real_prompts) -> dict[str, list[int]]:
    fmt = llm.loaded.chat_format
    extra = ["Hi", "Explain in one paragraph why the sky is blue, and mention Rayleigh scattering by name, please."]
    texts = [*real_prompts, *extra]
    return {f"p{i}": llm.tokenizer.encode(fmt.render([{"role": "user", "content": t}]), add_special_tokens=fmt.add_special_tokens)
            for i, t in enumerate(texts)}


def _assert_same_or_near_tie(llm, prompt_ids, alone, batched):
    """Equal tokens, or a divergence at a step whose top-two logits differ by less than 1e-4."""
    if alone == batched:
        return
    step = next(i for i, (a, b) in enumerate(zip(alone, batched)) if a != b)
    logits = llm.loaded.model.prefill_logits(prompt_ids + alone[:step])[-1]
    top2 = logits.topk(2).values
    gap = float(top2[0] - top2[1])
    assert gap < TOP2_TOLERANCE, f"batched output diverged at step {step} where the top-2 gap is {gap:.2e}"


@pytest.mark.parametrize("model_fixture", ["smollm2", "gemma3"])
def test_batch_invariance(model_fixture, request, real_prompts):
    llm = request.getfixturevalue(model_fixture)
    prompts = _prompts(llm, real_prompts)
    assert len(prompts) == 8 and len({len(p) for p in prompts.values()}) >= 7  # different lengths
    config = _config(enable_prefix_caching=False)
    alone = _solo(LLMEngine(llm.loaded, config), prompts, INVARIANCE)
    batched = _run_all(LLMEngine(llm.loaded, config), prompts, INVARIANCE)
    for rid, ids in prompts.items():
        _assert_same_or_near_tie(llm, ids, alone[rid], batched[rid])


def test_prefix_caching_reuses_blocks_with_the_same_output(smollm2, real_prompts):
    shared = smollm2.tokenizer.encode(" ".join(real_prompts[:3]))  # a long shared prefix
    first, second = shared + smollm2.tokenizer.encode(" Summarize."), shared + smollm2.tokenizer.encode(" Translate to French.")
    cached = LLMEngine(smollm2.loaded, _config())
    out_first = _run_all(cached, {"a": first})["a"]
    hits_before = cached.block_manager.prefix_cache_hits
    out_second = _run_all(cached, {"b": second})["b"]
    reused = cached.block_manager.prefix_cache_hits - hits_before
    assert reused >= (len(shared) // 16 - 1) * 16 > 0
    uncached = LLMEngine(smollm2.loaded, _config(enable_prefix_caching=False))
    assert _run_all(uncached, {"b": second})["b"] == out_second
    assert uncached.block_manager.prefix_cache_hits == 0
    assert out_first  # the first request ran to completion as well


def test_preemption_completes_every_request_with_its_solo_output(smollm2, real_prompts):
    prompts = dict(list(_prompts(smollm2, real_prompts).items())[:4])
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    longest = max(len(p) for p in prompts.values()) + 40
    # Room for about two sequences at a time: the others must be preempted and recomputed.
    num_blocks = 2 * (-(-longest // 16)) + 1
    alone = _solo(LLMEngine(smollm2.loaded, _config(enable_prefix_caching=False)), prompts, params)
    tight = LLMEngine(smollm2.loaded, _config(num_blocks=num_blocks, enable_prefix_caching=False))
    squeezed = _run_all(tight, prompts, params)
    assert tight.scheduler.num_preemptions > 0
    for rid, ids in prompts.items():
        _assert_same_or_near_tie(smollm2, ids, alone[rid], squeezed[rid])
    assert tight.block_manager.num_free_blocks == num_blocks


def test_abort_frees_blocks_within_one_step(smollm2):
    engine = LLMEngine(smollm2.loaded, _config())
    total = engine.block_manager.num_free_blocks
    params = SamplingParams(max_tokens=200, seed=0, ignore_eos=True)
    engine.add_request("x", smollm2.tokenizer.encode("Write a long story about a dragon."), params)
    engine.add_request("y", smollm2.tokenizer.encode("Count to one hundred."), params)
    for _ in range(3):
        engine.step()
    assert engine.block_manager.num_free_blocks < total
    engine.abort_request("x")
    engine.abort_request("y")
    assert engine.block_manager.num_free_blocks == total and not engine.has_unfinished_requests
    assert engine.step() == []


def test_n_samples_share_the_prompt_blocks(smollm2):
    engine = LLMEngine(smollm2.loaded, _config(enable_prefix_caching=False))
    prompt = smollm2.tokenizer.encode("Once upon a time, in a faraway kingdom, there lived")  # partial last block
    engine.add_request("n", prompt, SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=8))
    prompt_blocks = -(-len(prompt) // 16)
    engine.step()  # prefill once, fork two children
    used = engine.block_manager.num_used_blocks
    assert used == prompt_blocks  # the children share the prompt's blocks
    outputs = None
    while engine.has_unfinished_requests:
        for out in engine.step():
            outputs = out
    assert [c.index for c in outputs.outputs] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in outputs.outputs}) > 1
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_chunked_prefill_never_shares_blocks_before_their_kv_exists(smollm2, real_prompts):
    prompt = smollm2.tokenizer.encode(" ".join(real_prompts[:4]))
    assert len(prompt) > 64
    engine = LLMEngine(smollm2.loaded, _config(max_num_batched_tokens=32))
    engine.add_request("a", prompt, GREEDY)
    engine.step()  # "a" has prefilled only its first 32 tokens
    assert engine.block_manager.prefix_cache_hits == 0
    done = _run_all(engine, {"b": prompt})  # same prompt while "a" is mid-prefill
    solo = _run_all(LLMEngine(smollm2.loaded, _config(enable_prefix_caching=False)), {"s": prompt})["s"]
    assert done["b"] == solo
