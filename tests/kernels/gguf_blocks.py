"""GGUF blocks for tests: random rows of any block type (every fp16 scale a finite, small value), or floats
quantized by the `gguf` package where it can (the legacy types).

    blocks = random_blocks(12, rows=7, cols=512, seed=0)     # uint8 [7, 288]: Q4_K rows of 512 weights
"""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

# byte offsets of the fp16 fields in a block (d, then m / dmin where the type has one), by ggml type id
F16_FIELDS = {2: [0], 3: [0, 2], 6: [0], 7: [0, 2], 8: [0], 12: [0, 2], 13: [0, 2], 14: [208]}
LEGACY = (2, 3, 6, 7, 8)  # types `gguf.quants.quantize` writes
K_QUANTS = (12, 13, 14)


def random_blocks(ggml_type: int, rows: int, cols: int, seed: int) -> torch.Tensor:
    """uint8 [rows, row_bytes]: random bytes with every fp16 scale in [-0.05, 0.05) and min in [-0.02, 0.02)."""
    rng = np.random.default_rng(seed)
    block_elems, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    n = rows * cols // block_elems
    b = rng.integers(0, 256, size=(n, block_bytes), dtype=np.uint8)
    for k, off in enumerate(F16_FIELDS[ggml_type]):
        bound = 0.05 if k == 0 else 0.02
        b[:, off:off + 2] = rng.uniform(-bound, bound, size=n).astype("<f2").view(np.uint8).reshape(n, 2)
    return torch.from_numpy(b.reshape(rows, -1))


def quantized_blocks(ggml_type: int, weight: torch.Tensor) -> torch.Tensor:
    """A float weight [N, K] quantized to a legacy type by the `gguf` package -> uint8 [N, row_bytes]."""
    q = quants.quantize(weight.numpy().astype(np.float32), GGMLQuantizationType(ggml_type))
    return torch.from_numpy(np.ascontiguousarray(q).view(np.uint8).reshape(weight.shape[0], -1))
