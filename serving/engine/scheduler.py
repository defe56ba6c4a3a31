"""Continuous batching: which sequences run in the next step, and how many tokens each.

Each step (Yu et al. 2022, "Orca", OSDI; Kwon et al. 2023, arXiv:2309.06180):
1. Running sequences in decode get one token each; if the KV cache has no block for one, the
   lowest-priority running sequence (latest arrival among equals) is preempted by recomputation:
   its blocks are freed and it goes back to the front of the waiting queue, to be prefilled again
   with its prompt and the tokens it generated so far.
2. Sequences still prefilling continue with the next chunk of their prompt.
3. Waiting sequences are admitted in (priority, arrival) order while blocks, `max_num_seqs` and the
   token budget allow.
A decode may carry speculative draft tokens (`Sequence.draft_token_ids`, `serving.spec_decode`): they
run as extra query positions of that sequence, in the same step, when the budget and free blocks allow
(otherwise they are dropped, never a reason to preempt).
Prefills are chunked: at most `max_num_batched_tokens` tokens run per step, so a long prompt does not
stall the decodes of everyone else (Agrawal et al. 2024, "Sarathi-Serve", arXiv:2403.02310).

A model with sliding-window layers may have a second pool (`SlidingBlockManager`) whose blocks are
taken one step ahead: every scheduled chunk or decode token needs room in both pools, preemption
frees both, and a continuing prefill can preempt like a decode when the sliding pool is full.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from serving.engine.block_manager import BlockManager
from serving.engine.sequence import Sequence, SequenceStatus
from serving.engine.sliding_block_manager import SlidingBlockManager, max_blocks_per_seq


@dataclass(frozen=True)
class SchedulerConfig:
    """Batch limits.

    Attributes:
        max_num_seqs: sequences running at once.
        max_num_batched_tokens: tokens (prefill chunks + decodes) per step.
    """

    max_num_seqs: int = 32
    max_num_batched_tokens: int = 512

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_seqs and max_num_batched_tokens must be >= 1, got {self}")


@dataclass
class SchedulerOutput:
    """One step's plan: (sequence, number of new tokens) in batch order, KV blocks to copy first
    ((src, dst) pairs of the global pool, and of the sliding-window pool)."""

    scheduled: list[tuple[Sequence, int]] = field(default_factory=list)
    block_copies: list[tuple[int, int]] = field(default_factory=list)
    sliding_block_copies: list[tuple[int, int]] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    """Continuous batching over one global KV pool and, optionally, a sliding-window pool.

    Raises:
        ValueError: a sliding pool with prefix caching on (its KV of a cached prefix may be gone), or
            one too small for a single sequence (fewer blocks than both the global pool and
            `max_blocks_per_seq`).
    """

    def __init__(self, config: SchedulerConfig, block_manager: BlockManager, sliding: SlidingBlockManager | None = None):
        if sliding is not None:
            if block_manager.enable_prefix_caching:
                raise ValueError("prefix caching cannot be combined with a sliding-window pool")
            # A sequence holds no more sliding blocks than global ones, nor than `max_blocks_per_seq`.
            needed = min(block_manager.num_blocks,
                         max_blocks_per_seq(sliding.sliding_window, sliding.block_size, config.max_num_batched_tokens))
            if sliding.num_blocks < needed:
                raise ValueError(f"the sliding-window pool has {sliding.num_blocks} blocks; one sequence may need {needed}")
        self.config = config
        self.block_manager = block_manager
        self.sliding = sliding
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        """Queue a new sequence. Raises ValueError if it can never fit in the KV cache."""
        needed = seq.num_blocks(self.block_manager.block_size)
        if needed > self.block_manager.num_blocks:
            raise ValueError(
                f"sequence {seq.seq_id} needs {needed} KV blocks but the cache has {self.block_manager.num_blocks}"
            )
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def add_running(self, seq: Sequence) -> None:
        """Add a sequence that already holds blocks (a fork of a running one)."""
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, seq: Sequence) -> None:
        """Remove a finished or aborted sequence and free its blocks."""
        seq.status = SequenceStatus.FINISHED
        if seq in self.running:
            self.running.remove(seq)
        if seq in self.waiting:
            self.waiting.remove(seq)
        self._free(seq)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        bm = self.block_manager
        # 1. decodes (and continuing prefills) of running sequences, in priority order.
        self.running.sort(key=lambda s: (s.priority, s.arrival_time))
        kept: list[Sequence] = []
        queue = list(self.running)
        while queue and budget > 0:
            seq = queue.pop(0)
            remaining = seq.num_tokens - seq.num_computed_tokens
            num_new = min(remaining, budget) if remaining > 1 else 1  # a prefill chunk, or a decode
            while not self._can_append(seq, num_new) and queue:
                self._preempt(queue.pop(), out)
            if not self._can_append(seq, num_new):
                self._preempt(seq, out)
                continue
            if remaining == 1:
                num_new += self._fit_drafts(seq, budget)
                copy = bm.append_slot(seq)
                if copy is not None:
                    out.block_copies.append(copy)
                if num_new > 1:
                    bm.append_draft_slots(seq, num_new - 1)
            self._append_sliding_slots(seq, num_new, out)
            out.scheduled.append((seq, num_new))
            kept.append(seq)
            budget -= num_new
        for seq in queue:  # over budget this step: they wait in place, their drafts dropped
            seq.draft_token_ids = []
        kept.extend(queue)
        self.running = kept
        # 2. admit waiting sequences while the batch, the blocks and the budget allow.
        if not out.preempted:
            self.waiting.sort(key=lambda s: (s.priority, s.arrival_time))
            while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
                seq = self.waiting[0]
                num_new = min(seq.num_tokens, budget)  # no prefix-cache hit is known yet: the most it takes
                if not bm.can_allocate(seq) or (self.sliding is not None and not self.sliding.can_append_slots(seq, num_new)):
                    break
                self.waiting.pop(0)
                bm.allocate(seq)
                seq.status = SequenceStatus.RUNNING
                num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
                self._append_sliding_slots(seq, num_new, out)
                out.scheduled.append((seq, num_new))
                self.running.append(seq)
                budget -= num_new
        return out

    def _can_append(self, seq: Sequence, num_new: int) -> bool:
        """Whether both pools have room for `num_new` tokens of a running sequence (1 = a decode)."""
        if num_new == seq.num_tokens - seq.num_computed_tokens == 1 and not self.block_manager.can_append(seq):
            return False
        return self.sliding is None or self.sliding.can_append_slots(seq, num_new)

    def _fit_drafts(self, seq: Sequence, budget: int) -> int:
        """How many of a decode's draft tokens run with it: as many as the budget and free blocks of both
        pools allow (drafts never preempt anyone); `seq.draft_token_ids` is cut to that many."""
        num_draft = min(len(seq.draft_token_ids), budget - 1)
        while num_draft > 0 and not (self.block_manager.can_append_drafts(seq, num_draft) and (
                self.sliding is None or self.sliding.can_append_slots(seq, 1 + num_draft))):
            num_draft -= 1
        del seq.draft_token_ids[num_draft:]
        return num_draft

    def _append_sliding_slots(self, seq: Sequence, num_new: int, out: SchedulerOutput) -> None:
        if self.sliding is not None:
            copy = self.sliding.append_slots(seq, num_new)
            if copy is not None:
                out.sliding_block_copies.append(copy)

    def _free(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        if self.sliding is not None:
            self.sliding.free(seq)

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self._free(seq)
        seq.draft_token_ids = []
        seq.status = SequenceStatus.PREEMPTED
        if seq in self.running:
            self.running.remove(seq)
        self.waiting.insert(0, seq)
        out.preempted.append(seq)
        self.num_preemptions += 1
