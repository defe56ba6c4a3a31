"""Tests for the prefix cache of `serving.engine.block_manager` (hash chain over full blocks, hits, revival,
eviction order) and a property test: random allocate / append / fork / free / preempt sequences with
every invariant checked after each step.

Hand-checked cases use block size 4, so block i holds positions [4i, 4i + 4).
"""

from __future__ import annotations

import random

import pytest

from serving.engine.block_manager import BlockManager, hash_block
from serving.engine.sequence import Sequence
from tests.serving.block_cases import BS, allocate_prefilled, append, seq


# -- prefix caching -------------------------------------------------------------------------


def test_shared_prefix_reuses_physical_blocks() -> None:
    bm = BlockManager(num_blocks=10, block_size=BS)
    a = seq(0, range(10))  # blocks [0..3], [4..7], [8, 9]
    allocate_prefilled(bm, a)
    assert (bm.prefix_cache_queries, bm.prefix_cache_hits) == (10, 0)
    b = seq(1, [*range(8), 100, 101, 102])
    allocate_prefilled(bm, b)
    assert b.block_table[:2] == a.block_table[:2] and b.block_table[2] != a.block_table[2]
    assert b.num_cached_tokens == 8 and b.num_computed_tokens == 8
    assert (bm.prefix_cache_queries, bm.prefix_cache_hits) == (21, 8)
    assert [bm.blocks[i].ref_count for i in a.block_table] == [2, 2, 1]
    assert bm.num_used_blocks == 4
    bm.check_invariants([a, b])


def test_hits_stop_at_the_first_miss() -> None:
    bm = BlockManager(num_blocks=10, block_size=BS)
    a = seq(0, range(12))
    allocate_prefilled(bm, a)
    # The second block differs, so the third cannot hit either (the hash chains over the prefix).
    b = seq(1, [0, 1, 2, 3, 99, 5, 6, 7, 8, 9, 10, 11, 12])
    allocate_prefilled(bm, b)
    assert b.block_table[0] == a.block_table[0] and not set(b.block_table[1:]) & set(a.block_table)
    assert b.num_cached_tokens == 4
    bm.check_invariants([a, b])


def test_different_prefix_gets_no_hit() -> None:
    bm = BlockManager(num_blocks=10, block_size=BS)
    a, b = seq(0, range(9)), seq(1, range(1, 10))
    allocate_prefilled(bm, a)
    allocate_prefilled(bm, b)
    assert not set(a.block_table) & set(b.block_table)
    assert b.num_cached_tokens == 0 and bm.prefix_cache_hits == 0
    bm.check_invariants([a, b])


def test_fully_cached_prompt_recomputes_its_last_block() -> None:
    bm = BlockManager(num_blocks=10, block_size=BS)
    a = seq(0, range(8))  # exactly 2 full blocks
    allocate_prefilled(bm, a)
    b = seq(1, range(8))
    assert bm.can_allocate(b)
    allocate_prefilled(bm, b)
    # Cached tokens are capped at floor((8 - 1) / 4) * 4 = 4: the block holding token 7 is recomputed.
    assert b.num_cached_tokens == 4 and bm.prefix_cache_hits == 4
    assert b.block_table[0] == a.block_table[0] and b.block_table[1] != a.block_table[1]
    bm.check_invariants([a, b])
    # A one-token prompt can never hit.
    c, d = seq(2, [1]), seq(3, [1])
    allocate_prefilled(bm, c)
    allocate_prefilled(bm, d)
    assert d.num_cached_tokens == 0


def test_freed_cached_blocks_are_revived() -> None:
    bm = BlockManager(num_blocks=4, block_size=BS)
    a = seq(0, range(9))
    allocate_prefilled(bm, a)
    table = list(a.block_table)
    bm.free(a)
    assert bm.num_free_blocks == 4 and a.block_table == [] and a.num_computed_tokens == 0
    b = seq(1, range(9))
    # The revived blocks come out of the free pool, so the allocation still needs 3 free blocks.
    assert bm.can_allocate(b)
    allocate_prefilled(bm, b)
    assert b.block_table[:2] == table[:2] and b.num_cached_tokens == 8
    assert bm.num_free_blocks == 1
    bm.check_invariants([b])


def test_eviction_prefers_uncached_blocks_then_least_recently_released() -> None:
    bm = BlockManager(num_blocks=4, block_size=BS)
    a = seq(0, range(9))  # 2 full blocks (cached after free) + 1 partial
    allocate_prefilled(bm, a)
    first, second, partial = a.block_table
    bm.free(a)
    # The never-used block and the partial block are reused before either cached block.
    c, d = seq(1, [100]), seq(2, [200])
    allocate_prefilled(bm, c)
    allocate_prefilled(bm, d)
    assert {c.block_table[0], d.block_table[0]} == {3, partial}
    # `free` released the last block first, so the second cached block is evicted before the first.
    e = seq(3, [300])
    allocate_prefilled(bm, e)
    assert e.block_table == [second]
    bm.check_invariants([c, d, e])
    # The first block is still findable: a prompt starting with the same 4 tokens revives it.
    bm.free(c)
    f = seq(4, range(6))
    assert bm.can_allocate(f)  # 1 revived + 1 new = the 2 free blocks
    allocate_prefilled(bm, f)
    assert f.block_table[0] == first and f.num_cached_tokens == 4 and bm.num_free_blocks == 0
    bm.check_invariants([d, e, f])


def test_no_hits_with_prefix_caching_off() -> None:
    bm = BlockManager(num_blocks=10, block_size=BS, enable_prefix_caching=False)
    a = seq(0, range(10))
    allocate_prefilled(bm, a)
    b = seq(1, range(10))
    allocate_prefilled(bm, b)
    append(bm, a, 10)
    append(bm, a, 11)
    assert not set(a.block_table) & set(b.block_table)
    assert b.num_cached_tokens == 0 and (bm.prefix_cache_queries, bm.prefix_cache_hits) == (0, 0)
    assert all(block.hash is None for block in bm.blocks)
    bm.check_invariants([a, b])


def test_reset_prefix_cache() -> None:
    bm = BlockManager(num_blocks=9, block_size=BS)
    a, b = seq(0, range(9)), seq(1, range(100, 109))
    allocate_prefilled(bm, a)
    allocate_prefilled(bm, b)
    bm.free(a)
    bm.reset_prefix_cache()
    bm.check_invariants([b])
    assert bm.prefix_cache_queries == 18  # counters are cumulative
    for s in (seq(2, range(9)), seq(3, range(100, 109))):
        allocate_prefilled(bm, s)
        assert s.num_cached_tokens == 0


def test_hash_block_chains_over_the_prefix() -> None:
    h0 = hash_block(None, [1, 2, 3, 4])
    assert h0 == hash_block(None, [1, 2, 3, 4])
    assert h0 != hash_block(None, [1, 2, 3, 5])
    assert hash_block(h0, [5, 6, 7, 8]) != hash_block(hash_block(None, [0, 2, 3, 4]), [5, 6, 7, 8])


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
                allocate_prefilled(bm, s)
                assert s.num_cached_tokens % block_size == 0 and s.num_cached_tokens < s.num_tokens
                assert bm.num_free_blocks >= free_before - s.num_blocks(block_size)
                live.append(s)
            else:
                with pytest.raises(RuntimeError):
                    allocate_prefilled(bm, s)
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
                allocate_prefilled(bm, s)  # recompute: prompt + output so far
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
