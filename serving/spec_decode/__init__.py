"""Speculative decoding: draft k tokens cheaply, verify them in one forward pass of the target model.

`config.py` (`SpeculativeConfig`), `ngram.py` (prompt-lookup drafter), `draft_model.py` (a small model
of the same tokenizer drafting greedily), `rejection.py` (acceptance rules over tensors), `policy.py`
(adaptive lookahead: per-request k, engine-wide backoff), `verify.py` (the engine's side: drafts in,
accepted tokens out, KV rolled back).
"""

from serving.spec_decode.config import SpeculativeConfig

__all__ = ["SpeculativeConfig"]
