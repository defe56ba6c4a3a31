"""KV blocks of the sliding-window layers: a second pool that keeps only the blocks a window still needs.

Gemma 3's sliding-window layers (5 of every 6) attend to the last W positions only (Gemma Team 2025,
arXiv:2503.19786). Their KV lives in its own pool with its own block ids: each sequence has a
`sliding_block_table` beside its global `block_table`, and a logical block that no future query can
see is released as the sequence advances. The global layers keep every block (`BlockManager`).

Which blocks are needed. A sequence with c computed tokens next runs queries at positions >= c, and
a query at position q reads keys j with q - W < j <= q, so no future query reads a key j <= c - W.
Logical block i (positions [i * bs, (i + 1) * bs)) is released once its last position (i + 1) * bs - 1
is <= c - W, i.e. for i < max(0, c - W + 1) // bs. This holds for chunked prefill too: a chunk whose
first query is at position c needs keys from c - W + 1 on, and exactly those blocks are kept.

Released entries keep their logical place and point to `NULL_BLOCK` (row 0 of the pool's tensors:
zeros, never handed out, never written), so logical indexing and the attention kernels' contract
(padded tables, keys outside the window masked) are unchanged, and a placeholder always indexes a
real row. Blocks are taken lazily, one step ahead: `append_slots` covers the positions of the chunk
or decode token being scheduled, never the rest of a long prompt, so a sequence holds at most
ceil((W + n - 2) / bs) + 1 blocks while a step of n new tokens runs (`max_blocks_per_seq`).

Forks (n > 1) share blocks by reference count, with copy-on-write of a shared partial last block,
as in the global pool. Prefix caching is not offered here: the sliding KV of a cached prefix is
released when its first owner moves on, so an engine with this pool turns prefix caching off.

How to run its tests: `python -m pytest tests/serving/engine/test_sliding_window.py -q`.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable

from serving.engine.sequence import Sequence

NULL_BLOCK = 0  # row of every sliding-pool tensor that released table entries point to


def max_blocks_per_seq(sliding_window: int, block_size: int, num_new_tokens: int) -> int:
    """Most blocks one sequence holds while a step of `num_new_tokens` runs: ceil((W + n - 2) / bs) + 1.

    The held logical blocks span positions [c - W + 1, c + n); a span of W + n - 1 positions touches
    at most ceil((W + n - 2) / bs) + 1 blocks.
    """
    return math.ceil((sliding_window + num_new_tokens - 2) / block_size) + 1


def max_batch_blocks(sliding_window: int, block_size: int, max_num_seqs: int, max_num_batched_tokens: int) -> int:
    """Most blocks a whole batch holds: max_num_seqs * (ceil(W / bs) + 2) + ceil(max_num_batched_tokens / bs).

    Summing `max_blocks_per_seq` over the running sequences, whose new tokens add up to at most the
    step's budget.
    """
    return max_num_seqs * (math.ceil(sliding_window / block_size) + 2) + math.ceil(max_num_batched_tokens / block_size)


def plan_pool_sizes(num_layer_blocks: int, num_global_layers: int, num_sliding_layers: int, sliding_window: int,
                    block_size: int, max_num_seqs: int, max_num_batched_tokens: int) -> tuple[int, int]:
    """Split a KV budget of `num_layer_blocks` (one layer's block each) into (global, sliding) block counts.

    Rule: the sliding pool never limits the engine. A running sequence holds no more sliding blocks
    than global ones, and the batch as a whole at most C = max_num_seqs * (ceil(W / bs) + 2) +
    ceil(max_num_batched_tokens / bs) (each sequence's window plus two partial blocks, and the
    step's prefill chunks). So the sliding pool gets min(C, G) blocks and the global pool G, the most
    the budget allows: G = (budget - num_sliding_layers * C) / num_global_layers when that is >= C,
    else budget / num_layers (then both pools are equal, as with one shared pool).

    Returns:
        (num_global_blocks, num_sliding_blocks), each at least 1.
    """
    cap = max_batch_blocks(sliding_window, block_size, max_num_seqs, max_num_batched_tokens)
    num_global = (num_layer_blocks - num_sliding_layers * cap) // max(1, num_global_layers)
    if num_global >= cap:
        return num_global, cap
    equal = max(1, num_layer_blocks // (num_global_layers + num_sliding_layers))
    return equal, equal


class SlidingBlockManager:
    """Hands out the sliding-window layers' KV blocks, releasing those outside every future window.

    Args:
        num_blocks: usable blocks, ids 1..num_blocks (the tensors have num_blocks + 1 rows: row 0 is
            `NULL_BLOCK`).
        block_size: token positions per block (the global pool's).
        sliding_window: W, positions a query sees (itself included).

    Raises:
        ValueError: on a size below 1.
    """

    def __init__(self, num_blocks: int, block_size: int, sliding_window: int) -> None:
        if min(num_blocks, block_size, sliding_window) < 1:
            raise ValueError(f"num_blocks, block_size and sliding_window must be >= 1, got {num_blocks}, {block_size}, {sliding_window}")
        self.num_blocks, self.block_size, self.sliding_window = num_blocks, block_size, sliding_window
        self.ref_counts = [0] * (num_blocks + 1)  # indexed by block id; NULL_BLOCK's stays 0
        self._free: deque[int] = deque(range(1, num_blocks + 1))

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    def first_needed_block(self, num_computed_tokens: int) -> int:
        """Logical index of the first block a query at position >= num_computed_tokens can read."""
        return max(0, num_computed_tokens - self.sliding_window + 1) // self.block_size

    # -- a step's slots -----------------------------------------------------------------------

    def _num_new_blocks(self, seq: Sequence, num_new_tokens: int) -> tuple[int, bool]:
        """(free blocks `append_slots` takes, whether it copies a shared partial block first)."""
        table, start = seq.sliding_block_table, seq.num_computed_tokens
        if len(table) != math.ceil(start / self.block_size):
            raise ValueError(f"sequence {seq.seq_id} has {len(table)} sliding blocks for {start} computed tokens")
        num_new = math.ceil((start + num_new_tokens) / self.block_size) - len(table)
        is_copy = start % self.block_size != 0 and self.ref_counts[table[-1]] > 1
        return num_new + is_copy, is_copy

    def can_append_slots(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Whether `append_slots(seq, num_new_tokens)` would find enough free blocks."""
        return self._num_new_blocks(seq, num_new_tokens)[0] <= self.num_free_blocks

    def append_slots(self, seq: Sequence, num_new_tokens: int) -> tuple[int, int] | None:
        """Give `seq` blocks for positions [c, c + num_new_tokens), c = seq.num_computed_tokens.

        The table covers [0, c) already (released entries included); a shared partial last block is
        copied first (copy-on-write).

        Returns:
            (src, dst) when the runner must copy block src into dst in every sliding layer first.
        Raises:
            ValueError: the table does not cover exactly the computed tokens.
            RuntimeError: too few free blocks (check `can_append_slots` first).
        """
        num_needed, is_copy = self._num_new_blocks(seq, num_new_tokens)
        if num_needed > self.num_free_blocks:
            raise RuntimeError(f"sequence {seq.seq_id} needs {num_needed} sliding blocks, {self.num_free_blocks} are free")
        table = seq.sliding_block_table
        copy = None
        if is_copy:
            src, dst = table[-1], self._take()
            self.ref_counts[src] -= 1
            table[-1] = dst
            copy = (src, dst)
        for _ in range(len(table), math.ceil((seq.num_computed_tokens + num_new_tokens) / self.block_size)):
            table.append(self._take())
        return copy

    def release_out_of_window(self, seq: Sequence) -> int:
        """Release the blocks no query at position >= seq.num_computed_tokens can read; returns how many."""
        table = seq.sliding_block_table
        num_released = 0
        for i in range(min(self.first_needed_block(seq.num_computed_tokens), len(table)) - 1, -1, -1):
            if table[i] == NULL_BLOCK:
                break  # everything before was released by an earlier call
            self._drop(table[i])
            table[i] = NULL_BLOCK
            num_released += 1
        return num_released

    def truncate(self, seq: Sequence) -> None:
        """Drop the blocks past `seq.num_computed_tokens` (a rejected draft's), so the table covers
        exactly the computed tokens again."""
        table = seq.sliding_block_table
        keep = math.ceil(seq.num_computed_tokens / self.block_size)
        for block_id in reversed(table[keep:]):
            if block_id != NULL_BLOCK:
                self._drop(block_id)
        del table[keep:]

    # -- sharing and release ------------------------------------------------------------------

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Let `child` share every block `parent` holds (after `BlockManager.fork`).

        Raises:
            ValueError: the child already holds sliding blocks.
        """
        if child.sliding_block_table:
            raise ValueError(f"child sequence {child.seq_id} already holds sliding blocks")
        for block_id in parent.sliding_block_table:
            if block_id != NULL_BLOCK:
                self.ref_counts[block_id] += 1
        child.sliding_block_table = list(parent.sliding_block_table)

    def free(self, seq: Sequence) -> None:
        """Drop every block the sequence holds. Idempotent."""
        for block_id in reversed(seq.sliding_block_table):
            if block_id != NULL_BLOCK:
                self._drop(block_id)
        seq.sliding_block_table = []

    def _take(self) -> int:
        block_id = self._free.popleft()
        self.ref_counts[block_id] = 1
        return block_id

    def _drop(self, block_id: int) -> None:
        if self.ref_counts[block_id] < 1:
            raise RuntimeError(f"sliding block {block_id} is released but already free")
        self.ref_counts[block_id] -= 1
        if self.ref_counts[block_id] == 0:
            self._free.append(block_id)

    # -- checks -------------------------------------------------------------------------------

    def check_invariants(self, seqs: Iterable[Sequence]) -> None:
        """Check reference counts, free list and released entries against every sequence holding blocks.

        Call between steps, when each table covers exactly the computed tokens. Raises AssertionError.
        """
        refs = [0] * (self.num_blocks + 1)
        for seq in seqs:
            table = seq.sliding_block_table
            if not table:
                continue
            assert len(table) == math.ceil(seq.num_computed_tokens / self.block_size), f"seq {seq.seq_id}: table length"
            first = self.first_needed_block(seq.num_computed_tokens)
            assert all(b == NULL_BLOCK for b in table[:first]), f"seq {seq.seq_id}: a block outside the window is held"
            assert all(b != NULL_BLOCK for b in table[first:]), f"seq {seq.seq_id}: a block inside the window is missing"
            for block_id in table[first:]:
                refs[block_id] += 1
        assert refs[NULL_BLOCK] == 0 and self.ref_counts[NULL_BLOCK] == 0, "the null block is referenced"
        assert refs == self.ref_counts, "sliding reference counts do not match the tables"
        free = list(self._free)
        assert len(free) == len(set(free)) and NULL_BLOCK not in free, "bad sliding free list"
        assert all(self.ref_counts[b] == 0 for b in free), "a referenced sliding block is free"
        assert len(free) + sum(c > 0 for c in self.ref_counts) == self.num_blocks, "a sliding block is lost"
