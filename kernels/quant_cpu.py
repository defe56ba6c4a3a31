"""Weight-only int8 and int4 matmuls through PyTorch's CPU kernels, as variants of "linear" and "gated_mlp".

The quantization schemes and their references are in `ref_quant.py` (int8 per output channel,
symmetric; int4 per group of G input features, asymmetric). The kernels:

- int8: `torch.ops.aten._weight_int8pack_mm(x [M, K], q [N, K] int8, scale [N]) -> [M, N]`, computing
  (x @ q.T) * scale; x float32, bfloat16 or float16, 2-D and contiguous; scale in x's dtype. With 16-bit
  x and K % 16 != 0 it crashes the process in torch 2.13 (on an AVX2 CPU from K % 8 != 0 and 3 rows of x on;
  on an AVX512-BF16/AMX CPU at K = 8, 24, 200 with any rows), so `int8_linear` refuses it.
- int4: `torch.ops.aten._convert_weight_to_int4pack_for_cpu(q [N, K] int32 in [0, 15], inner_k_tiles)`
  -> [N, K / 2] uint8, then `_weight_int4pack_mm_for_cpu(x [M, K], packed, G, scale_and_zero [K / G, N, 2])`
  computing x @ ((q - 8) * scale + zero).T; G in (32, 64, 128, 256), K % G == 0, N % 16 == 0; the
  scales and zeros in x's dtype.

The "_a16" variants (W8A16, W4A16) take float32 activations, round them to bfloat16 for the kernel and
return float32: torch 2.13's int8/int4 CPU kernels run float32 activations through a scalar loop, 5-30x
slower than the dense float32 matmul, and bfloat16 ones through vectorized code, 2-6x faster than it at
one row (`benchmarks/bench_quant_linear.py`). The rest of a float32 model (norms, attention, residuals,
logits) stays float32.

Int4 groups of 32 (`INT4_GROUP_SIZE`) are GGUF's Q4_1 blocks: Q4_1 stores, per 32 consecutive input
features, q in [0, 15] with w = d * q + m, and its quantizer maps each block's smallest value to 0 and its
largest to 15, so the min/max quantizer here recovers the file's codes from the dequantized weight
(SmolLM2-135M-Instruct's Q4_1 layers: every weight packed back exactly, max error 0). On such a model the
int4 variants compute with the GGUF file's own weights, as llama.cpp does; only the activations' rounding
differs from the float32 engine.

Each variant keeps a `PackCache` (`kernels.packs`) from weight tensor to its packed form: packed once per
weight, since the dispatch contract passes the float weight on every call. The float weights stay
resident, so this saves memory bandwidth per matmul, not memory.

Parity against the references: `tests/kernels/test_quant_cpu.py`.
Timing and accuracy: `benchmarks/bench_quant_linear.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from kernels import ref
from kernels.packs import PackCache
from kernels.ref_quant import quantize_int4, quantize_int8
from kernels.variants import Variant

INT4_GROUP_SIZE = 32  # GGUF Q4_1's block; divides every in-features of SmolLM2-135M (576, 1536) and Gemma 3 270M (640, 2048)
_INNER_K_TILES = 2  # the CPU packing gives the same results for 1, 2, 4 and 8 (checked in torch 2.13)
_ACTIVATION_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclass
class Int8Pack:
    """A weight quantized for `_weight_int8pack_mm`: q [N, K] int8, scale [N] float32."""

    q: torch.Tensor
    scale: torch.Tensor
    _cast: dict[torch.dtype, torch.Tensor] = field(default_factory=dict, repr=False)

    def scale_as(self, dtype: torch.dtype) -> torch.Tensor:
        """The scales [N] in the activation dtype (cast once per dtype)."""
        if dtype not in self._cast:
            self._cast[dtype] = self.scale.to(dtype)
        return self._cast[dtype]


@dataclass
class Int4Pack:
    """A weight quantized for `_weight_int4pack_mm_for_cpu`: packed [N, K / 2] uint8, scale and zero
    [K / G, N, 2] float32 (index 0 the scale, 1 the zero), and G."""

    packed: torch.Tensor
    scale_and_zero: torch.Tensor
    group_size: int
    _cast: dict[torch.dtype, torch.Tensor] = field(default_factory=dict, repr=False)

    def scale_and_zero_as(self, dtype: torch.dtype) -> torch.Tensor:
        """The scales and zeros [K / G, N, 2] in the activation dtype (cast once per dtype)."""
        if dtype not in self._cast:
            self._cast[dtype] = self.scale_and_zero.to(dtype).contiguous()
        return self._cast[dtype]


def pack_int8(weight: torch.Tensor) -> Int8Pack:
    """Quantize a [N, K] weight (`ref_quant.quantize_int8`) into the int8 kernel's layout."""
    q, scale = quantize_int8(weight)
    return Int8Pack(q.contiguous(), scale)


def pack_int4(weight: torch.Tensor, group_size: int = INT4_GROUP_SIZE) -> Int4Pack:
    """Quantize a [N, K] weight (`ref_quant.quantize_int4`) into the int4 CPU kernel's layout.

    Raises:
        ValueError: G not in (32, 64, 128, 256), K not a multiple of G, or N not a multiple of 16.
    """
    q, scale, zero = quantize_int4(weight, group_size)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32).contiguous(), _INNER_K_TILES)
    scale_and_zero = torch.stack((scale.t(), zero.t()), dim=-1).contiguous()  # [K / G, N, 2]
    return Int4Pack(packed, scale_and_zero, group_size)


def _as_matrix(x: torch.Tensor) -> torch.Tensor:
    if x.dtype not in _ACTIVATION_DTYPES:
        raise ValueError(f"weight-only quantized linear: activations must be one of {_ACTIVATION_DTYPES}, got {x.dtype}")
    return x.reshape(-1, x.shape[-1]).contiguous()


def _finish(out: torch.Tensor, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    if bias is not None:
        out = out + bias.to(out.dtype)
    return out.reshape(*x.shape[:-1], out.shape[-1])


def int8_linear(x: torch.Tensor, pack: Int8Pack, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] float32/bfloat16/float16 -> [..., N] in x's dtype, x @ (q * scale).T (+ bias).

    Raises ValueError for 16-bit activations when K is not a multiple of 16: torch 2.13's CPU kernel
    crashes the process (segmentation fault) there (module docstring).
    """
    matrix = _as_matrix(x)
    if x.dtype != torch.float32 and x.shape[-1] % 16:
        raise ValueError(f"int8 weight-only linear: {x.dtype} activations need in features % 16 == 0, got {x.shape[-1]}")
    out = torch.ops.aten._weight_int8pack_mm(matrix, pack.q, pack.scale_as(x.dtype))
    return _finish(out, x, bias)


def int4_linear(x: torch.Tensor, pack: Int4Pack, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] float32/bfloat16/float16 -> [..., N] in x's dtype, x @ ((q - 8) * scale + zero).T (+ bias)."""
    out = torch.ops.aten._weight_int4pack_mm_for_cpu(
        _as_matrix(x), pack.packed, pack.group_size, pack.scale_and_zero_as(x.dtype)
    )
    return _finish(out, x, bias)


INT8_PACKS = PackCache(pack_int8)
INT4_PACKS = PackCache(pack_int4)


def int8_weight_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The "linear" contract with the weight quantized to int8 per output channel (packed once, cached).

    x: [..., K] float32/bfloat16/float16; weight: [N, K]; bias: [N] or None. Returns [..., N] in x's dtype.
    Raises ValueError for another activation dtype, a weight that is not 2-D, or 16-bit activations with
    K % 16 != 0 (see `int8_linear`).
    """
    return int8_linear(x, INT8_PACKS.get(weight), bias)


def int4_weight_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The "linear" contract with the weight quantized to int4 in groups of `INT4_GROUP_SIZE` (packed once, cached).

    x: [..., K] float32/bfloat16/float16; weight: [N, K]; bias: [N] or None. Returns [..., N] in x's dtype.
    Raises ValueError for another activation dtype, or when K % INT4_GROUP_SIZE or N % 16 is not 0.
    """
    return int4_linear(x, INT4_PACKS.get(weight), bias)


def gated_mlp_with(linear: Callable) -> Callable:
    """The "gated_mlp" contract (`ref.ref_gated_mlp`) with both projections computed by `linear`."""

    def gated_mlp(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, activation: str) -> torch.Tensor:
        return linear(ref.ref_gated_activation(linear(x, gate_up), activation), down)

    return gated_mlp


def bf16_activations(linear: Callable) -> Callable:
    """`linear` (the "linear" contract) with float32 activations rounded to bfloat16 for the kernel and the
    result returned in float32, the bias added in float32 (W8A16 / W4A16); other dtypes pass through."""

    def run(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if x.dtype != torch.float32:
            return linear(x, weight, bias)
        out = linear(x.to(torch.bfloat16), weight).to(torch.float32)
        return out if bias is None else out + bias.to(torch.float32)

    run.__name__ = f"{linear.__name__}_a16"
    run.__doc__ = (f"`{linear.__name__}` with float32 activations computed in bfloat16 (`bf16_activations`). "
                   "x: [..., K]; weight: [N, K]; bias: [N] or None. Returns [..., N] in x's dtype.")
    return run


int8_weight_linear_a16 = bf16_activations(int8_weight_linear)
int4_weight_linear_a16 = bf16_activations(int4_weight_linear)
int8_weight_gated_mlp = gated_mlp_with(int8_weight_linear)
int4_weight_gated_mlp = gated_mlp_with(int4_weight_linear)
int8_weight_gated_mlp_a16 = gated_mlp_with(int8_weight_linear_a16)
int4_weight_gated_mlp_a16 = gated_mlp_with(int4_weight_linear_a16)

# (atol, rtol) against the float32 reference, for the tuner's check inputs (`kernels/tuner_inputs.py`:
# x ~ N(0, 1), weights ~ N(0, 1 / K), so outputs ~ N(0, 1)); the quantization error is absolute (it
# scales with |x| and the weight's step, not with |y|). Measured on SmolLM2-135M's linear shapes (qkv, o,
# gate_up, down, lm_head) at batch 1 and 16, fp32, bf16 and W*A16, at rtol 0.02: the largest atol needed
# was 0.038 for int8 and 0.39 for int4 in groups of 32 (gated_mlp, SwiGLU and GeGLU on SmolLM2's and
# Gemma 3's shapes: 0.033 and 0.40); deliberately wrong variants needed 0.76-2.2 (int8 with each row's scale
# taken from the next row) and 0.62 or more at batch 16 (int4 with the zero off by one step; a single row
# can need less than 0.5, so a one-row check may miss it).
# On SmolLM2-135M-Instruct's real weights, which are GGUF Q4_1, int4 in groups of 32 is exact (module
# docstring); its Q8_0 embedding, the tied LM head, packs with a relative RMS error of 1.2-1.6% (int8)
# and 8-13% (int4) (`benchmarks/bench_quant_linear.py --sections accuracy`).
INT8_TOLERANCE: dict[torch.dtype, tuple[float, float]] = {torch.float32: (0.1, 0.02), torch.bfloat16: (0.1, 0.02)}
INT4_TOLERANCE: dict[torch.dtype, tuple[float, float]] = {torch.float32: (0.5, 0.02), torch.bfloat16: (0.5, 0.02)}
INT4_MLP_TOLERANCE: dict[torch.dtype, tuple[float, float]] = {torch.float32: (0.55, 0.02), torch.bfloat16: (0.55, 0.02)}
# On the model's own weights (the tuner's second check): at most 3% relative RMS error. int8 per channel
# keeps SmolLM2's layers and LM head within 1.6%; int4 in groups of 32 keeps its Q4_1 layers within the
# activations' bfloat16 rounding (0.3%) and would lose 8-13% on its Q8_0 embedding, so the LM head stays
# off int4; on a float (safetensors) model int4 loses 8-15% everywhere and is not used.
MAX_RELATIVE_ERROR = 0.03


def cpu_quant_variants() -> list[Variant]:
    """The weight-only int8 and int4 variants of "linear" and "gated_mlp", with activations in the input dtype
    and, for float32 inputs, in bfloat16 ("_a16"). Not registered: the "quantized" provider of
    `kernels.candidates` gathers them with the W4A16 decode steps (`kernels.compiled.quantized_step_variants`)."""
    dtypes = (torch.float32, torch.bfloat16)
    int8 = dict(name="int8_weight", devices=("cpu",), dtypes=dtypes, tolerance=dict(INT8_TOLERANCE),
                max_relative_error=MAX_RELATIVE_ERROR)
    int4 = dict(name="int4_weight", devices=("cpu",), dtypes=dtypes, tolerance=dict(INT4_TOLERANCE),
                max_relative_error=MAX_RELATIVE_ERROR)
    int8_a16 = dict(int8, name="int8_weight_a16", dtypes=(torch.float32,))
    int4_a16 = dict(int4, name="int4_weight_a16", dtypes=(torch.float32,))
    return [
        Variant(op="linear", fn=int8_weight_linear_a16, **int8_a16,
                description="weight-only int8 per output channel, activations in bfloat16 (W8A16)"),
        Variant(op="linear", fn=int4_weight_linear_a16, **int4_a16,
                description=f"weight-only int4, groups of {INT4_GROUP_SIZE}, activations in bfloat16 (W4A16)"),
        Variant(op="gated_mlp", fn=int8_weight_gated_mlp_a16, **int8_a16,
                description="gate/up and down projections as W8A16 linears"),
        Variant(op="gated_mlp", fn=int4_weight_gated_mlp_a16, **{**int4_a16, "tolerance": dict(INT4_MLP_TOLERANCE)},
                description=f"gate/up and down projections as W4A16 linears, groups of {INT4_GROUP_SIZE}"),
        Variant(op="linear", fn=int8_weight_linear, **int8,
                description="weight-only int8 per output channel (aten._weight_int8pack_mm)"),
        Variant(op="linear", fn=int4_weight_linear, **int4,
                description=f"weight-only int4, groups of {INT4_GROUP_SIZE} (aten._weight_int4pack_mm_for_cpu)"),
        Variant(op="gated_mlp", fn=int8_weight_gated_mlp, **int8,
                description="gate/up and down projections as weight-only int8 linears"),
        Variant(op="gated_mlp", fn=int4_weight_gated_mlp, **{**int4, "tolerance": dict(INT4_MLP_TOLERANCE)},
                description=f"gate/up and down projections as weight-only int4 linears, groups of {INT4_GROUP_SIZE}"),
    ]
