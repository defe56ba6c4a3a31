"""Drafting with a smaller model of the same tokenizer (Leviathan et al. 2023; Chen et al. 2023).

The draft model keeps its own paged KV cache (one pool for all its layers, no prefix cache) and a
shadow `Sequence` per target sequence. Each `propose`:
1. syncs each shadow with its target: the tokens they share keep their draft KV (accepted drafts
   included), the rest is recomputed;
2. runs one batched catch-up pass (the new tokens since the last call; the whole prompt the first
   time) whose last logits give draft token 1;
3. runs k - 1 batched decode steps, each taking the argmax.
Drafts are greedy, so q is a point mass and the target verifies them with the point-mass rule of
`rejection.py` (sampled requests keep their distribution all the same). A sequence whose shadow
cannot get blocks, or that would run past the draft model's context, drafts nothing.
"""

from __future__ import annotations

import torch

from serving.engine.model_runner import ModelRunner
from serving.engine.paged_cache import PagedKVCache
from serving.engine.sequence import Sequence
from serving.errors import ServingError
from serving.spec_decode.drafter import Drafter

PROBE = "def f(x):\n    return x * 2  # Hello, world! Ça va? 12345"


def check_same_tokenizer(draft, target) -> None:
    """Raise ServingError unless the two `LoadedModel`s have one vocabulary (same size, same ids for a probe text)."""
    if (draft.config.vocab_size != target.config.vocab_size
            or draft.tokenizer.encode(PROBE, add_special_tokens=False) != target.tokenizer.encode(PROBE, add_special_tokens=False)):
        raise ServingError(f"draft model {draft.spec.name!r} does not share {target.spec.name!r}'s tokenizer; "
                           "pick a draft model of the same family")


class DraftModelDrafter(Drafter):
    """Greedy drafts from `loaded` (a `LoadedModel`).

    Args:
        loaded: the draft model, loaded in the target's dtype.
        block_size: tokens per block of the draft KV cache.
        kv_cache_bytes: memory of the draft KV cache.
    """

    def __init__(self, loaded, block_size: int = 16, kv_cache_bytes: int = 64 * 2**20) -> None:
        cfg = loaded.config
        per_block = PagedKVCache.bytes_per_block(cfg.num_layers, block_size, cfg.num_kv_heads, cfg.head_dim, loaded.dtype)
        num_blocks = max(1, kv_cache_bytes // per_block)
        self.loaded, self.block_size = loaded, block_size
        self.runner = ModelRunner(loaded.model, loaded.model.allocate_cache(num_blocks, block_size), loaded.spec.name)
        self._free = list(range(num_blocks))
        self._shadows: dict[int, Sequence] = {}  # target seq_id -> the draft model's copy of its tokens

    @classmethod
    def load(cls, name: str, target) -> DraftModelDrafter:
        """Load registry model `name` to draft for `target` (a `LoadedModel`).

        Raises:
            ServingError: unknown name, or a tokenizer that does not match the target's.
        """
        from serving.model_loader import load_model
        from serving.registry import default_registry

        loaded = load_model(default_registry().get(name), target.dtype)
        check_same_tokenizer(loaded, target)
        return cls(loaded)

    def propose(self, requests: list[tuple[Sequence, int]]) -> list[list[int]]:
        drafts: dict[int, list[int]] = {seq.seq_id: [] for seq, _ in requests}
        active: list[tuple[Sequence, int]] = []
        for seq, k in requests:
            shadow = self._sync(seq)
            if seq.num_tokens + k - 1 <= self.loaded.context_length and self._reserve(shadow, seq.num_tokens + k - 1):
                active.append((shadow, k))
        if not active:
            return [[] for _ in requests]
        scheduled = [(shadow, shadow.num_tokens - shadow.num_computed_tokens) for shadow, _ in active]
        for step in range(max(k for _, k in active)):
            logits = self.runner.execute(scheduled)
            for shadow, n in scheduled:
                shadow.num_computed_tokens += n
                token = int(torch.argmax(logits[shadow.seq_id]))
                drafts[shadow.seq_id].append(token)
                shadow.append_token(token)  # its KV comes with the next decode step, or the next call
            scheduled = [(shadow, 1) for shadow, k in active if k > step + 1]
            if not scheduled:
                break
        return [drafts[seq.seq_id] for seq, _ in requests]

    def release(self, seq_id: int) -> None:
        shadow = self._shadows.pop(seq_id, None)
        if shadow is not None:
            self._free.extend(shadow.block_table)

    def _sync(self, seq: Sequence) -> Sequence:
        """The shadow of `seq`, holding exactly its tokens; KV past their common prefix is invalidated."""
        shadow = self._shadows.get(seq.seq_id)
        tokens = seq.token_ids
        if shadow is None or shadow.prompt_token_ids != seq.prompt_token_ids:
            self.release(seq.seq_id)
            shadow = self._shadows[seq.seq_id] = Sequence(seq.seq_id, seq.prompt_token_ids)
        old = shadow.token_ids
        common = next((i for i, (a, b) in enumerate(zip(old, tokens)) if a != b), min(len(old), len(tokens)))
        shadow.output_token_ids = list(seq.output_token_ids)
        shadow.num_computed_tokens = min(shadow.num_computed_tokens, common, len(tokens) - 1)
        return shadow

    def _reserve(self, shadow: Sequence, num_positions: int) -> bool:
        """Blocks for positions [0, num_positions); False (nothing taken) when too few are free."""
        needed = -(-num_positions // self.block_size) - len(shadow.block_table)
        if needed > len(self._free):
            return False
        for _ in range(needed):
            shadow.block_table.append(self._free.pop())
        return True
