"""Adaptive lookahead: how many tokens to draft for a sequence this step, and whether to draft at all.

Three rules (`SpeculativeConfig`; all only when `adaptive`, except the batch threshold, which always holds;
the third only with `step_cost`):

1. Per request, k follows the request's acceptance rate. After each verification step with d > 0
   drafts of which a were accepted, the exponential moving average r <- (1 - alpha) r + alpha (a / d)
   (alpha = `ema_alpha`). A new request starts from the engine's recent rate, R, a slower average
   (weight `PRIOR_ALPHA`) over every verification step of every request, itself starting at 1: on
   text where drafts keep failing, new requests no longer spend their first steps on drafts that an
   optimistic r = 1 would justify (bursts of 2-3 short non-repetitive requests ran at 0.84x the speed
   of no speculation with r starting at 1). The next draft length is
   k = k_min + round(r (k_max - k_min)): all drafts accepted drives k to k_max, none to k_min.
   A sequence with no n-gram match drafts nothing that step and costs nothing.
2. Across the engine, speculation backs off as the batch grows. With b sequences running when the step
   starts (prefilling or decoding) and T = `disable_by_batch_size`, no one drafts when b >= T (vLLM's
   `speculative_disable_by_batch_size`); below it, k is capped at ceil(k_max (T - b) / (T - 1)): k_max
   at b = 1, about k_max / (T - 1) at b = T - 1. A verify step is dearer than a plain decode step by
   more the more sequences draft: each drafted sequence's attention runs on its own instead of in the
   batched decode call, and the compiled decode step does not apply (at a burst of 4 requests,
   speculating with a threshold of 8 ran at 0.89x the speed of not speculating). The cap lifts again
   when the load falls.
3. A step drafts only when it is expected to pay: the expected accepted drafts, sum of r k over the
   drafting sequences, against the measured cost of a verify step relative to a plain one at this b
   (`step_cost.StepCostModel`, from the engine's timing of its decode-only steps, which also corrects
   r k by what drafted steps really kept). Not r + r^2 + ... + r^k, the mean if each draft token were
   kept independently with probability r: prompt-lookup drafts are kept all or none more often than
   that (a copied span either continues or does not); the calibration absorbs what bias remains.

With `adaptive` off, every sequence with a match drafts k_max tokens while b < T.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from serving.engine.outputs import SpeculativeStats
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


def summarize(records: Iterable[AcceptanceState]) -> SpeculativeStats:
    """The request's counts: the sums over its sequences' records."""
    total = SpeculativeStats()
    for r in records:
        total.num_draft_tokens += r.num_draft_tokens
        total.num_accepted_tokens += r.num_accepted_tokens
        total.num_draft_steps += r.num_draft_steps
    return total


PRIOR_ALPHA = 0.1  # weight of the newest verification step in the engine-wide rate R, new requests' prior


class LookaheadPolicy:
    """The draft length of each sequence (see the module docstring).

    Attributes:
        engine_acceptance: R, the engine-wide acceptance average that new requests start from, in [0, 1].
    """

    def __init__(self, config: SpeculativeConfig) -> None:
        self.config = config
        self.engine_acceptance = 1.0

    def new_state(self) -> AcceptanceState:
        """A new sequence's record, its acceptance average starting at the engine's recent rate."""
        return AcceptanceState(acceptance_ema=self.engine_acceptance)

    def batch_cap(self, num_running: int) -> int:
        """Most drafts per sequence in a step that starts with `num_running` running sequences (0 = none)."""
        c = self.config
        threshold, num_running = c.disable_by_batch_size, max(1, num_running)
        if num_running >= threshold:
            return 0
        if not c.adaptive:
            return c.num_speculative_tokens
        free = threshold - num_running
        return max(c.min_speculative_tokens, math.ceil(c.num_speculative_tokens * free / (threshold - 1)))

    def num_draft(self, state: AcceptanceState, cap: int) -> int:
        """This sequence's draft length under the step's `cap`."""
        c = self.config
        if not c.adaptive:
            return min(cap, c.num_speculative_tokens)
        k = c.min_speculative_tokens + round(state.acceptance_ema * (c.num_speculative_tokens - c.min_speculative_tokens))
        return min(cap, k)

    def observe(self, state: AcceptanceState, num_drafted: int, num_accepted: int) -> None:
        """Move the acceptance average only (a draft checked without running it, see `Speculator`)."""
        alpha, rate = self.config.ema_alpha, num_accepted / num_drafted
        state.acceptance_ema = (1 - alpha) * state.acceptance_ema + alpha * rate
        self.engine_acceptance = (1 - PRIOR_ALPHA) * self.engine_acceptance + PRIOR_ALPHA * rate

    def update(self, state: AcceptanceState, num_drafted: int, num_accepted: int) -> None:
        """Record one verification step (num_drafted >= 1 drafts, num_accepted of them kept)."""
        if num_drafted < 1:
            return
        self.observe(state, num_drafted, num_accepted)
        state.num_draft_tokens += num_drafted
        state.num_accepted_tokens += num_accepted
        state.num_draft_steps += 1
