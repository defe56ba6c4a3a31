"""`Speculator`: the engine's side of speculative decoding, between the drafter and the sampler.

Each engine step with speculation on:
1. `propose`: the decoding sequences get draft tokens (`Sequence.draft_token_ids`), as many as the
   lookahead policy allows (`policy.py`) and the request can still use.
2. The scheduler runs each draft as extra query positions of its sequence's decode (one forward pass
   over the paged KV cache; drafts that do not fit the token budget or the free blocks are cut).
3. `verify`: the k + 1 logits rows decide the accepted prefix and one more token (`rejection.py`),
   with the request's own logits processing, so the output distribution is unchanged; the engine then
   appends them and rolls the KV cache back past the last accepted token.
"""

from __future__ import annotations

import torch

from serving.sampler import Sampler
from serving.sequence import Sequence
from serving.spec_decode.config import SpeculativeConfig
from serving.spec_decode.drafter import make_drafter
from serving.spec_decode.policy import AcceptanceState, LookaheadPolicy
from serving.spec_decode.rejection import num_greedy_accepted, rejection_sample


class Speculator:
    """Drafts for a batch and verifies one sequence's drafts.

    Args:
        config: the engine's `SpeculativeConfig`.
        loaded: the target `LoadedModel` (a draft model is loaded to match it).
    """

    def __init__(self, config: SpeculativeConfig, loaded) -> None:
        self.config = config
        self.policy = LookaheadPolicy(config)
        self.drafter = make_drafter(config, loaded)

    def propose(self, candidates: list[tuple[Sequence, int, AcceptanceState]], num_decoding: int) -> None:
        """Set `draft_token_ids` of each (decoding sequence, most drafts it can use, its record).

        `num_decoding` is the step's decode batch size, for the engine-wide backoff.
        """
        cap = self.policy.batch_cap(num_decoding)
        if cap == 0:
            return
        wanted = []
        for seq, limit, state in candidates:
            k = min(limit, self.policy.num_draft(state, cap))
            if k > 0:
                wanted.append((seq, k))
        if wanted:
            for (seq, _), drafts in zip(wanted, self.drafter.propose(wanted)):
                seq.draft_token_ids = list(drafts)

    def verify(self, sampler: Sampler, seq: Sequence, rows: torch.Tensor, state: AcceptanceState) -> list[int]:
        """The tokens `seq` emits this step: its accepted drafts, then the target's own next token.

        Args:
            sampler: the sequence's sampler (its params, its generator).
            seq: a sequence whose `draft_token_ids` (k of them) ran this step; they are cleared.
            rows: [k + 1, V] raw logits; row i follows draft i - 1 (row 0 the last verified token).
            state: the sequence's record, updated with the step's drafted / accepted counts.
        """
        drafts, seq.draft_token_ids = seq.draft_token_ids, []
        if sampler.is_plain_greedy(seq.num_output_tokens) and bool(torch.isfinite(rows.max(dim=-1).values).all()):
            targets = rows.max(dim=-1).indices.tolist()  # lowest id on ties, as `batched_argmax`
            num_accepted = num_greedy_accepted(drafts, targets)
            tokens = drafts[:num_accepted] + [targets[num_accepted]]
        else:
            prompt, output = seq.prompt_token_ids, seq.output_token_ids
            dists = [sampler.distribution(rows[i], prompt, output + drafts[:i]) for i in range(len(drafts) + 1)]
            tokens = rejection_sample(drafts, dists, sampler.generator)
        self.policy.update(state, len(drafts), len(tokens) - 1)
        return tokens
