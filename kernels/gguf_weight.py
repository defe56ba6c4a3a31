"""`GGUFWeight`: a weight [N, K] kept as the GGUF blocks of its rows, and the matmuls computed on them.

    w = GGUFWeight.from_blocks(blocks, ggml_type=12, in_features=1536)   # uint8 [N, row_bytes] Q4_K
    qkv = cat_weights([q, k, v])          # fused along N; adjacent segments of one type merge
    y = qkv.linear(x, bias)               # x [..., K] any float dtype -> [..., N] in x's dtype
    e = embed.embedding(ids)              # ids [...] int64 -> [..., K] float32

A model loaded from a GGUF file keeps its quantized projections this way (4.5 to 6.6 bits a weight instead of
32), as llama.cpp does. A fused weight can mix types (Qwen files quantize q/k in Q4_K and v in Q6_K), so it
is a list of segments, each one type; `linear` returns the segments' outputs side by side.

The compute comes from the C++ module `kernels.native.load_gguf_matmul()` where it builds, else from the
PyTorch reference `kernels.gguf_ref` (same API, exact, decodes the whole weight on every call: for tests).
Both compute in float32; `linear` casts its input to float32 and its result back.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from types import ModuleType
from typing import Sequence

import torch

from kernels import gguf_ref
from kernels.ref import ref_gated_activation

logger = logging.getLogger(__name__)

PACKED_TYPES = frozenset((2, 3, 6, 7, 8, 12, 13, 14))
"""ggml type ids a loader keeps packed: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K."""
F32 = 0

_native: list[ModuleType | None] = []  # memo of the C++ module's load: [] before the first try


def native_module() -> ModuleType | None:
    """The C++ GGUF matmul module, or None where it is missing or cannot be built here (tried once)."""
    if not _native:
        from kernels import native

        loader, module = getattr(native, "load_gguf_matmul", None), None
        try:
            module = loader() if loader is not None else None
        except Exception:  # the loader returns None on a failed build; anything else must not stop a model load
            logger.exception("loading the C++ GGUF matmul module failed")
        _native.append(module)
        if _native[0] is None:
            logger.info("the C++ GGUF matmul module is unavailable here; GGUF weights use the PyTorch reference")
    return _native[0]


def has_native() -> bool:
    """Whether GGUF blocks are computed on by the C++ module (else by the slow reference)."""
    return native_module() is not None


def backend() -> ModuleType:
    """The module `GGUFWeight` calls: the C++ one where available, else `kernels.gguf_ref`."""
    return native_module() or gguf_ref


@dataclass(frozen=True, eq=False)
class GGUFSegment:
    """Consecutive rows of one ggml type: `blocks` uint8 [rows, row_bytes(ggml_type, K)], contiguous."""

    ggml_type: int
    blocks: torch.Tensor


@dataclass(frozen=True, eq=False)  # eq=False: compared and hashed by identity, like a tensor parameter
class GGUFWeight:
    """A weight [N, K] (N = `out_features`, K = `in_features`) as the GGUF blocks of its rows, in segments.

    Raises (when built):
        ValueError: no segment, a type outside `gguf_ref.SUPPORTED_TYPES`, or blocks that are not
            contiguous uint8 [rows, row_bytes] for K.
    """

    segments: tuple[GGUFSegment, ...]
    in_features: int

    def __post_init__(self):
        if not self.segments:
            raise ValueError("a GGUFWeight needs at least one segment")
        for seg in self.segments:
            expected = gguf_ref.row_bytes(seg.ggml_type, self.in_features)
            b = seg.blocks
            if b.dtype != torch.uint8 or b.dim() != 2 or b.shape[1] != expected or not b.is_contiguous():
                raise ValueError(f"type {seg.ggml_type} blocks for K={self.in_features} must be contiguous uint8 "
                                 f"[rows, {expected}], got {b.dtype} {tuple(b.shape)}")

    @classmethod
    def from_blocks(cls, blocks: torch.Tensor, ggml_type: int, in_features: int) -> GGUFWeight:
        """One segment: `blocks` uint8 [N, row_bytes] of `ggml_type` for rows of `in_features` weights."""
        return cls((GGUFSegment(int(ggml_type), blocks.contiguous()),), int(in_features))

    @classmethod
    def from_float(cls, weight: torch.Tensor) -> GGUFWeight:
        """A float weight [N, K] as one F32 segment (its float32 bytes), to fuse with packed weights."""
        w = weight.detach().to(torch.float32).contiguous()
        return cls.from_blocks(w.view(torch.uint8).reshape(w.shape[0], -1), F32, w.shape[1])

    @property
    def out_features(self) -> int:
        return sum(seg.blocks.shape[0] for seg in self.segments)

    @property
    def shape(self) -> torch.Size:
        """[N, K], as a float weight's shape."""
        return torch.Size((self.out_features, self.in_features))

    @property
    def dtype(self) -> torch.dtype:
        """float32: the dtype `linear` and `embedding` compute and return in."""
        return torch.float32

    @property
    def nbytes(self) -> int:
        """Bytes of the blocks held (the packed size in memory)."""
        return sum(seg.blocks.numel() for seg in self.segments)

    @property
    def ggml_types(self) -> list[int]:
        return [seg.ggml_type for seg in self.segments]

    def dequantize(self) -> torch.Tensor:
        """The weight as float32 [N, K]."""
        mod = backend()
        parts = [mod.dequantize(seg.blocks, seg.ggml_type, self.in_features) for seg in self.segments]
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x [..., K] @ weight.T (+ bias [N]) -> [..., N] in x's dtype, computed in float32.

        Raises:
            ValueError: x's last dimension is not K.
        """
        K = self.in_features
        if x.shape[-1] != K:
            raise ValueError(f"x has {x.shape[-1]} features, the weight takes {K}")
        x2 = x.reshape(-1, K).to(torch.float32).contiguous()
        b = None if bias is None else bias.to(torch.float32).contiguous()
        out = backend().linear(x2, [seg.blocks for seg in self.segments], self.ggml_types, K, b)
        return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def embedding(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` (int64 [...], each in [0, N)) -> float32 [..., K]: an embedding lookup.

        Raises:
            IndexError: an id outside [0, N).
        """
        flat = ids.reshape(-1).to(torch.int64).contiguous()
        if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= self.out_features):
            raise IndexError(f"ids must lie in [0, {self.out_features})")
        mod, K = backend(), self.in_features
        if len(self.segments) == 1:
            out = mod.rows(self.segments[0].blocks, self.segments[0].ggml_type, K, flat)
        else:
            out, start = torch.empty(flat.numel(), K), 0
            for seg in self.segments:
                stop = start + seg.blocks.shape[0]
                hit = (flat >= start) & (flat < stop)
                if bool(hit.any()):
                    out[hit] = mod.rows(seg.blocks, seg.ggml_type, K, flat[hit] - start)
                start = stop
        return out.reshape(*ids.shape, K)

    def take_rows(self, index: torch.Tensor) -> GGUFWeight:
        """The weight whose row i is row index[i] of this one (index int64 [N], a permutation or a
        selection): the rows move with their blocks, so the values are exact.

        Raises:
            ValueError: a weight of several segments (permute before fusing).
        """
        if len(self.segments) != 1:
            raise ValueError("take_rows needs a weight of one segment; permute rows before fusing")
        seg = self.segments[0]
        return GGUFWeight.from_blocks(seg.blocks[index], seg.ggml_type, self.in_features)


def cat_weights(weights: Sequence[GGUFWeight | torch.Tensor]) -> GGUFWeight:
    """Stack weights [N_i, K] along N into one GGUFWeight [sum N_i, K]; a float tensor becomes an F32 segment,
    and adjacent segments of one type merge into one (their blocks concatenated).

    Raises:
        ValueError: no weights, or weights of different K.
    """
    if not weights:
        raise ValueError("cat_weights needs at least one weight")
    parts = [w if isinstance(w, GGUFWeight) else GGUFWeight.from_float(w) for w in weights]
    K = parts[0].in_features
    if any(p.in_features != K for p in parts):
        raise ValueError(f"cannot stack weights of different widths: {[p.in_features for p in parts]}")
    runs: list[tuple[int, list[torch.Tensor]]] = []
    for seg in (seg for p in parts for seg in p.segments):
        if runs and runs[-1][0] == seg.ggml_type:
            runs[-1][1].append(seg.blocks)
        else:
            runs.append((seg.ggml_type, [seg.blocks]))
    return GGUFWeight(tuple(GGUFSegment(t, b[0] if len(b) == 1 else torch.cat(b)) for t, b in runs), K)


def packed_linear(x: torch.Tensor, weight: GGUFWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The "linear" op on a GGUFWeight: x [..., K] -> [..., N] in x's dtype (`GGUFWeight.linear`)."""
    return weight.linear(x, bias)


def packed_gated_mlp(x: torch.Tensor, gate_up: GGUFWeight, down: GGUFWeight | torch.Tensor, activation: str) -> torch.Tensor:
    """The "gated_mlp" op on GGUF weights: down(act(gate(x)) * up(x)), x [T, E], gate_up [2F, E], down [E, F]."""
    hidden = ref_gated_activation(gate_up.linear(x), activation)
    return down.linear(hidden) if isinstance(down, GGUFWeight) else torch.nn.functional.linear(hidden, down)
