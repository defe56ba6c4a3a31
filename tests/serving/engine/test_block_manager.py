"""Tests for `serving.engine.sequence` and `serving.engine.block_manager` (pure Python, CPU only): sequences, allocation,
appending, fork and copy-on-write, free. Prefix caching and the random-operations property test are in
test_prefix_cache.py.

Hand-checked cases use block size 4, so block i holds positions [4i, 4i + 4).
"""

from __future__ import annotations

import pytest

from serving.engine.block_manager import BlockManager
from serving.engine.sequence import Sequence, SequenceStatus
from tests.serving.block_cases import BS, allocate_prefilled, append, seq


# -- Sequence -------------------------------------------------------------------------------


def test_sequence_properties() -> None:
    s = seq(0, [5, 6, 7])
    assert (s.num_tokens, s.num_prompt_tokens, s.num_output_tokens, s.last_token_id) == (3, 3, 0, 7)
    s.append_token(9)
    assert s.token_ids == [5, 6, 7, 9] and s.num_output_tokens == 1 and s.last_token_id == 9
    assert s.status is SequenceStatus.WAITING and not s.is_finished
    s.status = SequenceStatus.FINISHED
    assert s.is_finished
    assert [seq(1, range(n)).num_blocks(BS) for n in (1, 4, 5, 8, 10)] == [1, 1, 2, 2, 3]


def test_sequence_rejects_bad_state() -> None:
    with pytest.raises(ValueError, match="at least one token"):
        seq(0, [])
    with pytest.raises(ValueError, match="num_computed_tokens"):
        Sequence(seq_id=0, prompt_token_ids=[1, 2], num_computed_tokens=3)


def test_sequence_copies_its_prompt() -> None:
    prompt = [1, 2, 3]
    s = seq(0, prompt)
    s.append_token(4)
    assert prompt == [1, 2, 3]


# -- construction and allocation ------------------------------------------------------------


@pytest.mark.parametrize("num_blocks, block_size", [(0, 4), (4, 0), (-1, 1)])
def test_init_rejects_bad_sizes(num_blocks: int, block_size: int) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        BlockManager(num_blocks, block_size)


def test_allocate_counts_blocks() -> None:
    bm = BlockManager(num_blocks=10, block_size=BS)
    s = seq(0, range(10))
    assert bm.can_allocate(s)
    allocate_prefilled(bm, s)
    assert len(s.block_table) == 3 and len(set(s.block_table)) == 3
    assert (bm.num_free_blocks, bm.num_used_blocks, bm.usage) == (7, 3, pytest.approx(0.3))
    assert s.num_cached_tokens == 0 and s.num_computed_tokens == 0
    bm.check_invariants([s])


def test_can_allocate_false_and_error_names_the_numbers() -> None:
    bm = BlockManager(num_blocks=2, block_size=BS)
    s = seq(7, range(9))  # 3 blocks
    assert not bm.can_allocate(s)
    with pytest.raises(RuntimeError, match=r"sequence 7: it needs 3 free blocks for 9 tokens, 2 of 2 are free"):
        allocate_prefilled(bm, s)
    assert s.block_table == [] and bm.num_free_blocks == 2


def test_allocate_twice_is_rejected() -> None:
    bm = BlockManager(num_blocks=4, block_size=BS)
    s = seq(0, range(3))
    allocate_prefilled(bm, s)
    with pytest.raises(ValueError, match="already holds 1 blocks"):
        allocate_prefilled(bm, s)


# -- appending ------------------------------------------------------------------------------


def test_append_within_a_block_takes_nothing() -> None:
    bm = BlockManager(num_blocks=4, block_size=BS)
    s = seq(0, range(5))
    allocate_prefilled(bm, s)
    for token in (5, 6, 7):
        s.append_token(token)
        assert bm.can_append(s)
        assert bm.append_slot(s) is None
        assert len(s.block_table) == 2 and bm.num_free_blocks == 2
    bm.check_invariants([s])


def test_crossing_a_block_boundary_takes_exactly_one_block() -> None:
    bm = BlockManager(num_blocks=4, block_size=BS)
    s = seq(0, range(8))
    allocate_prefilled(bm, s)
    s.append_token(8)
    assert bm.can_append(s)
    assert bm.append_slot(s) is None
    assert len(s.block_table) == 3 and bm.num_free_blocks == 1
    bm.check_invariants([s])


def test_append_without_a_free_block() -> None:
    bm = BlockManager(num_blocks=1, block_size=BS)
    s = seq(3, range(4))
    allocate_prefilled(bm, s)
    s.append_token(4)
    assert not bm.can_append(s)
    with pytest.raises(RuntimeError, match="sequence 3: it needs 1 free block, 0 of 1 are free"):
        bm.append_slot(s)


def test_append_slot_rejects_a_stale_table() -> None:
    bm = BlockManager(num_blocks=4, block_size=BS)
    s = seq(0, range(4))
    allocate_prefilled(bm, s)
    for token in (4, 5, 6, 7, 8):
        s.append_token(token)  # two blocks' worth without append_slot
    with pytest.raises(ValueError, match="1 blocks for 9 tokens"):
        bm.append_slot(s)
    with pytest.raises(ValueError, match="0 blocks"):
        bm.append_slot(seq(1, [1]))


def test_block_filled_by_decoding_is_registered() -> None:
    bm = BlockManager(num_blocks=10, block_size=BS)
    a = seq(0, range(6))
    allocate_prefilled(bm, a)
    for token in (50, 51, 52):  # fills block 1 with [4, 5, 50, 51], then starts block 2
        append(bm, a, token)
    b = seq(1, a.token_ids + [99])  # prompt = old prompt + generated tokens
    allocate_prefilled(bm, b)
    assert b.block_table[:2] == a.block_table[:2] and b.num_cached_tokens == 8
    bm.check_invariants([a, b])


# -- fork and copy-on-write -----------------------------------------------------------------


def test_fork_shares_blocks() -> None:
    bm = BlockManager(num_blocks=10, block_size=BS)
    parent = seq(0, range(6))
    allocate_prefilled(bm, parent)
    child = parent.fork(1)
    bm.fork(parent, child)
    assert child.block_table == parent.block_table
    assert [bm.blocks[b].ref_count for b in parent.block_table] == [2, 2]
    assert bm.num_used_blocks == 2
    bm.check_invariants([parent, child])


def test_copy_on_write_of_a_shared_partial_block() -> None:
    bm = BlockManager(num_blocks=10, block_size=BS)
    parent = seq(0, range(6))
    allocate_prefilled(bm, parent)
    child = parent.fork(1)
    bm.fork(parent, child)
    parent_table = list(parent.block_table)
    child.append_token(70)
    assert bm.can_append(child)
    copy = bm.append_slot(child)
    assert copy is not None
    src, dst = copy
    assert src == parent_table[1] and dst not in parent_table
    assert parent.block_table == parent_table and child.block_table == [parent_table[0], dst]
    assert [bm.blocks[b].ref_count for b in parent_table] == [2, 1]
    # The parent is now the only holder of its last block: it writes in place.
    assert append(bm, parent, 80) is None and parent.block_table == parent_table
    bm.check_invariants([parent, child])


def test_shared_full_last_block_needs_no_copy() -> None:
    bm = BlockManager(num_blocks=10, block_size=BS)
    parent = seq(0, range(8))
    allocate_prefilled(bm, parent)
    child = parent.fork(1)
    bm.fork(parent, child)
    assert append(bm, child, 8) is None
    assert child.block_table[:2] == parent.block_table and len(child.block_table) == 3
    assert bm.num_used_blocks == 3
    bm.check_invariants([parent, child])


def test_copy_on_write_needs_a_free_block() -> None:
    bm = BlockManager(num_blocks=3, block_size=BS)
    parent = seq(0, range(6))
    allocate_prefilled(bm, parent)
    child1, child2 = parent.fork(1), parent.fork(2)
    bm.fork(parent, child1)
    bm.fork(parent, child2)
    assert append(bm, child1, 9) is not None  # takes the last free block
    child2.append_token(9)
    assert not bm.can_append(child2)  # still shares the last block with the parent
    with pytest.raises(RuntimeError, match="sequence 2: it needs 1 free block, 0 of 3 are free"):
        bm.append_slot(child2)
    child2.output_token_ids.pop()
    bm.free(child2)
    parent.append_token(9)
    assert bm.can_append(parent)  # the only holder now: it writes in place
    assert bm.append_slot(parent) is None
    bm.check_invariants([parent, child1])


def test_fork_rejects_a_mismatched_child() -> None:
    bm = BlockManager(num_blocks=4, block_size=BS)
    parent = seq(0, range(3))
    allocate_prefilled(bm, parent)
    with pytest.raises(ValueError, match="must have the tokens"):
        bm.fork(parent, seq(1, range(4)))
    child = parent.fork(1)
    allocate_prefilled(bm, child)
    with pytest.raises(ValueError, match="already holds"):
        bm.fork(parent, child)


# -- free -----------------------------------------------------------------------------------


def test_free_returns_every_block_and_is_idempotent() -> None:
    bm = BlockManager(num_blocks=8, block_size=BS)
    a = seq(0, range(10))
    allocate_prefilled(bm, a)
    b = a.fork(1)
    bm.fork(a, b)
    append(bm, b, 1)
    bm.free(a)
    assert bm.num_used_blocks == 3
    bm.free(b)
    assert bm.num_free_blocks == 8 and b.block_table == []
    bm.free(b)  # no blocks: nothing to do
    assert bm.num_free_blocks == 8
    bm.check_invariants([a, b])


def test_free_of_a_stale_table_is_rejected() -> None:
    bm = BlockManager(num_blocks=4, block_size=BS)
    a = seq(0, range(3))
    allocate_prefilled(bm, a)
    stale = list(a.block_table)
    bm.free(a)
    a.block_table = stale
    with pytest.raises(RuntimeError, match="already free"):
        bm.free(a)
