"""A contiguous KV cache for one sequence (the simple, sequential generation path).

Layout per layer: keys and values of shape [capacity, K, D] (K key/value heads, D head size),
filled from position 0. The paged cache of the batching engine replaces this for served traffic.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class ContiguousKVCache:
    """Preallocated keys/values for `capacity` tokens of one sequence.

    Attributes:
        keys, values: per layer, [capacity, K, D] tensors.
        num_tokens: positions [0, num_tokens) hold valid entries.
    """

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    num_tokens: int = 0
    capacity: int = field(init=False)

    def __post_init__(self) -> None:
        self.capacity = self.keys[0].shape[0]

    @classmethod
    def allocate(cls, num_layers: int, capacity: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> "ContiguousKVCache":
        shape = (capacity, num_kv_heads, head_dim)
        return cls(
            keys=[torch.empty(shape, dtype=dtype) for _ in range(num_layers)],
            values=[torch.empty(shape, dtype=dtype) for _ in range(num_layers)],
        )

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v ([T, K, D]) at positions [start, start+T); return all keys/values up to there."""
        end = start + k.shape[0]
        if end > self.capacity:
            raise IndexError(f"KV cache holds {self.capacity} tokens; writing up to position {end}")
        self.keys[layer][start:end] = k
        self.values[layer][start:end] = v
        return self.keys[layer][:end], self.values[layer][:end]
