"""`Speculator`: the engine's side of speculative decoding, between the drafter and the sampler.

Each engine step with speculation on:
1. `propose`: the decoding sequences get draft tokens (`Sequence.draft_token_ids`), as many as the
   lookahead policy allows (`policy.py`) and the request can still use, when the step is expected to
   pay (with `step_cost`, the default: `step_cost.py`, from the engine's timing of its decode-only steps, `begin_step` /
   `end_step`). When it is not, a cheap drafter (n-gram) still proposes one token per sequence, which
   the next `propose` checks against the token the target emitted: the requests' acceptance rates stay
   current while nobody drafts, and speculation returns when the text turns repetitive.
2. The scheduler runs each draft as extra query positions of its sequence's decode (one forward pass
   over the paged KV cache; drafts that do not fit the token budget or the free blocks are cut).
3. `verify`: the k + 1 logits rows decide the accepted prefix and one more token (`rejection.py`),
   with the request's own logits processing, so the output distribution is unchanged; the engine then
   appends them and rolls the KV cache back past the last accepted token.

`make_drafter` picks the drafter of `config.method` (the drafters' modules import only `drafter.py`).
"""

from __future__ import annotations

import torch

from serving.engine.sequence import Sequence
from serving.sampling.sampler import Sampler
from serving.spec_decode.config import SpeculativeConfig
from serving.spec_decode.drafter import Drafter, NgramDrafter
from serving.spec_decode.policy import AcceptanceState, LookaheadPolicy
from serving.spec_decode.rejection import num_greedy_accepted, rejection_sample
from serving.spec_decode.step_cost import StepCostModel


def make_drafter(config: SpeculativeConfig, loaded) -> Drafter:
    """The drafter of `config.method`; "draft" loads `config.draft_model` (same dtype as `loaded`, the
    target `LoadedModel`).

    Raises:
        ServingError: an unknown draft model, or one whose tokenizer differs from the target's.
    """
    if config.method == "ngram":
        return NgramDrafter(config.ngram_max, config.ngram_min)
    from serving.spec_decode.draft_model import DraftModelDrafter  # the model machinery, only when a model drafts

    return DraftModelDrafter.load(config.draft_model, loaded)


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
        self.cost = StepCostModel() if config.adaptive and config.step_cost else None
        self._num_running = 0
        self._step_has_drafts: bool | None = None  # the running step: decode-only with / without drafts; None: other
        self._unsent: dict[int, tuple[int, int]] = {}  # seq_id -> (position, token) proposed in a step that did not draft
        self._step_predicted = 0.0   # the drafting step's predicted accepted drafts, as `propose` decided (uncalibrated)
        self._step_accepted = 0      # and what `verify` kept of them

    def propose(self, candidates: list[tuple[Sequence, AcceptanceState, int | None]], num_running: int,
                max_model_len: int) -> None:
        """Set `draft_token_ids` of the decoding sequences among `candidates`.

        Args:
            candidates: (a running sequence that may draft, its record, its request's `max_tokens` or None);
                sequences still prefilling are skipped.
            num_running: sequences running as the step starts, for the batch threshold and backoff.
            max_model_len: the engine's longest sequence; drafts stop where the target's own next token
                would reach it or `max_tokens`.
        """
        self._num_running = num_running
        self._check_unsent(candidates)
        cap = self.policy.batch_cap(num_running)
        if cap == 0:
            return
        wanted, expected = [], 0.0
        for seq, state, max_tokens in candidates:
            if seq.num_computed_tokens != seq.num_tokens - 1:
                continue
            limit = max_model_len - seq.num_tokens - 1
            if max_tokens is not None:
                limit = min(limit, max_tokens - seq.num_output_tokens - 1)
            k = min(limit, self.policy.num_draft(state, cap))
            if k > 0:
                wanted.append((seq, k))
                expected += state.acceptance_ema * k
        if not wanted:
            return
        if self.cost is not None and not self.cost.pays(num_running, expected):
            if self.drafter.is_cheap:
                firsts = self.drafter.propose([(seq, 1) for seq, _ in wanted])
                self._unsent.update({seq.seq_id: (seq.num_tokens, d[0]) for (seq, _), d in zip(wanted, firsts) if d})
            return
        self._step_predicted = expected  # what the decision assumed: calibrated against what verify keeps
        for (seq, _), drafts in zip(wanted, self.drafter.propose(wanted)):
            seq.draft_token_ids = list(drafts)

    def release(self, seq_id: int) -> None:
        """Forget a finished sequence."""
        self._unsent.pop(seq_id, None)
        self.drafter.release(seq_id)

    def _check_unsent(self, candidates: list[tuple[Sequence, AcceptanceState, int | None]]) -> None:
        """Each unsent proposal whose position the target has since filled counts as one draft, accepted
        when the tokens agree (the acceptance average only; the request's counts are for real drafts)."""
        for seq, state, _ in candidates:
            unsent = self._unsent.get(seq.seq_id)
            if unsent is not None and seq.num_tokens > unsent[0]:
                del self._unsent[seq.seq_id]
                self.policy.observe(state, 1, int(seq.token_ids[unsent[0]] == unsent[1]))

    def begin_step(self, scheduled: list[tuple[Sequence, int]]) -> None:
        """Note the scheduled step (before it runs): is it decode-only, and does it carry drafts?"""
        decode_only = all(seq.num_computed_tokens == seq.num_tokens - 1 and n == 1 + len(seq.draft_token_ids)
                          for seq, n in scheduled)
        self._step_has_drafts = any(seq.draft_token_ids for seq, _ in scheduled) if decode_only else None

    def end_step(self, seconds: float) -> None:
        """The step noted by `begin_step` took `seconds` from `propose` to its last token."""
        if self.cost is not None and self._step_has_drafts is not None:
            self.cost.record(self._num_running, self._step_has_drafts, seconds)
            if self._step_has_drafts:
                self.cost.observe_accepted(self._step_predicted, self._step_accepted)
                self.cost.observe_probe(self._num_running, self._step_accepted, seconds)
        self._step_has_drafts = None
        self._step_predicted, self._step_accepted = 0.0, 0

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
        self._step_accepted += len(tokens) - 1
        return tokens
