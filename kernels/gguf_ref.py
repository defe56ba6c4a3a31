"""PyTorch reference of the GGUF block matmul module: the same three calls as the C++ one, exact and slow.

    from kernels import gguf_ref
    w = gguf_ref.dequantize(blocks, 12, 1536)              # uint8 [N, row_bytes] Q4_K -> float32 [N, 1536]
    y = gguf_ref.linear(x, [q, v], [12, 14], 1536, bias)   # float32 [M, K] -> [M, N_q + N_v]
    e = gguf_ref.rows(blocks, 12, 1536, ids)               # int64 [T] -> float32 [T, 1536]

The C++ module (`kernels.native.load_gguf_matmul()`) has exactly this API; `kernels.gguf_weight` calls
whichever is available, so a test written against this module checks the C++ one once it lands.

A row of a weight [N, K] is K / block_elems consecutive GGUF blocks (`gguf.GGML_QUANT_SIZES`), so the
blocks of the whole weight are a uint8 matrix [N, row_bytes]. Types are ggml type ids
(`gguf.GGMLQuantizationType`): F32=0 F16=1 Q4_0=2 Q4_1=3 Q5_0=6 Q5_1=7 Q8_0=8 Q4_K=12 Q5_K=13 Q6_K=14 BF16=30.
Decoding is the `gguf` package's own numpy definition of each format (`gguf.quants.dequantize`), so this
reference shares no code with the loader's dequantizer (`serving.loader.dequant`), which tests compare
it against. Every call decodes its whole weight again (tens of ms per million weights on one core).
"""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

SUPPORTED_TYPES = (0, 1, 2, 3, 6, 7, 8, 12, 13, 14, 30)
"""ggml type ids this module computes on: F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, BF16."""


def row_bytes(ggml_type: int, K: int) -> int:
    """Bytes of one row of K weights of `ggml_type`.

    Raises:
        ValueError: an unsupported type, or K not a multiple of the type's block size.
    """
    if ggml_type not in SUPPORTED_TYPES:
        raise ValueError(f"ggml type {ggml_type} is not supported; supported: {SUPPORTED_TYPES}")
    block_elems, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    if K <= 0 or K % block_elems:
        raise ValueError(f"K={K} is not a positive multiple of the {GGMLQuantizationType(ggml_type).name} block size {block_elems}")
    return K // block_elems * block_bytes


def dequantize(blocks: torch.Tensor, ggml_type: int, K: int) -> torch.Tensor:
    """blocks: uint8 [N, row_bytes] -> float32 [N, K].

    Raises:
        ValueError: an unsupported type, or blocks not uint8 [N, row_bytes(ggml_type, K)].
    """
    expected = row_bytes(ggml_type, K)
    if blocks.dtype != torch.uint8 or blocks.dim() != 2 or blocks.shape[1] != expected:
        raise ValueError(f"blocks must be uint8 [N, {expected}], got {blocks.dtype} {tuple(blocks.shape)}")
    if blocks.shape[0] == 0:
        return torch.empty(0, K)
    data = np.ascontiguousarray(blocks.numpy())
    return torch.from_numpy(np.asarray(quants.dequantize(data, GGMLQuantizationType(ggml_type)), dtype=np.float32)).reshape(-1, K)


def linear(x: torch.Tensor, segments: list[torch.Tensor], types: list[int], K: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] float32 @ the weight stacked from `segments` (each uint8 [N_i, row_bytes_i] of types[i]),
    transposed, + bias [sum N_i] -> float32 [M, sum N_i]: the segments' outputs side by side, in order.

    Raises:
        ValueError: x not float32 [M, K], segments and types of different lengths, or a bad segment.
    """
    if x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] != K:
        raise ValueError(f"x must be float32 [M, {K}], got {x.dtype} {tuple(x.shape)}")
    if len(segments) != len(types) or not segments:
        raise ValueError(f"{len(segments)} segments but {len(types)} types")
    outs = [x @ dequantize(blocks, t, K).T for blocks, t in zip(segments, types)]
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)
    return out if bias is None else out + bias


def rows(blocks: torch.Tensor, ggml_type: int, K: int, ids: torch.Tensor) -> torch.Tensor:
    """Rows `ids` (int64 [T], each in [0, N)) of the weight in `blocks` (uint8 [N, row_bytes]) -> float32 [T, K]:
    an embedding lookup that decodes only the rows it reads.

    Raises:
        IndexError: an id outside [0, N).
    """
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= blocks.shape[0]):
        raise IndexError(f"token ids must lie in [0, {blocks.shape[0]}), got {int(ids.min())}..{int(ids.max())}")
    return dequantize(blocks[ids.reshape(-1)], ggml_type, K)
