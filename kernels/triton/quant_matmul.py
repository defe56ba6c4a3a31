"""Weight-only quantized matmul in Triton: x @ W.T with W in GGML Q8_0 or Q4_0 blocks, dequantized on the fly.

W [N, K] is stored split (`QuantizedWeight`): float16 scales [N, K / 32] beside the packed quants (int8 [N, K]
for Q8_0; uint8 [N, K / 2] for Q4_0, two 4-bit weights per byte in GGUF's order), so a program reads
0.53 (Q4_0) or 1.06 (Q8_0) bytes per weight instead of 2 or 4. A program computes a [BLOCK_M, BLOCK_N] tile of
the output, walking K in tiles of whole 32-weight blocks: it loads the quants, unpacks and scales them in
registers and accumulates x @ W.T in float32 (tensor cores for bfloat16/float16 activations on a GPU).
Block formats: the GGUF specification (github.com/ggml-org/ggml, docs/gguf.md) and ggml-quants.c.
References: `kernels.ref.ref_ggml_quantize`, `ref_ggml_dequantize`, `ref_ggml_linear`; parity tests:
tests/kernels/test_triton_quant_matmul.py.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels import ref
from kernels.triton.common import check_devices, check_tensor, is_interpreting

# Bytes per 32-weight block in a GGUF file: a float16 scale, then the quants.
GGUF_BLOCK_BYTES = {"q8_0": 2 + 32, "q4_0": 2 + 16}


@dataclass(frozen=True)
class QuantizedWeight:
    """A [N, K] weight in split GGML blocks: scales [N, K / 32] float16, quants [N, K] int8 or [N, K / 2] uint8."""

    qtype: str
    scales: torch.Tensor
    quants: torch.Tensor

    def __post_init__(self) -> None:
        ref.ref_ggml_dequantize(self.scales[:1], self.quants[:1], self.qtype)  # raises ValueError on a mismatch
        if self.scales.shape[0] != self.quants.shape[0] or self.scales.dtype != torch.float16:
            raise ValueError(f"scales {tuple(self.scales.shape)} {self.scales.dtype} must be float16 with one row per quants row")

    @property
    def shape(self) -> tuple[int, int]:
        """(N, K): output and input features."""
        return self.scales.shape[0], self.scales.shape[1] * ref.GGML_BLOCK_SIZE

    @property
    def nbytes(self) -> int:
        """Bytes a matmul reads for the weight."""
        return self.scales.nbytes + self.quants.nbytes

    def dequantize(self) -> torch.Tensor:
        """The float32 [N, K] weight."""
        return ref.ref_ggml_dequantize(self.scales, self.quants, self.qtype)


def quantize(weight: torch.Tensor, qtype: str) -> QuantizedWeight:
    """Quantize a float [N, K] weight (K a multiple of 32) to Q8_0 or Q4_0 on its device (`ref.ref_ggml_quantize`)."""
    scales, quants = ref.ref_ggml_quantize(weight, qtype)
    return QuantizedWeight(qtype, scales.contiguous(), quants.contiguous())


def from_gguf_blocks(raw: torch.Tensor, qtype: str) -> QuantizedWeight:
    """Split a GGUF tensor's Q8_0/Q4_0 blocks, uint8 [N, K / 32 * block bytes], into scales and quants.

    Raises:
        ValueError: an unknown qtype, or a row length that is not a whole number of blocks.
    """
    if qtype not in GGUF_BLOCK_BYTES:
        raise ValueError(f"unknown quantization {qtype!r}; expected one of {sorted(GGUF_BLOCK_BYTES)}")
    block_bytes = GGUF_BLOCK_BYTES[qtype]
    if raw.dim() != 2 or raw.dtype != torch.uint8 or raw.shape[1] % block_bytes:
        raise ValueError(f"raw blocks must be uint8 [N, blocks * {block_bytes}], got {tuple(raw.shape)} {raw.dtype}")
    blocks = raw.reshape(raw.shape[0], -1, block_bytes)
    scales = blocks[..., :2].contiguous().view(torch.float16).squeeze(-1)
    quants = blocks[..., 2:].reshape(raw.shape[0], -1).contiguous()
    return QuantizedWeight(qtype, scales, quants.view(torch.int8) if qtype == "q8_0" else quants)


@triton.jit
def _quant_matmul_kernel(
    X, SCALES, QUANTS, BIAS, OUT,
    M, N, K, stride_xm, stride_sn, stride_qn, stride_om,
    IS_Q4: tl.constexpr, HAS_BIAS: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask, col_mask = rows < M, cols < N
    blocks = tl.arange(0, BLOCK_K // 32)  # quant blocks within a K tile
    lanes = tl.arange(0, 32)  # weights within a quant block
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        block_ids = k0 // 32 + blocks
        block_mask = block_ids < K // 32
        w_mask = col_mask[:, None, None] & block_mask[None, :, None]
        if IS_Q4:
            # Byte j of a block holds weight j (low nibble) and weight j + 16 (high nibble); unpacked as
            # [low, high] pairs, a block's 32 weights come out in the order 0, 16, 1, 17, ..., 15, 31.
            half_lanes = tl.arange(0, 16)
            packed = tl.load(QUANTS + cols[:, None, None].to(tl.int64) * stride_qn
                             + (block_ids * 16)[None, :, None] + half_lanes[None, None, :], mask=w_mask, other=0)
            q = tl.reshape(tl.join(packed & 0x0F, packed >> 4), (BLOCK_N, BLOCK_K // 32, 32)).to(tl.float32) - 8.0
            k_index = block_ids[:, None] * 32 + (lanes % 2) * 16 + lanes // 2  # [K tile] in that order
        else:
            q = tl.load(QUANTS + cols[:, None, None].to(tl.int64) * stride_qn
                        + (block_ids * 32)[None, :, None] + lanes[None, None, :], mask=w_mask, other=0).to(tl.float32)
            k_index = block_ids[:, None] * 32 + lanes[None, :]
        scale = tl.load(SCALES + cols[:, None].to(tl.int64) * stride_sn + block_ids[None, :],
                        mask=col_mask[:, None] & block_mask[None, :], other=0.0).to(tl.float32)
        w = tl.reshape(q * scale[:, :, None], (BLOCK_N, BLOCK_K))
        k_index = tl.reshape(k_index, (BLOCK_K,))
        x = tl.load(X + rows[:, None].to(tl.int64) * stride_xm + k_index[None, :],
                    mask=row_mask[:, None] & (k_index < K)[None, :], other=0.0)
        if UPCAST:  # float32 inputs, and the interpreter (whose bfloat16 arithmetic is wrong)
            acc += tl.dot(x.to(tl.float32), tl.trans(w), input_precision="ieee")
        else:  # tensor cores: the dequantized weight rounded to the activation dtype, as the reference does
            acc += tl.dot(x, tl.trans(w.to(X.dtype.element_ty)))
    if HAS_BIAS:
        acc += tl.load(BIAS + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    tl.store(OUT + rows[:, None].to(tl.int64) * stride_om + cols[None, :], acc.to(OUT.dtype.element_ty),
             mask=row_mask[:, None] & col_mask[None, :])


def quant_matmul(x: torch.Tensor, weight: QuantizedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ W.T (+ bias) with W dequantized on the fly: the contract of `kernels.ref.ref_ggml_linear`.

    Args:
        x: [..., K] float32/bfloat16/float16 activations.
        weight: W [N, K] as a `QuantizedWeight` on x's device.
        bias: [N] or None.
    Returns:
        [..., N] in x's dtype.
    Raises:
        ValueError: K differs from W's, a bias of the wrong size, an unsupported dtype, or tensors on
            different or unsupported devices.
    """
    num_out, num_in = weight.shape
    check_tensor("x", x, dim=x.dim())
    if x.shape[-1] != num_in:
        raise ValueError(f"x has {x.shape[-1]} features; the weight [N, K] is {weight.shape}")
    if bias is not None and bias.shape != (num_out,):
        raise ValueError(f"bias {tuple(bias.shape)} must be [{num_out}]")
    check_devices(x=x, scales=weight.scales, quants=weight.quants, **({"bias": bias} if bias is not None else {}))
    rows = x.reshape(-1, num_in)
    if rows.shape[0] > 1 and rows.stride(1) != 1:
        rows = rows.contiguous()
    out = torch.empty(rows.shape[0], num_out, dtype=x.dtype, device=x.device)
    num_rows = rows.shape[0]
    if num_rows:
        # tl.dot needs tiles of at least 16; decode (a few rows) takes narrow N tiles to spread over more programs.
        block_m = 16 if num_rows <= 16 else 32 if num_rows <= 64 else 64
        block_n = 32 if num_rows <= 16 else 64
        block_k = 64 if num_in % 64 == 0 else 32
        grid = (triton.cdiv(num_rows, block_m), triton.cdiv(num_out, block_n))
        _quant_matmul_kernel[grid](
            rows, weight.scales, weight.quants, bias if bias is not None else out, out,
            num_rows, num_out, num_in, rows.stride(0), weight.scales.stride(0), weight.quants.stride(0), out.stride(0),
            IS_Q4=weight.qtype == "q4_0", HAS_BIAS=bias is not None,
            UPCAST=x.dtype == torch.float32 or is_interpreting(),
            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        )
    return out.view(*x.shape[:-1], num_out)


class QuantizedLinear:
    """The dispatch op "linear" (contract of `kernels.ref.ref_linear`) on weights quantized at first use.

    Each float weight [N, K] is quantized to `qtype` once and kept while the weight lives (keyed by the
    tensor object and its version counter, so an in-place update re-quantizes). A weight whose K is not a
    multiple of 32 runs `F.linear`. Lossy: outputs differ from the float weight's by the quantization error.
    """

    def __init__(self, qtype: str):
        if qtype not in GGUF_BLOCK_BYTES:
            raise ValueError(f"unknown quantization {qtype!r}; expected one of {sorted(GGUF_BLOCK_BYTES)}")
        self.qtype = qtype
        self._cache: dict[int, tuple[weakref.ref, int, QuantizedWeight]] = {}

    def quantized(self, weight: torch.Tensor) -> QuantizedWeight:
        """The cached quantization of `weight`, made now when missing or stale."""
        key = id(weight)
        entry = self._cache.get(key)
        if entry is None or entry[0]() is not weight or entry[1] != weight._version:
            cache = self._cache
            entry = (weakref.ref(weight, lambda _, key=key: cache.pop(key, None)), weight._version,
                     quantize(weight.detach(), self.qtype))
            self._cache[key] = entry
        return entry[2]

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if weight.dim() != 2 or weight.shape[1] % ref.GGML_BLOCK_SIZE:
            return F.linear(x, weight, bias)
        return quant_matmul(x, self.quantized(weight), bias)
