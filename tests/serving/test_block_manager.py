"""Tests for `serving.sequence` and `serving.block_manager` (pure Python, CPU only).

Hand-checked cases use block size 4, so block i holds positions [4i, 4i + 4); the property test
drives random allocate / append / fork / free / preempt sequences and checks every invariant
after each step.
"""

from __future__ import annotations

import random

import pytest

from serving.block_manager import BlockManager, hash_block
from serving.sequence import Sequence, SequenceStatus

BS = 4


def _allocate(bm: BlockManager, seq: Sequence) -> None:
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
    _allocate(bm, s)
    assert len(s.block_table) == 3 and len(set(s.block_table)) == 3
    assert (bm.num_free_blocks, bm.num_used_blocks, bm.usage) == (7, 3, pytest.approx(0.3))
    assert s.num_cached_tokens == 0 and s.num_computed_tokens == 0
    bm.check_invariants([s])


def test_can_allocate_false_and_error_names_the_numbers() -> None:
    bm = BlockManager(num_blocks=2, block_size=BS)
    s = seq(7, range(9))  # 3 blocks
    assert not bm.can_allocate(s)
    with pytest.raises(RuntimeError, match=r"sequence 7: it needs 3 free blocks for 9 tokens, 2 of 2 are free"):
        _allocate(bm, s)
    assert s.block_table == [] and bm.num_free_blocks == 2


def test_allocate_twice_is_rejected() -> None:
    bm = BlockManager(num_blocks=4, block_size=BS)
    s = seq(0, range(3))
    _allocate(bm, s)
    with pytest.raises(ValueError, match="already holds 1 blocks"):
        _allocate(bm, s)


# -- prefix caching -------------------------------------------------------------------------


def test_shared_prefix_reuses_physical_blocks() -> None:
    bm = BlockManager(num_blocks=10, block_size=BS)
    a = seq(0, range(10))  # blocks [0..3], [4..7], [8, 9]
    _allocate(bm, a)
    assert (bm.prefix_cache_queries, bm.prefix_cache_hits) == (10, 0)
    b = seq(1, [*range(8), 100, 101, 102])
    _allocate(bm, b)
    assert b.block_table[:2] == a.block_table[:2] and b.block_table[2] != a.block_table[2]
    assert b.num_cached_tokens == 8 and b.num_computed_tokens == 8
    assert (bm.prefix_cache_queries, bm.prefix_cache_hits) == (21, 8)
    assert [bm.blocks[i].ref_count for i in a.block_table] == [2, 2, 1]
    assert bm.num_used_blocks == 4
    bm.check_invariants([a, b])


def test_hits_stop_at_the_first_miss() -> None:
    bm = BlockManager(num_blocks=10, block_size=BS)
    a = seq(0, range(12))
    _allocate(bm, a)
    # The second block differs, so the third cannot hit either (the hash chains over the prefix).
    b = seq(1, [0, 1, 2, 3, 99, 5, 6, 7, 8, 9, 10, 11, 12])
    _allocate(bm, b)
    assert b.block_table[0] == a.block_table[0] and not set(b.block_table[1:]) & set(a.block_table)
    assert b.num_cached_tokens == 4
    bm.check_invariants([a, b])


def test_different_prefix_gets_no_hit() -> None:
    bm = BlockManager(num_blocks=10, block_size=BS)
    a, b = seq(0, range(9)), seq(1, range(1, 10))
    _allocate(bm, a)
    _allocate(bm, b)
    assert not set(a.block_table) & set(b.block_table)
    assert b.num_cached_tokens == 0 and bm.prefix_cache_hits == 0
    bm.check_invariants([a, b])


def test_fully_cached_prompt_recomputes_its_last_block() -> None:
    bm = BlockManager(num_blocks=10, block_size=BS)
    a = seq(0, range(8))  # exactly 2 full blocks
    _allocate(bm, a)
    b = seq(1, range(8))
    assert bm.can_allocate(b)
    _allocate(bm, b)
    # Cached tokens are capped at floor((8 - 1) / 4) * 4 = 4: the block holding token 7 is recomputed.
    assert b.num_cached_tokens == 4 and bm.prefix_cache_hits == 4
    assert b.block_table[0] == a.block_table[0] and b.block_table[1] != a.block_table[1]
    bm.check_invariants([a, b])
    # A one-token prompt can never hit.
    c, d = seq(2, [1]), seq(3, [1])
    _allocate(bm, c)
    _allocate(bm, d)
    assert d.num_cached_tokens == 0


def test_freed_cached_blocks_are_revived() -> None:
    bm = BlockManager(num_blocks=4, block_size=BS)
    a = seq(0, range(9))
    _allocate(bm, a)
    table = list(a.block_table)
    bm.free(a)
    assert bm.num_free_blocks == 4 and a.block_table == [] and a.num_computed_tokens == 0
    b = seq(1, range(9))
    # The revived blocks come out of the free pool, so the allocation still needs 3 free blocks.
    assert bm.can_allocate(b)
    _allocate(bm, b)
    assert b.block_table[:2] == table[:2] and b.num_cached_tokens == 8
    assert bm.num_free_blocks == 1
    bm.check_invariants([b])


def test_eviction_prefers_uncached_blocks_then_least_recently_released() -> None:
    bm = BlockManager(num_blocks=4, block_size=BS)
    a = seq(0, range(9))  # 2 full blocks (cached after free) + 1 partial
    _allocate(bm, a)
    first, second, partial = a.block_table
    bm.free(a)
    # The never-used block and the partial block are reused before either cached block.
    c, d = seq(1, [100]), seq(2, [200])
    _allocate(bm, c)
    _allocate(bm, d)
    assert {c.block_table[0], d.block_table[0]} == {3, partial}
    # `free` released the last block first, so the second cached block is evicted before the first.
    e = seq(3, [300])
    _allocate(bm, e)
    assert e.block_table == [second]
    bm.check_invariants([c, d, e])
    # The first block is still findable: a prompt starting with the same 4 tokens revives it.
    bm.free(c)
    f = seq(4, range(6))
    assert bm.can_allocate(f)  # 1 revived + 1 new = the 2 free blocks
    _allocate(bm, f)
    assert f.block_table[0] == first and f.num_cached_tokens == 4 and bm.num_free_blocks == 0
    bm.check_invariants([d, e, f])


def test_no_hits_with_prefix_caching_off() -> None:
    bm = BlockManager(num_blocks=10, block_size=BS, enable_prefix_caching=False)
    a = seq(0, range(10))
    _allocate(bm, a)
    b = seq(1, range(10))
    _allocate(bm, b)
    append(bm, a, 10)
    append(bm, a, 11)
    assert not set(a.block_table) & set(b.block_table)
    assert b.num_cached_tokens == 0 and (bm.prefix_cache_queries, bm.prefix_cache_hits) == (0, 0)
    assert all(block.hash is None for block in bm.blocks)
    bm.check_invariants([a, b])


def test_reset_prefix_cache() -> None:
    bm = BlockManager(num_blocks=9, block_size=BS)
    a, b = seq(0, range(9)), seq(1, range(100, 109))
    _allocate(bm, a)
    _allocate(bm, b)
    bm.free(a)
    bm.reset_prefix_cache()
    bm.check_invariants([b])
    assert bm.prefix_cache_queries == 18  # counters are cumulative
    for s in (seq(2, range(9)), seq(3, range(100, 109))):
        _allocate(bm, s)
        assert s.num_cached_tokens == 0


def test_hash_block_chains_over_the_prefix() -> None:
    h0 = hash_block(None, [1, 2, 3, 4])
    assert h0 == hash_block(None, [1, 2, 3, 4])
    assert h0 != hash_block(None, [1, 2, 3, 5])
    assert hash_block(h0, [5, 6, 7, 8]) != hash_block(hash_block(None, [0, 2, 3, 4]), [5, 6, 7, 8])


# -- appending ------------------------------------------------------------------------------


def test_append_within_a_block_takes_nothing() -> None:
    bm = BlockManager(num_blocks=4, block_size=BS)
    s = seq(0, range(5))
    _allocate(bm, s)
    for token in (5, 6, 7):
        s.append_token(token)
        assert bm.can_append(s)
        assert bm.append_slot(s) is None
        assert len(s.block_table) == 2 and bm.num_free_blocks == 2
    bm.check_invariants([s])


def test_crossing_a_block_boundary_takes_exactly_one_block() -> None:
    bm = BlockManager(num_blocks=4, block_size=BS)
    s = seq(0, range(8))
    _allocate(bm, s)
    s.append_token(8)
    assert bm.can_append(s)
    assert bm.append_slot(s) is None
    assert len(s.block_table) == 3 and bm.num_free_blocks == 1
    bm.check_invariants([s])


def test_append_without_a_free_block() -> None:
    bm = BlockManager(num_blocks=1, block_size=BS)
    s = seq(3, range(4))
    _allocate(bm, s)
    s.append_token(4)
    assert not bm.can_append(s)
    with pytest.raises(RuntimeError, match="sequence 3: it needs 1 free block, 0 of 1 are free"):
        bm.append_slot(s)


def test_append_slot_rejects_a_stale_table() -> None:
    bm = BlockManager(num_blocks=4, block_size=BS)
    s = seq(0, range(4))
    _allocate(bm, s)
    for token in (4, 5, 6, 7, 8):
        s.append_token(token)  # two blocks' worth without append_slot
    with pytest.raises(ValueError, match="1 blocks for 9 tokens"):
        bm.append_slot(s)
    with pytest.raises(ValueError, match="0 blocks"):
        bm.append_slot(seq(1, [1]))


def test_block_filled_by_decoding_is_registered() -> None:
    bm = BlockManager(num_blocks=10, block_size=BS)
    a = seq(0, range(6))
    _allocate(bm, a)
    for token in (50, 51, 52):  # fills block 1 with [4, 5, 50, 51], then starts block 2
        append(bm, a, token)
    b = seq(1, a.token_ids + [99])  # prompt = old prompt + generated tokens
    _allocate(bm, b)
    assert b.block_table[:2] == a.block_table[:2] and b.num_cached_tokens == 8
    bm.check_invariants([a, b])


# -- fork and copy-on-write -----------------------------------------------------------------


def test_fork_shares_blocks() -> None:
    bm = BlockManager(num_blocks=10, block_size=BS)
    parent = seq(0, range(6))
    _allocate(bm, parent)
    child = parent.fork(1)
    bm.fork(parent, child)
    assert child.block_table == parent.block_table
    assert [bm.blocks[b].ref_count for b in parent.block_table] == [2, 2]
    assert bm.num_used_blocks == 2
    bm.check_invariants([parent, child])


def test_copy_on_write_of_a_shared_partial_block() -> None:
    bm = BlockManager(num_blocks=10, block_size=BS)
    parent = seq(0, range(6))
    _allocate(bm, parent)
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
    _allocate(bm, parent)
    child = parent.fork(1)
    bm.fork(parent, child)
    assert append(bm, child, 8) is None
    assert child.block_table[:2] == parent.block_table and len(child.block_table) == 3
    assert bm.num_used_blocks == 3
    bm.check_invariants([parent, child])


def test_copy_on_write_needs_a_free_block() -> None:
    bm = BlockManager(num_blocks=3, block_size=BS)
    parent = seq(0, range(6))
    _allocate(bm, parent)
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
    _allocate(bm, parent)
    with pytest.raises(ValueError, match="must have the tokens"):
        bm.fork(parent, seq(1, range(4)))
    child = parent.fork(1)
    _allocate(bm, child)
    with pytest.raises(ValueError, match="already holds"):
        bm.fork(parent, child)


# -- free -----------------------------------------------------------------------------------


def test_free_returns_every_block_and_is_idempotent() -> None:
    bm = BlockManager(num_blocks=8, block_size=BS)
    a = seq(0, range(10))
    _allocate(bm, a)
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
    _allocate(bm, a)
    stale = list(a.block_table)
    bm.free(a)
    a.block_table = stale
    with pytest.raises(RuntimeError, match="already free"):
        bm.free(a)


# -- property test --------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(30))
@pytest.mark.parametrize("enable_prefix_caching", [True, False])
def test_random_operations_keep_invariants(seed: int, enable_prefix_caching: bool) -> None:
    rng = random.Random(seed)
    block_size = rng.choice([1, 2, 3, 4, 16])
    num_blocks = rng.randint(1, 40)
    bm = BlockManager(num_blocks, block_size, enable_prefix_caching)
    # Few distinct prefixes and a tiny vocabulary, so prefix hits and duplicate blocks are common.
    prefixes = [[rng.randrange(3) for _ in range(rng.randint(1, 20))] for _ in range(3)]
    live: list[Sequence] = []
    next_id = 0
    for _ in range(300):
        op = rng.choices(["allocate", "append", "fork", "free", "preempt", "reset"], [4, 8, 2, 2, 1, 0.2])[0]
        if op == "allocate":
            prompt = rng.choice(prefixes)[: rng.randint(1, 20)] + [rng.randrange(3) for _ in range(rng.randint(0, 5))]
            s = seq(next_id, prompt)
            next_id += 1
            if bm.can_allocate(s):
                free_before = bm.num_free_blocks
                _allocate(bm, s)
                assert s.num_cached_tokens % block_size == 0 and s.num_cached_tokens < s.num_tokens
                assert bm.num_free_blocks >= free_before - s.num_blocks(block_size)
                live.append(s)
            else:
                with pytest.raises(RuntimeError):
                    _allocate(bm, s)
        elif op == "append" and live:
            s = rng.choice(live)
            s.append_token(rng.randrange(3))
            if bm.can_append(s):
                shared_last = len(s.block_table) == s.num_blocks(block_size) and bm.blocks[s.block_table[-1]].ref_count > 1
                copy = bm.append_slot(s)
                assert (copy is not None) == shared_last
                if copy is not None:
                    assert s.block_table[-1] == copy[1] and bm.blocks[copy[1]].ref_count == 1
            else:
                bm.free(s)  # a scheduler would preempt it
                live.remove(s)
        elif op == "fork" and live:
            parent = rng.choice(live)
            child = parent.fork(next_id)
            next_id += 1
            bm.fork(parent, child)
            live.append(child)
        elif op == "free" and live:
            s = live.pop(rng.randrange(len(live)))
            bm.free(s)
        elif op == "preempt" and live:
            s = rng.choice(live)
            bm.free(s)
            if bm.can_allocate(s):
                _allocate(bm, s)  # recompute: prompt + output so far
            else:
                live.remove(s)
        elif op == "reset":
            bm.reset_prefix_cache()
        bm.check_invariants(live)
        assert bm.prefix_cache_hits <= bm.prefix_cache_queries
    for s in live:
        bm.free(s)
    bm.check_invariants([])
    assert bm.num_free_blocks == num_blocks and bm.num_used_blocks == 0
    if not enable_prefix_caching:
        assert bm.prefix_cache_hits == 0
