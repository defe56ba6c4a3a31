"""Speculative decoding: draft k tokens cheaply, verify them in one forward pass of the target model.

`config.py` (`SpeculativeConfig`), `drafter.py` (the `Drafter` base, the n-gram drafter), `ngram.py`
(prompt lookup), `draft_model.py` (a smaller model of the same tokenizer drafting greedily),
`rejection.py` (acceptance rules over tensors), `policy.py` (adaptive lookahead: per-request k,
engine-wide backoff and the batch threshold), `step_cost.py` (on by default: does a speculative step pay,
by the measured verify-step cost?), `speculator.py` (the engine's side: `make_drafter`, drafts in, accepted tokens out).

Requests that never draft (they decode normally): guided decoding (`response_format`, structural tags,
forced tool calls), whose automaton advances one token at a time. Everything else speculates: greedy
and sampled decoding, penalties, logit bias, `min_tokens`, logprobs (each emitted token's row is its
own position's raw logits), stop strings, and n > 1 (each sample drafts on its own after the fork).

How to run its tests: `python -m pytest tests/serving/spec_decode/ -q`.
"""

from serving.spec_decode.config import SpeculativeConfig

__all__ = ["SpeculativeConfig"]
