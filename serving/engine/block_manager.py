"""Paged KV cache bookkeeping: which physical block holds which sequence's tokens.

The KV cache is split into `num_blocks` blocks of `block_size` token positions (the tensors live in
the model runner; this module only hands out block ids). Each sequence's `block_table` maps its
logical blocks to physical ones, as in PagedAttention (Kwon et al., 2023, arXiv:2309.06180).

Blocks are reference counted: `fork` shares a sequence's blocks with its `n > 1` siblings, and
`append_slot` copies a shared partial last block before writing (copy-on-write).

Prefix caching (vLLM's automatic prefix caching): every full block gets a hash chained over the
whole prefix, hash(block i) = H(hash(block i - 1), token ids of block i), and a `hash -> block id`
map lets a new sequence reuse the blocks of any earlier one with the same prefix. A released block
keeps its hash and stays findable until it is reused for other content (lazy eviction).

This pool holds every block of a sequence. Gemma 3's sliding-window layers keep their KV in a second
pool that releases the blocks outside the window (`serving.engine.sliding_block_manager`); an engine with
that pool runs without prefix caching, since a cached prefix's sliding KV is released.

How to run its tests: `python -m pytest tests/serving/engine/test_block_manager.py -q`.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass

from serving.engine.sequence import Sequence


def hash_block(prev_hash: int | None, token_ids: list[int]) -> int:
    """Chained content hash of one full block: H(prev_hash, token_ids), a 128-bit int.

    `prev_hash` is None for a sequence's first block. A cryptographic hash rather than Python's
    `hash()`, whose collisions can be constructed: a colliding prompt would reuse another tenant's
    KV (vLLM advisory GHSA-rm76-4mrf-v9r8; vLLM PR #15297 moved to SHA-256 for this reason).
    """
    h = hashlib.blake2b(digest_size=16)
    h.update(b"root" if prev_hash is None else prev_hash.to_bytes(16, "little"))
    h.update(array("q", token_ids).tobytes())
    return int.from_bytes(h.digest(), "little")


@dataclass
class Block:
    """One physical KV block.

    Attributes:
        block_id: index into the runner's KV tensors, in [0, num_blocks).
        ref_count: how many block tables hold it; 0 when free.
        hash: the chained content hash once the block is full (prefix caching on), else None.
            It identifies the content; whether the block is findable is the hash map's business.
    """

    block_id: int
    ref_count: int = 0
    hash: int | None = None


class BlockManager:
    """Hands out KV blocks to sequences, with reference counts and an optional prefix cache.

    Args:
        num_blocks: physical blocks in the KV cache, at least 1.
        block_size: token positions per block, at least 1.
        enable_prefix_caching: reuse full blocks across sequences with the same prefix.

    Raises:
        ValueError: on `num_blocks` or `block_size` below 1.

    Prompt blocks are registered by `mark_computed` once a step has written their KV (prefills may
    be chunked over several steps, and a block must not be found before its KV exists). A decoded
    token's block is registered by `append_slot` when the token fills it: its KV is written in the
    same forward pass that could first read it, and the runner writes a layer's KV for the whole
    batch before that layer's attention reads the cache.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be at least 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # Free blocks in release order (oldest first); blocks without a findable hash are reused
        # first, then cached ones, least recently released first.
        self._free_uncached: deque[int] = deque(range(num_blocks))
        self._free_cached: OrderedDict[int, None] = OrderedDict()
        self._hash_to_block: dict[int, int] = {}
        self.prefix_cache_queries = 0  # tokens of allocated sequences (prefix caching on)
        self.prefix_cache_hits = 0  # of those, tokens whose KV came from the cache

    # -- counters -----------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return len(self._free_uncached) + len(self._free_cached)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def usage(self) -> float:
        """Fraction of blocks held by sequences, in [0, 1]."""
        return self.num_used_blocks / self.num_blocks

    @property
    def prefix_cache_hit_rate(self) -> float:
        """prefix_cache_hits / prefix_cache_queries, 0.0 before any query."""
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0

    # -- allocation of a new sequence ---------------------------------------------------------

    def _block_hashes(self, token_ids: list[int], num_full_blocks: int) -> list[int]:
        hashes: list[int] = []
        for i in range(num_full_blocks):
            block = token_ids[i * self.block_size : (i + 1) * self.block_size]
            hashes.append(hash_block(hashes[-1] if hashes else None, block))
        return hashes

    def _cached_prefix(self, hashes: list[int], num_tokens: int) -> list[int]:
        """Block ids of the longest cached prefix, leaving at least the last token to compute."""
        hits: list[int] = []
        for h in hashes[: (num_tokens - 1) // self.block_size]:
            block_id = self._hash_to_block.get(h)
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    def _plan(self, seq: Sequence) -> tuple[list[int], list[int], int]:
        """(full-block hashes, prefix-cache hit block ids, free blocks the allocation takes)."""
        num_full = seq.num_tokens // self.block_size
        hashes = self._block_hashes(seq.token_ids, num_full) if self.enable_prefix_caching else []
        hits = self._cached_prefix(hashes, seq.num_tokens)
        # A hit on a free (cached) block revives it, so it costs a free block like a miss does.
        num_needed = seq.num_blocks(self.block_size) - sum(self.blocks[b].ref_count > 0 for b in hits)
        return hashes, hits, num_needed

    def can_allocate(self, seq: Sequence) -> bool:
        """Whether `allocate(seq)` would find enough free blocks."""
        return self._plan(seq)[2] <= self.num_free_blocks

    def allocate(self, seq: Sequence) -> None:
        """Give a new sequence blocks for all its tokens, reusing the cached prefix.

        Sets `seq.block_table` (ceil(num_tokens / block_size) ids), and `seq.num_cached_tokens` =
        `seq.num_computed_tokens` = block_size * (number of leading blocks found in the prefix
        cache). The lookup stops at the first miss and never covers the block holding the last
        token, so the model still computes that token's logits.

        Raises:
            ValueError: if the sequence already holds blocks.
            RuntimeError: if too few blocks are free (check `can_allocate` first).
        """
        if seq.block_table:
            raise ValueError(f"sequence {seq.seq_id} already holds {len(seq.block_table)} blocks")
        hashes, hits, num_needed = self._plan(seq)
        if num_needed > self.num_free_blocks:
            raise RuntimeError(
                f"cannot allocate sequence {seq.seq_id}: it needs {num_needed} free blocks for "
                f"{seq.num_tokens} tokens, {self.num_free_blocks} of {self.num_blocks} are free"
            )
        for block_id in hits:
            self._take(block_id)
        table = list(hits)
        for _ in range(len(hits), seq.num_blocks(self.block_size)):
            table.append(self._take_free())
        seq.block_table = table
        seq.num_cached_tokens = seq.num_computed_tokens = len(hits) * self.block_size
        if self.enable_prefix_caching:
            self.prefix_cache_queries += seq.num_tokens
            self.prefix_cache_hits += seq.num_cached_tokens

    def mark_computed(self, seq: Sequence) -> None:
        """Register the hashes of the full blocks whose KV is now computed (`seq.num_computed_tokens`)."""
        if not self.enable_prefix_caching:
            return
        num_full = min(seq.num_computed_tokens, seq.num_tokens) // self.block_size
        prev_hash = None
        for i in range(num_full):
            block = self.blocks[seq.block_table[i]]
            if block.hash is None:
                block_hash = hash_block(prev_hash, seq.token_ids[i * self.block_size : (i + 1) * self.block_size])
                self._register(block.block_id, block_hash)
            prev_hash = block.hash

    # -- decoding -----------------------------------------------------------------------------

    def _check_table(self, seq: Sequence) -> int:
        """Index of the last token's block; the table may lack that block, but no other."""
        num_needed = seq.num_blocks(self.block_size)
        if len(seq.block_table) not in (num_needed - 1, num_needed) or not seq.block_table:
            raise ValueError(
                f"sequence {seq.seq_id} has {len(seq.block_table)} blocks for {seq.num_tokens} tokens; "
                f"call append_slot once after each append_token on an allocated sequence"
            )
        return num_needed - 1

    def _num_append_blocks(self, seq: Sequence) -> int:
        last = self._check_table(seq)
        is_new_block = last == len(seq.block_table)
        return int(is_new_block or self.blocks[seq.block_table[last]].ref_count > 1)

    def can_append(self, seq: Sequence) -> bool:
        """Whether `append_slot(seq)` would find a free block if it needs one (call after `append_token`)."""
        return self._num_append_blocks(seq) <= self.num_free_blocks

    def append_slot(self, seq: Sequence) -> tuple[int, int] | None:
        """Make room for the KV of the token just appended to `seq`.

        Allocates a block when the token starts a new one; copies a shared (forked) partial last
        block first (copy-on-write); registers the block's hash when the token fills it.

        Returns:
            (src_block, dst_block) when the runner must copy src's KV into dst before writing the
            new token, else None.

        Raises:
            ValueError: if the table does not match the token count (see `_check_table`).
            RuntimeError: if a block is needed and none is free (check `can_append` first).
        """
        num_needed = self._num_append_blocks(seq)
        if num_needed > self.num_free_blocks:
            raise RuntimeError(
                f"cannot append to sequence {seq.seq_id}: it needs {num_needed} free block, "
                f"{self.num_free_blocks} of {self.num_blocks} are free"
            )
        last = seq.num_blocks(self.block_size) - 1
        copy: tuple[int, int] | None = None
        if last == len(seq.block_table):
            seq.block_table.append(self._take_free())
        elif self.blocks[seq.block_table[last]].ref_count > 1:
            src, dst = seq.block_table[last], self._take_free()
            self.blocks[src].ref_count -= 1
            seq.block_table[last] = dst
            copy = (src, dst)
        if self.enable_prefix_caching and seq.num_tokens % self.block_size == 0:
            prev_hash = self.blocks[seq.block_table[last - 1]].hash if last > 0 else None
            tokens = seq.token_ids[last * self.block_size :]
            self._register(seq.block_table[last], hash_block(prev_hash, tokens))
        return copy

    # -- speculative drafts ---------------------------------------------------------------------

    def num_draft_blocks(self, seq: Sequence, num_draft: int) -> int:
        """Blocks beyond the last token's for `num_draft` draft positions [num_tokens, num_tokens + num_draft)."""
        return -(-(seq.num_tokens + num_draft) // self.block_size) - seq.num_blocks(self.block_size)

    def can_append_drafts(self, seq: Sequence, num_draft: int) -> bool:
        """Whether `append_slot(seq)` and then `append_draft_slots(seq, num_draft)` find enough free blocks."""
        return self._num_append_blocks(seq) + self.num_draft_blocks(seq, num_draft) <= self.num_free_blocks

    def append_draft_slots(self, seq: Sequence, num_draft: int) -> None:
        """After `append_slot(seq)`: fresh blocks for the KV of `num_draft` draft tokens.

        Draft blocks get no hash (a draft is not content yet); `truncate` returns the ones a
        rejection leaves unused. Raises RuntimeError when too few blocks are free.
        """
        num_new = self.num_draft_blocks(seq, num_draft)
        if len(seq.block_table) != seq.num_blocks(self.block_size) or num_new > self.num_free_blocks:
            raise RuntimeError(f"cannot add {num_draft} draft slots to sequence {seq.seq_id}: call append_slot first, "
                               f"and check can_append_drafts ({self.num_free_blocks} free blocks)")
        seq.block_table.extend(self._take_free() for _ in range(num_new))

    def truncate(self, seq: Sequence, num_tokens: int) -> None:
        """Keep the blocks of the first `num_tokens` positions, drop the sequence's references to the
        rest (rejected drafts' blocks). A kept block's KV past `num_tokens` is rewritten before it is read."""
        keep = -(-num_tokens // self.block_size)
        for block_id in reversed(seq.block_table[keep:]):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self._release(block)
        del seq.block_table[keep:]

    # -- sharing and release ------------------------------------------------------------------

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Let `child` (same tokens, no blocks; see `Sequence.fork`) share all of `parent`'s blocks.

        Raises:
            ValueError: if the child holds blocks or its tokens differ from the parent's.
        """
        if child.block_table:
            raise ValueError(f"child sequence {child.seq_id} already holds {len(child.block_table)} blocks")
        if child.token_ids != parent.token_ids:
            raise ValueError(f"child sequence {child.seq_id} must have the tokens of parent {parent.seq_id}")
        for block_id in parent.block_table:
            self.blocks[block_id].ref_count += 1
        child.block_table = list(parent.block_table)
        child.num_cached_tokens = parent.num_cached_tokens
        child.num_computed_tokens = parent.num_computed_tokens

    def free(self, seq: Sequence) -> None:
        """Drop the sequence's references, last block first, so its deepest blocks are evicted first.

        Idempotent: a sequence without blocks is left as it is.
        """
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            if block.ref_count < 1:
                raise RuntimeError(f"sequence {seq.seq_id} holds block {block_id}, which is already free")
            block.ref_count -= 1
            if block.ref_count == 0:
                self._release(block)
        seq.block_table = []
        seq.num_cached_tokens = seq.num_computed_tokens = 0

    def reset_prefix_cache(self) -> None:
        """Forget every cached hash; blocks in use keep theirs but are no longer findable.

        The hit counters are cumulative and are not reset.
        """
        self._hash_to_block.clear()
        for block_id in self._free_cached:
            self.blocks[block_id].hash = None
            self._free_uncached.append(block_id)
        self._free_cached.clear()

    # -- free lists ---------------------------------------------------------------------------

    def _is_findable(self, block: Block) -> bool:
        return block.hash is not None and self._hash_to_block.get(block.hash) == block.block_id

    def _register(self, block_id: int, block_hash: int) -> None:
        # An existing entry wins: a duplicate block keeps the hash (for the chain) but is not findable.
        self.blocks[block_id].hash = block_hash
        self._hash_to_block.setdefault(block_hash, block_id)

    def _take(self, block_id: int) -> None:
        """Add a reference to a findable block, reviving it if it was free."""
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self._free_cached[block_id]
        block.ref_count += 1

    def _take_free(self) -> int:
        """A free block with no content, evicting the least recently released cached one if needed."""
        if self._free_uncached:
            block_id = self._free_uncached.popleft()
        else:
            block_id, _ = self._free_cached.popitem(last=False)
            del self._hash_to_block[self.blocks[block_id].hash]
        block = self.blocks[block_id]
        block.hash = None
        block.ref_count = 1
        return block_id

    def _release(self, block: Block) -> None:
        if self._is_findable(block):
            self._free_cached[block.block_id] = None
        else:
            block.hash = None
            self._free_uncached.append(block.block_id)

    # -- checks -------------------------------------------------------------------------------

    def check_invariants(self, seqs: Iterable[Sequence]) -> None:
        """Check the bookkeeping against `seqs`, every sequence that holds blocks (between steps).

        Raises:
            AssertionError: naming the first broken invariant.
        """
        seqs = list(seqs)
        refs = [0] * self.num_blocks
        for seq in seqs:
            table = seq.block_table
            if not table:
                continue
            assert len(table) == seq.num_blocks(self.block_size), f"seq {seq.seq_id}: table length"
            assert len(set(table)) == len(table), f"seq {seq.seq_id}: a block twice in one table"
            assert seq.num_cached_tokens % self.block_size == 0 and seq.num_cached_tokens < seq.num_tokens
            for block_id in table:
                refs[block_id] += 1
            if self.enable_prefix_caching:
                num_full = seq.num_tokens // self.block_size
                expected = self._block_hashes(seq.token_ids, num_full) + [None] * (len(table) - num_full)
                actual = [self.blocks[b].hash for b in table]
                assert actual == expected, f"seq {seq.seq_id}: block hashes do not match its tokens"
        for block in self.blocks:
            assert block.ref_count == refs[block.block_id], (
                f"block {block.block_id}: ref_count {block.ref_count}, referenced by {refs[block.block_id]} tables"
            )
        free = list(self._free_uncached) + list(self._free_cached)
        assert len(free) == len(set(free)), "a block is twice in the free lists"
        assert all(self.blocks[b].ref_count == 0 for b in free), "a referenced block is free"
        assert len(free) + sum(b.ref_count > 0 for b in self.blocks) == self.num_blocks, "a block is lost"
        assert all(self.blocks[b].hash is None for b in self._free_uncached), "an uncached free block has a hash"
        assert all(self._is_findable(self.blocks[b]) for b in self._free_cached), "a cached free block is unfindable"
        for block_hash, block_id in self._hash_to_block.items():
            assert self.blocks[block_id].hash == block_hash, f"hash map entry of block {block_id} is stale"
            assert block_id not in self._free_uncached, f"hash map points to uncached free block {block_id}"
        if not self.enable_prefix_caching:
            assert not self._hash_to_block and all(b.hash is None for b in self.blocks)
