"""Swap a running `LLMEngine`'s `EngineConfig` between two steps, without losing a request.

    reconfigure(engine, dataclasses.replace(engine.config, max_num_seqs=8, block_size=32))

Every sequence that holds KV blocks is preempted by recomputation, as the scheduler does when blocks
run out (Kwon et al. 2023, arXiv:2309.06180): its blocks are dropped, its prompt and the tokens it
generated so far stay, and it is prefilled again under the new settings. Then everything built from
the config (block managers, KV cache, scheduler, model runner, and whatever else `LLMEngine.__init__`
derives from it) is rebuilt by constructing a fresh engine on the same loaded model, and the request
state (requests, their sequences, samplers, detokenizers, stop state) moves over unchanged. Greedy
requests therefore finish with the same tokens as without the swap, up to float rounding of the
re-prefill (`tests/serving/tuning/test_reconfigure.py` checks it on SmolLM2).

Call it only between steps: from the thread that steps the engine (`reconfigure_between_steps` queues
it for an `AsyncLLMEngine`'s loop).
"""

from __future__ import annotations

import dataclasses
import logging

from serving.engine.async_engine import AsyncLLMEngine
from serving.engine.llm_engine import EngineConfig, LLMEngine
from serving.engine.sequence import SequenceStatus

logger = logging.getLogger(__name__)

# The engine's per-request state: kept across a swap. Everything else in the engine is rebuilt.
_REQUEST_STATE = ("_requests", "_seq_to_request", "_seq_ids", "_token_table")


def reconfigure(engine: LLMEngine, config: EngineConfig) -> int:
    """Apply `config` to `engine` in place; returns how many sequences were re-queued for recomputation.

    The stored kernel winners are not installed again (they are process-wide and already in place);
    `engine.config` is `config` afterwards, `tuned_kernels` included.

    Raises:
        ValueError: a live sequence would not fit in the new KV cache (nothing is changed then).
    """
    sequences = [seq for request in engine._requests.values() for seq in request.seqs if not seq.is_finished]
    fresh = LLMEngine(engine.loaded, dataclasses.replace(config, tuned_kernels=False))
    capacity = fresh.block_manager.num_blocks
    too_long = [seq.seq_id for seq in sequences if seq.num_blocks(fresh.block_manager.block_size) > capacity]
    if too_long:
        raise ValueError(f"sequences {too_long} do not fit in the {capacity} KV blocks of the new configuration")
    old = engine.scheduler
    # Order: what was running first (it had the earlier turn), then the waiting queue, as preemption does.
    ordered = [s for s in old.running if not s.is_finished] + [s for s in old.waiting if not s.is_finished]
    ordered += [s for s in sequences if s not in ordered]
    for seq in ordered:
        old.block_manager.free(seq)  # resets num_computed_tokens and num_cached_tokens
        if old.sliding is not None:
            old.sliding.free(seq)
        seq.status = SequenceStatus.PREEMPTED
        if getattr(seq, "draft_token_ids", None):  # speculative drafts are proposed again under the new config
            seq.draft_token_ids = []
    kept = {name: getattr(engine, name) for name in _REQUEST_STATE if hasattr(engine, name)}
    engine.__dict__.update({k: v for k, v in fresh.__dict__.items() if k not in _REQUEST_STATE})
    engine.__dict__.update(kept)
    engine.config = config
    for seq in ordered:
        engine.scheduler.waiting.append(seq)  # priority and arrival time unchanged: the order holds
    engine.scheduler.num_preemptions = old.num_preemptions + len(ordered)
    return len(ordered)


def reconfigure_between_steps(engine: AsyncLLMEngine, config: EngineConfig) -> None:
    """`reconfigure` a running `AsyncLLMEngine`'s `LLMEngine` before its next step: running requests are
    preempted by recomputation and continue under `config`. A configuration the live requests do not fit
    in is logged (a warning) and not applied; the engine goes on under its old one."""

    def apply(inner: LLMEngine) -> None:
        try:
            reconfigure(inner, config)
        except ValueError as exc:
            logger.warning("engine configuration not applied: %s", exc)

    engine.call_between_steps(apply)
