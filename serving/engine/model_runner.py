"""`ModelRunner`: turns a scheduled step into batch tensors, runs the model, returns logits.

Between steps it applies the winners the tuner staged (`kernels.apply_pending`), and a decode-only
step runs through the decode-step winner of its batch-size bucket when one is installed
(`kernels.step_variant`, e.g. the `torch.compile`d step of `kernels.compiled`), else the eager model.
"""

from __future__ import annotations

import torch

import kernels
from serving.engine.paged_cache import BatchMetadata, PagedKVCache
from serving.engine.sequence import Sequence
from serving.models.base import CausalLM


class ModelRunner:
    """Runs one forward pass over a mixed batch of prefill chunks and decode tokens.

    Args:
        model: the loaded `CausalLM`.
        cache: the paged KV cache its attention layers read and write.
        model_name: the registry name, the key of this model's decode-step buckets.
    """

    def __init__(self, model: CausalLM, cache: PagedKVCache, model_name: str = ""):
        self.model, self.cache, self.model_name = model, cache, model_name
        self.dtype = model.embed_tokens.weight.dtype

    def build_batch(self, scheduled: list[tuple[Sequence, int]]) -> tuple[torch.Tensor, BatchMetadata]:
        """Token ids [N] and the `BatchMetadata` for the new tokens of each (sequence, count).

        With a sliding-window pool in the cache, also that pool's slots (from each sequence's
        `sliding_block_table`) and block tables, padded with the null block 0.
        """
        block_size = self.cache.block_size
        has_sliding = bool(self.cache.sliding_layers)
        token_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        sliding_slots: list[int] = []
        seq_lens, query_lens = [], []
        for seq, num_new in scheduled:
            start = seq.num_computed_tokens
            token_ids.extend((seq.token_ids + seq.draft_token_ids)[start : start + num_new])
            for pos in range(start, start + num_new):
                slots.append(seq.block_table[pos // block_size] * block_size + pos % block_size)
                if has_sliding:
                    sliding_slots.append(seq.sliding_block_table[pos // block_size] * block_size + pos % block_size)
            positions.extend(range(start, start + num_new))
            seq_lens.append(start + num_new)
            query_lens.append(num_new)
        batch = BatchMetadata(
            positions=torch.tensor(positions), slot_mapping=torch.tensor(slots),
            block_tables=_pad([seq.block_table for seq, _ in scheduled]), seq_lens=seq_lens, query_lens=query_lens,
            sliding_slot_mapping=torch.tensor(sliding_slots) if has_sliding else None,
            sliding_block_tables=_pad([seq.sliding_block_table for seq, _ in scheduled]) if has_sliding else None,
        )
        return torch.tensor(token_ids), batch

    @torch.inference_mode()
    def execute(self, scheduled: list[tuple[Sequence, int]], block_copies: list[tuple[int, int]] = (),
                sliding_block_copies: list[tuple[int, int]] = ()) -> dict[int, torch.Tensor]:
        """Run the step, after the copy-on-write block copies of each pool. Returns {seq_id: float32
        logits [V]} for each sequence whose scheduled tokens reach its end (a finished prefill, or a
        decode); chunks mid-prompt get none. A decode with k draft tokens (`seq.draft_token_ids`) gets
        logits [k + 1, V] instead: row i predicts the token after draft i (row 0: after the last token)."""
        kernels.apply_pending()
        self.cache.copy_blocks(list(block_copies), list(sliding_block_copies))
        token_ids, batch = self.build_batch(scheduled)
        step = None
        if all(n == 1 for _, n in scheduled):  # decode-only: the step a compiled decode step can replace
            step = kernels.step_variant("decode_step", len(scheduled), self.dtype, self.model_name)
        hidden = step(self.model, token_ids, batch, self.cache) if step is not None else self.model(token_ids, batch, self.cache)
        ends = batch.last_token_indices.tolist()
        rows: list[int] = []
        spans: dict[int, tuple[int, int]] = {}  # seq_id -> (first row, row count) in `logits`
        for i, (seq, n) in enumerate(scheduled):
            num_draft = len(seq.draft_token_ids)
            if seq.num_computed_tokens + n == seq.num_tokens + num_draft:
                spans[seq.seq_id] = (len(rows), num_draft + 1)
                rows.extend(range(ends[i] - num_draft, ends[i] + 1))
        if not rows:
            return {}
        logits = self.model.compute_logits(hidden[torch.tensor(rows)])
        return {sid: logits[a] if k == 1 else logits[a : a + k] for sid, (a, k) in spans.items()}


def _pad(tables: list[list[int]]) -> torch.Tensor:
    """Block tables [B, longest] int64, padded with 0."""
    out = torch.zeros(len(tables), max(len(t) for t in tables), dtype=torch.int64)
    for row, table in enumerate(tables):
        out[row, : len(table)] = torch.tensor(table, dtype=torch.int64)
    return out
