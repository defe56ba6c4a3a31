"""The paged KV cache tensors and the per-step batch layout the attention layers read.

Keys and values live in per-layer tensors of shape [num_blocks, block_size, K, D]; a sequence's
block table (from `BlockManager`) maps its logical blocks to rows of these tensors. Each step the
model runner describes the batch in a `BatchMetadata`: where every new token's K/V goes
(`slot_mapping`, slot = block_id * block_size + offset) and how long each sequence is.

A model with sliding-window layers may keep their KV in a second pool (`sliding_layers`): those
layers' tensors have num_sliding_blocks + 1 rows, row 0 being the null block (zeros, never written)
that released entries of a sliding block table point to (`serving.engine.sliding_block_manager`). Such a
layer reads and writes through `BatchMetadata.sliding_slot_mapping` and `sliding_block_tables`.
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
        sliding_slot_mapping: [N] int64 slots in the sliding-window pool, or None without one.
        sliding_block_tables: [B, max_sliding_blocks] int64 in that pool, padded with 0 (the null
            block), or None.
    """

    positions: torch.Tensor
    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: list[int]
    query_lens: list[int]
    sliding_slot_mapping: torch.Tensor | None = None
    sliding_block_tables: torch.Tensor | None = None

    def __post_init__(self) -> None:
        num_tokens = sum(self.query_lens)
        if len(self.positions) != num_tokens or len(self.slot_mapping) != num_tokens:
            raise ValueError(f"{len(self.positions)} positions / {len(self.slot_mapping)} slots for {num_tokens} tokens")
        if (self.sliding_slot_mapping is None) != (self.sliding_block_tables is None):
            raise ValueError("give both sliding_slot_mapping and sliding_block_tables, or neither")
        if self.sliding_slot_mapping is not None and len(self.sliding_slot_mapping) != num_tokens:
            raise ValueError(f"{len(self.sliding_slot_mapping)} sliding slots for {num_tokens} tokens")
        if any(q < 1 or q > s for q, s in zip(self.query_lens, self.seq_lens)):
            raise ValueError(f"query_lens {self.query_lens} must be in [1, seq_lens {self.seq_lens}]")

    @property
    def last_token_indices(self) -> torch.Tensor:
        """[B] index in the flattened batch of each sequence's last new token."""
        return torch.tensor(self.query_lens).cumsum(0) - 1


@dataclass
class PagedKVCache:
    """Per-layer key and value blocks: keys[l], values[l] are [rows, block_size, K, D].

    rows = num_blocks for a layer of the global pool, num_sliding_blocks + 1 for a layer in
    `sliding_layers` (row 0: the null block).
    """

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    sliding_layers: frozenset[int] = frozenset()

    @classmethod
    def allocate(cls, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                 sliding_layers: frozenset[int] = frozenset(), num_sliding_blocks: int = 0) -> "PagedKVCache":
        """Zeroed tensors; the layers in `sliding_layers` get the sliding pool of `num_sliding_blocks` blocks.

        Raises:
            ValueError: sliding layers without sliding blocks.
        """
        if sliding_layers and num_sliding_blocks < 1:
            raise ValueError(f"{len(sliding_layers)} sliding layers need num_sliding_blocks >= 1")
        def shape(layer: int) -> tuple[int, ...]:
            rows = num_sliding_blocks + 1 if layer in sliding_layers else num_blocks
            return (rows, block_size, num_kv_heads, head_dim)
        return cls([torch.zeros(shape(i), dtype=dtype) for i in range(num_layers)],
                   [torch.zeros(shape(i), dtype=dtype) for i in range(num_layers)], frozenset(sliding_layers))

    @staticmethod
    def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        """Memory of one block across `num_layers` layers, keys and values, in bytes."""
        return 2 * num_layers * block_size * num_kv_heads * head_dim * torch.tensor([], dtype=dtype).element_size()

    def _global_layers(self) -> list[int]:
        return [i for i in range(len(self.keys)) if i not in self.sliding_layers]

    @property
    def num_blocks(self) -> int:
        """Blocks of the global pool (0 when every layer slides)."""
        layers = self._global_layers()
        return self.keys[layers[0]].shape[0] if layers else 0

    @property
    def num_sliding_blocks(self) -> int:
        """Usable blocks of the sliding-window pool (0 without one)."""
        return self.keys[min(self.sliding_layers)].shape[0] - 1 if self.sliding_layers else 0

    @property
    def block_size(self) -> int:
        return self.keys[0].shape[1]

    @property
    def num_bytes(self) -> int:
        """Memory of all key and value tensors, in bytes."""
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))

    def is_sliding(self, layer: int) -> bool:
        """Whether `layer` reads and writes the sliding-window pool."""
        return layer in self.sliding_layers

    def write(self, layer: int, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v ([N, K, D]) at the given slots of `layer` (slots of that layer's pool)."""
        self.keys[layer].view(-1, *k.shape[1:]).index_copy_(0, slot_mapping, k)
        self.values[layer].view(-1, *v.shape[1:]).index_copy_(0, slot_mapping, v)

    def copy_blocks(self, pairs: list[tuple[int, int]], sliding_pairs: list[tuple[int, int]] = ()) -> None:
        """Copy-on-write: duplicate block src into dst in every layer of its pool, for each (src, dst)."""
        for layers, copies in ((self._global_layers(), pairs), (sorted(self.sliding_layers), sliding_pairs)):
            if not copies:
                continue
            src = torch.tensor([s for s, _ in copies])
            dst = torch.tensor([d for _, d in copies])
            for layer in layers:
                for cache in (self.keys[layer], self.values[layer]):
                    cache[dst] = cache[src]
