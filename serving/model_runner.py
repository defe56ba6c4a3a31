"""`ModelRunner`: turns a scheduled step into batch tensors, runs the model, returns logits."""

from __future__ import annotations

import torch

from serving.models.base import CausalLM
from serving.paged_cache import BatchMetadata, PagedKVCache
from serving.sequence import Sequence


class ModelRunner:
    """Runs one forward pass over a mixed batch of prefill chunks and decode tokens.

    Args:
        model: the loaded `CausalLM`.
        cache: the paged KV cache its attention layers read and write.
    """

    def __init__(self, model: CausalLM, cache: PagedKVCache):
        self.model, self.cache = model, cache

    def build_batch(self, scheduled: list[tuple[Sequence, int]]) -> tuple[torch.Tensor, BatchMetadata]:
        """Token ids [N] and the `BatchMetadata` for the new tokens of each (sequence, count)."""
        block_size = self.cache.block_size
        token_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        seq_lens, query_lens = [], []
        for seq, num_new in scheduled:
            start = seq.num_computed_tokens
            token_ids.extend(seq.token_ids[start : start + num_new])
            for pos in range(start, start + num_new):
                slots.append(seq.block_table[pos // block_size] * block_size + pos % block_size)
            positions.extend(range(start, start + num_new))
            seq_lens.append(start + num_new)
            query_lens.append(num_new)
        max_blocks = max(len(seq.block_table) for seq, _ in scheduled)
        tables = torch.zeros(len(scheduled), max_blocks, dtype=torch.int64)
        for row, (seq, _) in enumerate(scheduled):
            tables[row, : len(seq.block_table)] = torch.tensor(seq.block_table)
        batch = BatchMetadata(
            positions=torch.tensor(positions), slot_mapping=torch.tensor(slots), block_tables=tables,
            seq_lens=seq_lens, query_lens=query_lens,
        )
        return torch.tensor(token_ids), batch

    @torch.inference_mode()
    def execute(self, scheduled: list[tuple[Sequence, int]], block_copies: list[tuple[int, int]] = ()) -> dict[int, torch.Tensor]:
        """Run the step. Returns {seq_id: float32 logits [V]} for each sequence whose scheduled
        tokens reach its end (a finished prefill, or a decode); chunks mid-prompt get none."""
        self.cache.copy_blocks(list(block_copies))
        token_ids, batch = self.build_batch(scheduled)
        hidden = self.model(token_ids, batch, self.cache)
        wanted = [i for i, (seq, n) in enumerate(scheduled) if seq.num_computed_tokens + n == seq.num_tokens]
        if not wanted:
            return {}
        rows = batch.last_token_indices[wanted]
        logits = self.model.compute_logits(hidden[rows])
        return {scheduled[i][0].seq_id: logits[j] for j, i in enumerate(wanted)}
