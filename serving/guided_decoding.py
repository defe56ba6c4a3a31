"""Constrained sampling: choose each token so the output stays a prefix of a valid JSON document.

Lazy masking: rather than testing all V tokens every step, the guide walks the tokens in descending
(penalized) logit order and feeds each token's text to a copy of the `JsonAutomaton` state:

- greedy: the first token that keeps the text valid is the argmax of the masked logits, exactly;
- sampled: it keeps collecting valid tokens until the next candidate's probability is below
  `EPSILON` times the best valid token's (at the request's temperature), or `MAX_EXTRA_CANDIDATES`
  tokens were tested after the first valid one; the request's own `Sampler` (temperature, top-k/p,
  min-p, seeded generator) then draws from the logits with every other token masked to -inf. The
  tail this leaves out holds under EPSILON * MAX_EXTRA_CANDIDATES of the valid mass.

End-of-sequence tokens are valid only once the document is complete, so a finished output always
parses; an output cut by `max_tokens` ends with finish_reason "length".
"""

from __future__ import annotations

import math
from typing import Iterator, Sequence

import torch

from serving.guided_json import JsonAutomaton, State
from serving.sampler import Sampler, apply_logit_bias, apply_penalties, mask_stop_tokens

EPSILON = 1e-4
MAX_EXTRA_CANDIDATES = 256
FIRST_CANDIDATES = 64


class TokenTable:
    """Each token id's text as it reads inside a longer output, or None for tokens guided decoding never uses.

    Special tokens (empty text) and tokens that decode to part of a multi-byte character (U+FFFD) are
    left out. A token is decoded after an anchor token so that decoders that strip a leading space
    from the first token of a text (SentencePiece's Metaspace) give the text it has mid-output.

    Args:
        tokenizer: a `serving.tokenizer.Tokenizer` (needs `encode`, `decode`, `vocab_size`, `eos_token_ids`).
    """

    def __init__(self, tokenizer):
        anchor = tokenizer.encode("a", add_special_tokens=False)[:1]
        head = tokenizer.decode(anchor)
        self.texts: list[str | None] = []
        for tid in range(tokenizer.vocab_size):
            text = tokenizer.decode(anchor + [tid])
            text = text[len(head):] if text.startswith(head) else tokenizer.decode([tid])
            self.texts.append(text if text and "\ufffd" not in text else None)
        self.eos_ids = frozenset(tokenizer.eos_token_ids)


class JsonGuide:
    """The per-sequence constraint: an automaton state advanced by every chosen token.

    Args:
        automaton: the compiled schema.
        table: the model's `TokenTable`.
        sampler: the sequence's `Sampler` (its params and seeded generator draw the token).
    """

    def __init__(self, automaton: JsonAutomaton, table: TokenTable, sampler: Sampler):
        self.automaton, self.table, self.sampler = automaton, table, sampler
        self.state: State = automaton.start()

    @property
    def is_complete(self) -> bool:
        return self.automaton.is_complete(self.state)

    @property
    def is_closed(self) -> bool:
        """True once the top-level value has ended on every path (a closing brace, bracket or quote):
        then only end of output may follow, so the answer stops right after the JSON, as OpenAI's does,
        instead of padding with whitespace up to max_tokens."""
        return bool(self.state) and all(frame[0] == "done" for (frame, _), _ in self.state)

    def _next_state(self, token_id: int) -> State | None:
        if token_id in self.table.eos_ids:
            return self.state if self.is_complete else None
        if self.is_closed:
            return None
        text = self.table.texts[token_id] if token_id < len(self.table.texts) else None
        return None if text is None else self.automaton.feed(self.state, text)

    def sample(self, logits: torch.Tensor, prompt_ids: Sequence[int] = (), output_ids: Sequence[int] = ()) -> int:
        """Choose the next token among those that keep the output valid, and advance the state.

        Args:
            logits: the model's raw logits for the next position, shape [V].
            prompt_ids, output_ids: for the penalties (as `Sampler.sample`).
        Returns:
            The token id. When no token can continue the document (a vocabulary unable to spell what
            the schema needs), an end-of-sequence id.
        """
        sampler = self.sampler
        params = sampler.params
        # The sampler's own order: logit bias, the min_tokens mask, then penalties.
        ranked = mask_stop_tokens(apply_logit_bias(logits, params), params, len(output_ids), sampler.eos_token_ids)
        ranked = apply_penalties(ranked, params, prompt_ids, output_ids)
        states: dict[int, State] = {}
        best, extra = None, 0
        for tid, value in _ranked(ranked):
            if value == float("-inf"):
                break
            if best is not None:
                extra += 1
                if params.is_greedy or extra > MAX_EXTRA_CANDIDATES or (value - best) / params.temperature < math.log(EPSILON):
                    break
            nxt = self._next_state(tid)
            if nxt is not None:
                states[tid] = nxt
                best = value if best is None else best
        if not states:
            token = min(self.table.eos_ids) if self.table.eos_ids else int(torch.argmax(logits))
            return token
        if len(states) == 1:
            token = next(iter(states))
        else:
            allowed = torch.tensor(list(states), dtype=torch.long, device=logits.device)
            masked = torch.full_like(logits, float("-inf"))
            masked[allowed] = logits[allowed]
            token = sampler.sample(masked, prompt_ids, output_ids)
        self.state = states[token]
        return token


def _ranked(x: torch.Tensor) -> Iterator[tuple[int, float]]:
    """(token id, value) in descending value order: the top FIRST_CANDIDATES first, the full sort only if needed."""
    k = min(FIRST_CANDIDATES, x.shape[0])
    values, ids = torch.topk(x, k)
    seen = ids.tolist()
    yield from zip(seen, values.tolist())
    if k == x.shape[0]:
        return
    seen = set(seen)
    values, ids = torch.sort(x, descending=True)
    for tid, value in zip(ids.tolist(), values.tolist()):
        if tid not in seen:
            yield tid, value
