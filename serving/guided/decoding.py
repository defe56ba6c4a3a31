"""Constrained sampling: choose each token so the output stays a prefix of a valid JSON document (or of
tagged blocks, see `serving.guided.automaton`).

Lazy masking: rather than testing all V tokens every step, the guide walks the tokens in descending
(penalized) logit order and feeds each token's text to a copy of the `JsonAutomaton` state:

- greedy: the first token that keeps the text valid is the argmax of the masked logits, exactly;
- sampled: it keeps collecting valid tokens until the next candidate's probability is below
  `EPSILON` times the best valid token's (at the request's temperature), or `MAX_EXTRA_CANDIDATES`
  tokens were tested after the first valid one; the request's own `Sampler` (temperature, top-k/p,
  min-p, seeded generator) then draws from the logits with every other token masked to -inf. The
  tail this leaves out holds under EPSILON * MAX_EXTRA_CANDIDATES of the valid mass.

Where every path is inside fixed text (a tag such as `<tool_call>`), only the tokens whose text starts
with the forced character are ranked (`TokenTable.starting_with`), so forcing text the model does not
expect costs no walk down a 262k-token vocabulary.

The walk stops at a deadline (`sample(..., deadline=)`; the engine gives `EngineConfig.sample_timeout_s`,
`serving.engine.sample_budget`): a schema whose branches multiply could otherwise hold the engine's step for
minutes, and every other request with it.

End-of-sequence tokens are valid only once the document is complete, so a finished output always
parses; an output cut by `max_tokens` ends with finish_reason "length". With
`SamplingParams.strip_leading_space` (the in-context chat format) the space that the engine drops from
the start of the output is dropped from the first token's text before it is fed, so the automaton sees
exactly the text the client gets.
"""

from __future__ import annotations

import math
import time
from typing import Iterator, Sequence

import torch

from serving.errors import SamplingTimeoutError
from serving.guided.automaton import JsonAutomaton, State
from serving.sampling.logits_processors import apply_logit_bias, apply_penalties, mask_stop_tokens
from serving.sampling.sampler import Sampler

EPSILON = 1e-4
MAX_EXTRA_CANDIDATES = 256
FIRST_CANDIDATES = 64


class TokenTable:
    """Each token id's text as it reads inside a longer output, or None for tokens guided decoding never uses.

    Special tokens (empty text) and tokens that decode to part of a multi-byte character (U+FFFD) are
    left out. A token is decoded after an anchor token so that decoders that strip a leading space
    from the first token of a text (SentencePiece's Metaspace) give the text it has mid-output.

    Args:
        tokenizer: a `serving.text.tokenizer.Tokenizer` (needs `encode`, `decode`, `vocab_size`, `eos_token_ids`).
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
        by_first: dict[str, list[int]] = {}
        for tid, text in enumerate(self.texts):
            if text is not None:
                by_first.setdefault(text[0], []).append(tid)
        self._by_first = {c: torch.tensor(ids, dtype=torch.long) for c, ids in by_first.items()}

    def starting_with(self, c: str) -> torch.Tensor:
        """The ids of the tokens whose text starts with the character `c`, shape [k] (long)."""
        return self._by_first.get(c, torch.empty(0, dtype=torch.long))


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
        self._skip_space = sampler.params.strip_leading_space  # until the first token is chosen

    @property
    def is_complete(self) -> bool:
        return self.automaton.is_complete(self.state)

    @property
    def is_closed(self) -> bool:
        """True once the output has ended on every path (the document closed, the last tag written):
        then only end of output may follow, so the answer stops right after the JSON, as OpenAI's does."""
        return self.automaton.is_closed(self.state)

    def _next_state(self, token_id: int, deadline: float | None = None) -> State | None:
        if token_id in self.table.eos_ids:
            return self.state if self.is_complete else None
        if self.is_closed:
            return None
        text = self.table.texts[token_id] if token_id < len(self.table.texts) else None
        if text is not None and self._skip_space and text.startswith(" "):
            text = text[1:] or None  # a bare space first would leave the model after "▁", where it answers badly
        return None if text is None else self.automaton.feed(self.state, text, deadline)

    def sample(self, logits: torch.Tensor, prompt_ids: Sequence[int] = (), output_ids: Sequence[int] = (),
               deadline: float | None = None) -> int:
        """Choose the next token among those that keep the output valid, and advance the state.

        Args:
            logits: the model's raw logits for the next position, shape [V].
            prompt_ids, output_ids: for the penalties (as `Sampler.sample`).
            deadline: a `time.monotonic()` time, checked before each candidate token and inside large
                automaton states (`JsonAutomaton.feed`); None: no limit.
        Returns:
            The token id. When no token can continue the document (a vocabulary unable to spell what
            the schema needs), an end-of-sequence id.
        Raises:
            SamplingTimeoutError: the deadline passed; the state is left as it was.
        """
        sampler = self.sampler
        params = sampler.params
        # The sampler's own order: logit bias, the min_tokens mask, then penalties.
        ranked = mask_stop_tokens(apply_logit_bias(logits, params), params, len(output_ids), sampler.eos_token_ids)
        ranked = apply_penalties(ranked, params, prompt_ids, output_ids)
        states: dict[int, State] = {}
        best, extra = None, 0
        forced = None if self._skip_space else self.automaton.forced_char(self.state)
        for tid, value in _ranked(ranked, None if forced is None else self.table.starting_with(forced)):
            if value == float("-inf"):
                break
            if deadline is not None and time.monotonic() > deadline:
                raise SamplingTimeoutError("guided decoding ran past its deadline")
            if best is not None:
                extra += 1
                if params.is_greedy or extra > MAX_EXTRA_CANDIDATES or (value - best) / params.temperature < math.log(EPSILON):
                    break
            nxt = self._next_state(tid, deadline)
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
        self.state, self._skip_space = states[token], False
        return token


def _ranked(x: torch.Tensor, among: torch.Tensor | None = None) -> Iterator[tuple[int, float]]:
    """(token id, value) in descending value order: the top FIRST_CANDIDATES first, the full sort only if needed.

    Args:
        x: values, shape [V].
        among: only these token ids (shape [k], long), or None for all of them.
    """
    names = None if among is None else among.tolist()
    if among is not None:
        x = x[among]
    k = min(FIRST_CANDIDATES, x.shape[0])
    values, ids = torch.topk(x, k)
    head = ids.tolist()
    for i, value in zip(head, values.tolist()):
        yield (i if names is None else names[i]), value
    if k == x.shape[0]:
        return
    seen = set(head)
    values, ids = torch.sort(x, descending=True)
    for i, value in zip(ids.tolist(), values.tolist()):
        if i not in seen:
            yield (i if names is None else names[i]), value
