"""Speculative decoding in the engine, on the real SmolLM2-135M-Instruct and gemma-3-270m.

Greedy outputs with speculation on (n-gram drafting, adaptive or a fixed k) must equal those with it
off, token for token; drafts must actually be accepted on prompts that quote their input (HumanEval
functions to copy with a small edit); rejected drafts that crossed a KV block boundary must give their
blocks back; every block returns to the pool once the requests finish.
"""

from __future__ import annotations

import gzip
import json

import pytest

from serving.engine.llm_engine import EngineConfig, LLMEngine
from serving.sampling.params import SamplingParams
from serving.spec_decode import SpeculativeConfig

pytestmark = pytest.mark.slow  # loads a real model (tests/test_markers.py)

ADAPTIVE = SpeculativeConfig()
FIXED_3 = SpeculativeConfig(num_speculative_tokens=3, adaptive=False)
GREEDY = SamplingParams(temperature=0, max_tokens=32)


@pytest.fixture(scope="module")
def edit_prompts(data_dir) -> list[str]:
    """Three code-editing requests that quote a HumanEval solution."""
    with gzip.open(data_dir / "human-eval/HumanEval.jsonl.gz", "rt") as f:
        problems = [json.loads(line) for line in f][:3]
    return [f"Rename the function `{p['entry_point']}` to `solve` and repeat the whole code otherwise unchanged:\n\n"
            f"```python\n{p['prompt']}{p['canonical_solution']}```" for p in problems]


def _encode(llm, text: str) -> list[int]:
    rendered = llm.loaded.chat_format.render([{"role": "user", "content": text}])
    return llm.loaded.tokenizer.encode(rendered, add_special_tokens=False)


def generate(llm, prompts: list[list[int]], params: SamplingParams, spec: SpeculativeConfig | None, **config):
    """Final `RequestOutput`s of `prompts` run together; checks every KV block came back."""
    engine = LLMEngine(llm.loaded, EngineConfig(kv_cache_bytes=48 * 2**20, speculative=spec, tuned_kernels=False, **config))
    free = engine.block_manager.num_free_blocks
    sliding = engine.sliding_block_manager
    free_sliding = sliding.num_free_blocks if sliding is not None else None
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, params)
    finals = {}
    while engine.has_unfinished_requests:
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out
        _check_prefix_hashes(engine)
    assert engine.block_manager.num_free_blocks == free, "KV blocks leaked"
    if sliding is not None:
        assert sliding.num_free_blocks == free_sliding, "sliding-window blocks leaked"
    return [finals[str(i)] for i in range(len(prompts))]


def _check_prefix_hashes(engine) -> None:
    """Between steps: each running sequence's full computed blocks carry the chained hash of its real
    tokens (never a rejected draft's), later blocks none, and the sliding table covers the computed tokens."""
    bm = engine.block_manager
    for seq in engine.scheduler.running:
        assert not seq.draft_token_ids
        num_full = seq.num_computed_tokens // bm.block_size
        if bm.enable_prefix_caching:
            assert [bm.blocks[b].hash for b in seq.block_table[:num_full]] == bm._block_hashes(seq.token_ids, num_full)
            assert all(bm.blocks[b].hash is None for b in seq.block_table[seq.num_tokens // bm.block_size:])
        if seq.num_computed_tokens == seq.num_tokens - 1:  # decoding: no block past the computed tokens
            assert len(seq.block_table) == -(-seq.num_computed_tokens // bm.block_size)
    if engine.sliding_block_manager is not None:
        engine.sliding_block_manager.check_invariants(s for s in engine.scheduler.running if s.sliding_block_table)


def _tokens(outputs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


def test_smollm2_greedy_speculation_is_exact(smollm2, edit_prompts):
    prompts = [_encode(smollm2, edit_prompts[0])]
    off = generate(smollm2, prompts, GREEDY, None)
    assert off[0].speculative is None
    for spec in (ADAPTIVE, FIXED_3):
        on = generate(smollm2, prompts, GREEDY, spec)
        assert _tokens(on) == _tokens(off), spec
        assert on[0].outputs[0].text == off[0].outputs[0].text
        stats = on[0].speculative
        assert stats.num_accepted_tokens > 0 and stats.num_draft_steps > 0
        assert stats.num_draft_tokens <= spec.num_speculative_tokens * stats.num_draft_steps


def test_smollm2_concurrent_batch_with_small_blocks_rolls_back_rejected_drafts(smollm2, edit_prompts):
    # Blocks of 4 tokens and 5 drafts per step: most draft spans cross a block boundary, and a rejected
    # one must return its block; three requests decode together.
    prompts = [_encode(smollm2, p) for p in edit_prompts]
    params = SamplingParams(temperature=0, max_tokens=24)
    off = generate(smollm2, prompts, params, None, block_size=4)
    on = generate(smollm2, prompts, params, SpeculativeConfig(num_speculative_tokens=5, adaptive=False), block_size=4)
    assert _tokens(on) == _tokens(off)
    assert sum(o.speculative.num_accepted_tokens for o in on) > 0
    assert sum(o.speculative.num_rejected_tokens for o in on) > 0


def test_smollm2_penalties_logprobs_and_sampling_under_speculation(smollm2, edit_prompts):
    prompts = [_encode(smollm2, edit_prompts[1])]
    # Greedy with a repetition penalty goes through the full logits processing, not the plain argmax.
    penalized = SamplingParams(temperature=0, max_tokens=20, repetition_penalty=1.1, logprobs=2)
    off, on = generate(smollm2, prompts, penalized, None), generate(smollm2, prompts, penalized, ADAPTIVE)
    assert _tokens(on) == _tokens(off)
    for a, b in zip(on[0].outputs[0].logprobs, off[0].outputs[0].logprobs):
        assert a.keys() == b.keys()
        assert all(abs(a[t].logprob - b[t].logprob) < 1e-3 for t in a)
    sampled = generate(smollm2, prompts, SamplingParams(temperature=0.8, top_p=0.95, seed=7, max_tokens=20), ADAPTIVE)
    assert len(sampled[0].outputs[0].token_ids) == 20 and sampled[0].speculative.num_draft_steps > 0


def _run_staggered(llm, prompts: list[list[int]], lengths: list[int], spec: SpeculativeConfig | None):
    """Greedy outputs of `prompts` submitted together, request i stopping after lengths[i] tokens, and per
    step (running sequences as it starts, whether the forward pass carried draft tokens)."""
    engine = LLMEngine(llm.loaded, EngineConfig(kv_cache_bytes=48 * 2**20, speculative=spec, tuned_kernels=False))
    drafted = []
    execute = engine.runner.execute

    def spy(scheduled, *args):
        drafted.append(any(seq.draft_token_ids for seq, _ in scheduled))
        return execute(scheduled, *args)

    engine.runner.execute = spy
    for i, (prompt, n) in enumerate(zip(prompts, lengths)):
        engine.add_request(str(i), prompt, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
    tokens, steps = {}, []
    while engine.has_unfinished_requests:
        num_running = len(engine.scheduler.running)
        tokens.update({o.request_id: o.outputs[0].token_ids for o in engine.step() if o.finished})
        steps.append((num_running, drafted[-1]))
    return [tokens[str(i)] for i in range(len(prompts))], steps


def test_smollm2_speculates_only_below_the_batch_threshold(smollm2, edit_prompts):
    # Four requests of 6, 12, 18 and 24 tokens: while four run, each step is a plain decode step (no
    # drafts); as they finish, the three, two and one left speculate again; the tokens never change.
    prompts = [_encode(smollm2, p) for p in edit_prompts + edit_prompts[:1]]
    lengths = [6, 12, 18, 24]
    spec = SpeculativeConfig(num_speculative_tokens=4, disable_by_batch_size=4)
    on, steps = _run_staggered(smollm2, prompts, lengths, spec)
    off, _ = _run_staggered(smollm2, prompts, lengths, None)
    assert on == off
    assert [n for n, _ in steps if n >= 4] and not any(d for n, d in steps if n >= 4)
    assert any(d for _, d in steps)  # and so only with fewer than four running


def test_guided_requests_do_not_speculate(smollm2):
    params = SamplingParams(temperature=0, max_tokens=12, guided_json='{"type": "object"}')
    out = generate(smollm2, [_encode(smollm2, "Give me an empty JSON object.")], params, ADAPTIVE)
    assert out[0].speculative.num_draft_tokens == 0


def test_gemma3_greedy_speculation_is_exact_across_the_sliding_window(gemma3, edit_prompts):
    # Over 512 tokens (Gemma 3's window): the sliding-window pool releases blocks while drafts run.
    text = "\n\n".join(edit_prompts) + "\n\nOnly the first function, please."
    prompts = [_encode(gemma3, text)]
    assert len(prompts[0]) > gemma3.loaded.config.sliding_window
    params = SamplingParams(temperature=0, max_tokens=24)
    off = generate(gemma3, prompts, params, None)
    on = generate(gemma3, prompts, params, SpeculativeConfig(num_speculative_tokens=4, adaptive=False), block_size=4)
    assert _tokens(on) == _tokens(off)
    assert on[0].speculative.num_accepted_tokens > 0


def test_gemma3_concurrent_adaptive(gemma3, edit_prompts):
    prompts = [_encode(gemma3, p) for p in edit_prompts[:2]]
    params = SamplingParams(temperature=0, max_tokens=20)
    assert _tokens(generate(gemma3, prompts, params, ADAPTIVE)) == _tokens(generate(gemma3, prompts, params, None))


def test_smollm2_drafting_for_itself_is_exact_and_mostly_accepted(smollm2, edit_prompts):
    # A draft model (method "draft"): SmolLM2 drafting for itself, the only same-tokenizer pair we have
    # locally; two concurrent requests so the draft model's catch-up and decode steps run batched.
    prompts = [_encode(smollm2, p) for p in edit_prompts[:2]]
    params = SamplingParams(temperature=0, max_tokens=24)
    spec = SpeculativeConfig(method="draft", draft_model="smollm2-135m-instruct", num_speculative_tokens=4)
    on = generate(smollm2, prompts, params, spec)
    assert _tokens(on) == _tokens(generate(smollm2, prompts, params, None))
    stats = [o.speculative for o in on]
    assert sum(s.num_accepted_tokens for s in stats) >= 0.8 * sum(s.num_draft_tokens for s in stats) > 0


def test_a_draft_model_must_share_the_tokenizer(smollm2, gemma3):
    from serving.errors import ServingError
    from serving.spec_decode.draft_model import check_same_tokenizer

    check_same_tokenizer(smollm2.loaded, smollm2.loaded)
    with pytest.raises(ServingError, match="tokenizer"):
        check_same_tokenizer(gemma3.loaded, smollm2.loaded)
