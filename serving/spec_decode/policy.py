"""Adaptive lookahead: how many tokens to draft for a sequence this step.

Two rules (`SpeculativeConfig`; both only when `adaptive`, except the batch threshold, which always holds):

1. Per request, k follows the request's acceptance rate. After each verification step with d > 0
   drafts of which a were accepted, the exponential moving average r <- (1 - alpha) r + alpha (a / d)
   (alpha = `ema_alpha`, r starts at 1). The next draft length is
   k = k_min + round(r (k_max - k_min)): all drafts accepted drives k to k_max, none to k_min.
   A sequence with no n-gram match drafts nothing that step and costs nothing.
2. Across the engine, speculation backs off as the decode batch grows: with b sequences decoding,
   k is capped at ceil(k_max (B - b + 1) / B) for b <= B = `max_batch_size` (k_max at b = 1, about 1
   at b = B) and no one drafts when b > B. At large batches decode is compute-bound and verifying
   drafts costs more than the steps it saves; the cap lifts again when the load falls.

With `adaptive` off, every sequence with a match drafts k_max tokens while b <= B.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from serving.spec_decode.config import SpeculativeConfig


@dataclass
class AcceptanceState:
    """One sequence's speculation record.

    Attributes:
        acceptance_ema: moving average of accepted / drafted per verification step, in [0, 1].
        num_draft_tokens, num_accepted_tokens: totals over the sequence's life.
        num_draft_steps: verification steps that carried at least one draft.
    """

    acceptance_ema: float = 1.0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_draft_steps: int = 0


class LookaheadPolicy:
    """The draft length of each sequence (see the module docstring)."""

    def __init__(self, config: SpeculativeConfig) -> None:
        self.config = config

    def batch_cap(self, num_decoding: int) -> int:
        """Most drafts per sequence in a step where `num_decoding` sequences decode (0 = no speculation)."""
        c = self.config
        if num_decoding > c.max_batch_size:
            return 0
        if not c.adaptive:
            return c.num_speculative_tokens
        free = c.max_batch_size - max(1, num_decoding) + 1
        return max(c.min_speculative_tokens, math.ceil(c.num_speculative_tokens * free / c.max_batch_size))

    def num_draft(self, state: AcceptanceState, cap: int) -> int:
        """This sequence's draft length under the step's `cap`."""
        c = self.config
        if not c.adaptive:
            return min(cap, c.num_speculative_tokens)
        k = c.min_speculative_tokens + round(state.acceptance_ema * (c.num_speculative_tokens - c.min_speculative_tokens))
        return min(cap, k)

    def update(self, state: AcceptanceState, num_drafted: int, num_accepted: int) -> None:
        """Record one verification step (num_drafted >= 1 drafts, num_accepted of them kept)."""
        if num_drafted < 1:
            return
        alpha = self.config.ema_alpha
        state.acceptance_ema = (1 - alpha) * state.acceptance_ema + alpha * num_accepted / num_drafted
        state.num_draft_tokens += num_drafted
        state.num_accepted_tokens += num_accepted
        state.num_draft_steps += 1
