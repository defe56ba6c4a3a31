"""`Drafter`: who proposes the draft tokens. A small base and the n-gram drafter.

    drafter = make_drafter(config, loaded)            # speculator.py: the drafter of config.method
    drafts = drafter.propose([(seq, k), ...])         # one list of <= k token ids per sequence
    drafter.release(seq.seq_id)                       # the sequence finished: drop any state kept for it
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from serving.engine.sequence import Sequence
from serving.spec_decode.ngram import propose_ngram


class Drafter(ABC):
    """Proposes up to k next tokens for each of a batch of sequences.

    `is_cheap`: proposing costs next to nothing (no model), so a step that does not draft may still
    propose, to check the proposal against the token the target emits.
    """

    is_cheap = False

    @abstractmethod
    def propose(self, requests: list[tuple[Sequence, int]]) -> list[list[int]]:
        """For each (sequence, k >= 1), at most k draft tokens continuing `sequence.token_ids` ([] = none)."""

    def release(self, seq_id: int) -> None:
        """Forget a finished sequence (a drafter that keeps per-sequence state overrides this)."""


class NgramDrafter(Drafter):
    """Prompt lookup (`serving.spec_decode.ngram`): no model, no state."""

    is_cheap = True

    def __init__(self, ngram_max: int, ngram_min: int) -> None:
        self.ngram_max, self.ngram_min = ngram_max, ngram_min

    def propose(self, requests: list[tuple[Sequence, int]]) -> list[list[int]]:
        return [propose_ngram(seq.token_ids, k, self.ngram_max, self.ngram_min) for seq, k in requests]
