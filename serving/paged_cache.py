"""The paged KV cache tensors and the per-step batch layout the attention layers read.

Keys and values live in per-layer tensors of shape [num_blocks, block_size, K, D]; a sequence's
block table (from `BlockManager`) maps its logical blocks to rows of these tensors. Each step the
model runner describes the batch in a `BatchMetadata`: where every new token's K/V goes
(`slot_mapping`, slot = block_id * block_size + offset) and how long each sequence is.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class BatchMetadata:
    """One forward pass over B sequences with N new tokens in total, grouped by sequence.

    Attributes:
        positions: [N] int64 absolute position of each new token.
        slot_mapping: [N] int64 cache slot receiving each new token's K/V.
        block_tables: [B, max_blocks] int64, padded with 0.
        seq_lens: B lengths after this step (context + new tokens).
        query_lens: B new-token counts.
    """

    positions: torch.Tensor
    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: list[int]
    query_lens: list[int]

    def __post_init__(self) -> None:
        num_tokens = sum(self.query_lens)
        if len(self.positions) != num_tokens or len(self.slot_mapping) != num_tokens:
            raise ValueError(f"{len(self.positions)} positions / {len(self.slot_mapping)} slots for {num_tokens} tokens")
        if any(q < 1 or q > s for q, s in zip(self.query_lens, self.seq_lens)):
            raise ValueError(f"query_lens {self.query_lens} must be in [1, seq_lens {self.seq_lens}]")

    @property
    def last_token_indices(self) -> torch.Tensor:
        """[B] index in the flattened batch of each sequence's last new token."""
        return torch.tensor(self.query_lens).cumsum(0) - 1


@dataclass
class PagedKVCache:
    """Per-layer key and value blocks: keys[l], values[l] are [num_blocks, block_size, K, D]."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]

    @classmethod
    def allocate(cls, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> "PagedKVCache":
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        return cls([torch.zeros(shape, dtype=dtype) for _ in range(num_layers)],
                   [torch.zeros(shape, dtype=dtype) for _ in range(num_layers)])

    @staticmethod
    def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        """Memory of one block across all layers, keys and values, in bytes."""
        return 2 * num_layers * block_size * num_kv_heads * head_dim * torch.tensor([], dtype=dtype).element_size()

    @property
    def num_blocks(self) -> int:
        return self.keys[0].shape[0]

    @property
    def block_size(self) -> int:
        return self.keys[0].shape[1]

    def write(self, layer: int, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v ([N, K, D]) at the given slots of `layer`."""
        self.keys[layer].view(-1, *k.shape[1:]).index_copy_(0, slot_mapping, k)
        self.values[layer].view(-1, *v.shape[1:]).index_copy_(0, slot_mapping, v)

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy-on-write: duplicate block src into dst in every layer, for each (src, dst)."""
        if not pairs:
            return
        src = torch.tensor([s for s, _ in pairs])
        dst = torch.tensor([d for _, d in pairs])
        for cache in (*self.keys, *self.values):
            cache[dst] = cache[src]
