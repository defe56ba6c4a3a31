"""Helpers shared by the block manager tests (test_block_manager.py, test_prefix_cache.py).

Block size 4 in hand-checked cases, so block i holds positions [4i, 4i + 4).
"""

from __future__ import annotations

from serving.engine.block_manager import BlockManager
from serving.engine.sequence import Sequence

BS = 4


def allocate_prefilled(bm: BlockManager, seq: Sequence) -> None:
    """allocate() followed by what the engine does once the prefill step ran: register the prompt's full blocks."""
    bm.allocate(seq)
    computed = seq.num_computed_tokens
    seq.num_computed_tokens = seq.num_tokens
    bm.mark_computed(seq)
    seq.num_computed_tokens = computed


def seq(seq_id: int, tokens: list[int] | range) -> Sequence:
    return Sequence(seq_id=seq_id, prompt_token_ids=list(tokens))


def append(bm: BlockManager, s: Sequence, token: int) -> tuple[int, int] | None:
    s.append_token(token)
    return bm.append_slot(s)
