"""One sequence of the batching engine: its tokens, its state and its block table.

A request with `n` samples becomes `n` sequences; they share the prompt's KV blocks through
`serving.engine.block_manager.BlockManager.fork`. The block manager fills `block_table`,
`num_cached_tokens` and `num_computed_tokens`; the scheduler moves `status`.
"""

from __future__ import annotations

import enum
import math
import time
from dataclasses import dataclass, field


class SequenceStatus(enum.Enum):
    """Where a sequence is in the scheduler: waiting for blocks, running, preempted or finished."""

    WAITING = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED = enum.auto()


@dataclass
class Sequence:
    """The token ids of one sequence and the bookkeeping of its paged KV cache.

    Attributes:
        seq_id: unique among live sequences.
        prompt_token_ids: the prompt, at least one token (copied on construction).
        output_token_ids: generated tokens, in order.
        status: the scheduler state.
        block_table: physical KV block ids in logical order; block i holds positions
            [i * block_size, (i + 1) * block_size). Empty while the sequence holds no blocks.
        sliding_block_table: the same for the sliding-window layers' own pool, when the engine has one
            (`serving.engine.sliding_block_manager`): it covers the positions computed or scheduled so far,
            and entries no future query can read point to the pool's null block.
        num_cached_tokens: leading tokens whose KV came from the prefix cache at allocation
            (a multiple of the block size, always below `num_tokens`). After a preemption by
            recomputation this may include earlier output tokens.
        num_computed_tokens: leading tokens whose KV is in the cache.
        priority: scheduling priority (lower is served first, as in vLLM).
        arrival_time: seconds on the `time.monotonic()` clock.
        draft_token_ids: speculative tokens proposed after `token_ids` for the next step to verify
            (`serving.spec_decode`); not part of the sequence, emptied once verified.

    Raises:
        ValueError: on an empty prompt or token counts out of range.
    """

    seq_id: int
    prompt_token_ids: list[int]
    output_token_ids: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    block_table: list[int] = field(default_factory=list)
    sliding_block_table: list[int] = field(default_factory=list)
    num_cached_tokens: int = 0
    num_computed_tokens: int = 0
    priority: int = 0
    arrival_time: float = field(default_factory=time.monotonic)
    draft_token_ids: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.prompt_token_ids = list(self.prompt_token_ids)
        self.output_token_ids = list(self.output_token_ids)
        self.block_table = list(self.block_table)
        self.sliding_block_table = list(self.sliding_block_table)
        if not self.prompt_token_ids:
            raise ValueError(f"sequence {self.seq_id}: the prompt must hold at least one token")
        if not 0 <= self.num_cached_tokens <= self.num_computed_tokens <= self.num_tokens:
            raise ValueError(
                f"sequence {self.seq_id}: need 0 <= num_cached_tokens ({self.num_cached_tokens}) <= "
                f"num_computed_tokens ({self.num_computed_tokens}) <= num_tokens ({self.num_tokens})"
            )

    @property
    def token_ids(self) -> list[int]:
        """Prompt then output tokens (a new list)."""
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def last_token_id(self) -> int:
        return self.output_token_ids[-1] if self.output_token_ids else self.prompt_token_ids[-1]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def append_token(self, token_id: int) -> None:
        """Add a sampled token; its KV is not computed yet (call `BlockManager.append_slot` next)."""
        self.output_token_ids.append(token_id)

    def num_blocks(self, block_size: int) -> int:
        """Blocks needed to hold every token: ceil(num_tokens / block_size)."""
        return math.ceil(self.num_tokens / block_size)

    def fork(self, seq_id: int) -> Sequence:
        """A copy with a new id and no blocks, for `BlockManager.fork` to share this one's blocks."""
        return Sequence(
            seq_id=seq_id,
            prompt_token_ids=self.prompt_token_ids,
            output_token_ids=self.output_token_ids,
            status=self.status,
            priority=self.priority,
            arrival_time=self.arrival_time,
        )
