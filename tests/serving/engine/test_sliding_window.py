"""Sliding-window layers keep only the KV blocks their window needs (`serving.engine.sliding_block_manager`).

Most tests use a tiny random Gemma-3-shaped model (window W = 8, block size 4, a global layer after
each sliding one), so the window slides many times within ~50 tokens; one test checks the real
Gemma 3 270M past its 512-token window. References: the same engine with one shared pool (no
blocks released), and `CausalLM.prefill_logits` (a throwaway cache holding every position).
"""

from __future__ import annotations

import math
import types

import pytest
import torch

from kernels import register, registered
from serving import SamplingParams
from serving.config import ModelConfig
from serving.engine.llm_engine import EngineConfig, LLMEngine
from serving.engine.sliding_block_manager import NULL_BLOCK, max_blocks_per_seq
from serving.model_loader import LoadedModel
from serving.models import build_model

W, BS, CHUNK = 8, 4, 12
GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, logprobs=0)


class _ToyTokenizer:
    eos_token_ids = ()

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))

    def id_to_token(self, token_id):
        return str(token_id)


@pytest.fixture(scope="module")
def tiny():
    cfg = ModelConfig(architecture="gemma3", vocab_size=97, hidden_size=32, intermediate_size=64, num_layers=4,
                      num_heads=2, num_kv_heads=1, head_dim=16, rms_norm_eps=1e-6, rope_theta=10000.0,
                      context_length=1024, rope_local_theta=10000.0, sliding_window=W, sliding_window_pattern=2,
                      query_pre_attn_scalar=16)
    torch.manual_seed(0)
    model = build_model(cfg, torch.float32)
    for name, p in model.named_parameters():  # std 0.05, zero norms: greedy outputs that vary
        p.zero_() if "norm" in name else p.normal_(0, 0.05)
    return LoadedModel(types.SimpleNamespace(name="tiny-gemma3"), cfg, model, _ToyTokenizer(), None, torch.float32, 1024, 0.0)


def _engine(tiny, **kw) -> LLMEngine:
    return LLMEngine(tiny, EngineConfig(**{"block_size": BS, "num_blocks": 400, "max_num_batched_tokens": CHUNK,
                                           "max_num_seqs": 4, "enable_prefix_caching": False, **kw}))


def _prompts(lengths: list[int]) -> dict[str, list[int]]:
    gen = torch.Generator().manual_seed(1)
    return {f"p{i}": torch.randint(0, 97, (n,), generator=gen).tolist() for i, n in enumerate(lengths)}


def _run(engine: LLMEngine, prompts: dict[str, list[int]], params=GREEDY, each_step=None) -> dict:
    for rid, ids in prompts.items():
        engine.add_request(rid, ids, params)
    done = {}
    while engine.has_unfinished_requests:
        for out in engine.step():
            if out.finished:
                done[out.request_id] = [(c.token_ids, c.cumulative_logprob) for c in out.outputs]
        if each_step:
            each_step(engine)
    return done


def _check_invariants(engine: LLMEngine) -> None:
    """The sliding pool's bookkeeping between steps (the global pool's has its own tests)."""
    engine.sliding_block_manager.check_invariants(engine.scheduler.running + engine.scheduler.waiting)


def _is_full(engine: LLMEngine) -> bool:
    sliding = engine.sliding_block_manager
    return engine.block_manager.num_free_blocks == engine.block_manager.num_blocks and sliding.num_free_blocks == sliding.num_blocks


@pytest.fixture
def checked_kernel():
    """paged_attention that asserts every table entry indexes a real row and that, in the sliding pool,
    no null-block entry lies inside a query's window (so a placeholder is never read unmasked)."""
    inner = registered("paged_attention")

    def check(q, k_cache, v_cache, block_tables, seq_lens, query_lens, *, scale, sliding_window=None):
        assert block_tables.min() >= 0 and block_tables.max() < k_cache.shape[0]
        if k_cache.data_ptr() in check.sliding_caches:
            block_size = k_cache.shape[1]
            for b, (s, n) in enumerate(zip(seq_lens, query_lens)):
                first = max(0, s - n - sliding_window + 1) // block_size
                assert (block_tables[b, first : math.ceil(s / block_size)] != NULL_BLOCK).all()
            check.num_sliding_calls += 1
        return inner(q, k_cache, v_cache, block_tables, seq_lens, query_lens, scale=scale, sliding_window=sliding_window)

    check.sliding_caches, check.num_sliding_calls = set(), 0  # data_ptr() of the sliding pool's key tensors
    register("paged_attention", check)
    yield check
    register("paged_attention", inner)


def test_outputs_equal_a_run_that_releases_nothing(tiny, checked_kernel):
    prompts = _prompts([45, 3, 30, 17, 52])  # longer than several windows; chunked; mixed with decodes
    engine = _engine(tiny)
    cache = engine.runner.cache
    checked_kernel.sliding_caches.update(cache.keys[i].data_ptr() for i in cache.sliding_layers)
    released = _run(engine, prompts, each_step=_check_invariants)
    assert checked_kernel.num_sliding_calls > 0 and _is_full(engine)
    null_rows = [engine.runner.cache.keys[i][NULL_BLOCK] for i in sorted(engine.runner.cache.sliding_layers)]
    assert all((row == 0).all() for row in null_rows), "the null block was written"
    kept = _run(_engine(tiny, sliding_window_pool=False), prompts)
    assert released == kept  # tokens and cumulative logprobs, bit for bit
    for rid in ("p0", "p4"):  # and the greedy tokens are the model's, teacher-forced without any paging
        ids, (tokens, _) = prompts[rid], released[rid][0]
        logits = tiny.model.prefill_logits(ids + tokens)[len(ids) - 1 : -1]
        assert logits.argmax(-1).tolist() == tokens


def test_a_long_sequence_holds_a_bounded_number_of_sliding_blocks(tiny):
    engine = _engine(tiny)
    held = []  # (sliding blocks held, global blocks held) of each scheduled sequence, while its step runs
    schedule = engine.scheduler.schedule

    def schedule_and_record():
        plan = schedule()
        held.extend((sum(b != NULL_BLOCK for b in s.sliding_block_table), len(s.block_table)) for s, _ in plan.scheduled)
        return plan

    engine.scheduler.schedule = schedule_and_record
    _run(engine, _prompts([50]), SamplingParams(temperature=0, max_tokens=40, ignore_eos=True), each_step=_check_invariants)
    bound = math.ceil((W + CHUNK) / BS) + 1
    assert max(s for s, _ in held) <= bound and max_blocks_per_seq(W, BS, CHUNK) <= bound
    assert held[-1] == (math.ceil(W / BS) + 1, math.ceil(89 / BS))  # the global table kept growing, the sliding one did not
    assert _is_full(engine)


def _tiny_llama() -> LoadedModel:
    cfg = ModelConfig(architecture="llama", vocab_size=97, hidden_size=32, intermediate_size=64, num_layers=2,
                      num_heads=2, num_kv_heads=1, head_dim=16, rms_norm_eps=1e-6, rope_theta=10000.0, context_length=256)
    model = build_model(cfg, torch.float32)
    for p in model.parameters():
        p.normal_(0, 0.05)
    return LoadedModel(types.SimpleNamespace(name="tiny-llama"), cfg, model, _ToyTokenizer(), None, torch.float32, 256, 0.0)


def test_n_samples_preemption_and_abort_free_both_pools(tiny):
    prompts = _prompts([30, 26, 21])
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    solo = {rid: _run(_engine(tiny), {rid: ids}, params)[rid] for rid, ids in prompts.items()}
    # Room for about two sequences in the global pool, and too few sliding blocks for three windows.
    tight = _engine(tiny, num_blocks=28, num_sliding_blocks=max_blocks_per_seq(W, BS, CHUNK) + 3)
    assert _run(tight, prompts, params, each_step=_check_invariants) == solo
    assert tight.scheduler.num_preemptions > 0 and _is_full(tight)

    forked = _engine(tiny)
    out = _run(forked, {"n": prompts["p0"]}, SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=30), _check_invariants)
    assert len({tuple(tokens) for tokens, _ in out["n"]}) > 1 and _is_full(forked)

    aborted = _engine(tiny)
    for rid, ids in prompts.items():
        aborted.add_request(rid, ids, SamplingParams(n=2, max_tokens=200, seed=0, ignore_eos=True))
    for _ in range(8):
        aborted.step()
    assert aborted.sliding_block_manager.num_used_blocks > 0
    for rid in prompts:
        aborted.abort_request(rid)
    assert _is_full(aborted) and not aborted.has_unfinished_requests


def test_models_without_sliding_layers_keep_one_pool():
    engine = LLMEngine(_tiny_llama(), EngineConfig(block_size=BS, num_blocks=64))
    assert engine.sliding_block_manager is None and engine.block_manager.enable_prefix_caching
    assert not engine.runner.cache.sliding_layers and engine.runner.cache.num_blocks == 64
    assert _run(engine, _prompts([9]), SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))


@pytest.mark.slow
def test_gemma3_past_its_window_matches_teacher_forced_greedy(gemma3, real_prompts):
    text = " ".join(real_prompts * 4)
    prompt = gemma3.tokenizer.encode(text)[:700]
    assert len(prompt) == 700 > gemma3.loaded.config.sliding_window
    engine = LLMEngine(gemma3.loaded, EngineConfig())
    assert engine.sliding_block_manager is not None and not engine.block_manager.enable_prefix_caching
    tokens = _run(engine, {"long": prompt}, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))["long"][0][0]
    logits = gemma3.loaded.model.prefill_logits(prompt + tokens)[len(prompt) - 1 : -1]
    for step, (row, token) in enumerate(zip(logits, tokens)):
        top2 = row.topk(2)
        if int(top2.indices[0]) != token:  # accepted only at a near tie, as in test_engine
            assert float(top2.values[0] - row[token]) < 1e-4, f"step {step} diverged"
    assert _is_full(engine)
