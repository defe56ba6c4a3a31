"""Triton kernels for the hot operations, each with a PyTorch reference in `kernels.ref`.

One module per kernel, each in thin layers: the `@triton.jit` kernel (`_..._kernel`), a launcher that
checks shapes, strides, dtypes and devices and picks block sizes, and a functional entry with the
contract of the dispatch op it can replace:

| module | kernel | dispatch op |
| --- | --- | --- |
| `rms_norm` | RMSNorm, optionally fused with the residual add (`add_rms_norm`) | rms_norm |
| `rotary` | rotary embedding, half-split layout | rotary |
| `activation` | SwiGLU / GeGLU gating on the fused gate/up output | gated_mlp (torch matmuls around it) |
| `paged_attention` | decode attention over the paged KV cache (block tables, sliding window, GQA) | paged_attention |
| `quant_matmul` | x @ W.T with W in Q8_0 / Q4_0 blocks, dequantized on the fly | linear (weights quantized at first use) |

Importing this package does not import Triton; the kernel modules do. Triton reads `TRITON_INTERPRET=1`
when a kernel is decorated, so set it before importing a kernel module to run the kernels on CPU tensors
in Triton's interpreter (correctness only; the tests do this where no GPU exists). `triton_variants()`
describes the functional entries as tuner candidates; nothing is registered here.
Parity tests: tests/kernels/test_triton_*.py; GPU timing: benchmarks/gpu_kernels.py.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Callable

import torch

from kernels.variants import Variant

# (atol, rtol) against the float32 reference on the same inputs, per input dtype; measured by the parity
# tests (tests/kernels/test_triton_*.py) with margin. bfloat16 covers one rounding of the output (the
# reference rounds after every operation, the kernels once).
EXACT_ISH = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2e-2, 2e-2), torch.float16: (2e-3, 2e-3)}
MATMUL = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (3e-2, 3e-2), torch.float16: (3e-3, 3e-3)}
ATTENTION = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (3e-2, 3e-2), torch.float16: (3e-3, 3e-3)}
# Weight-only quantization against the float weight's output, for unit-scale activations and weights
# (|W x| ~ 1): Q8_0's step is max|w| / 127 per block, Q4_0's max|w| / 8. Measured on Gaussian weights
# (K = 192-1536, 16 x 576 outputs): the smallest passing atol = rtol is 0.02 for Q8_0, 0.35 for Q4_0.
Q8_0 = {torch.float32: (3e-2, 3e-2), torch.bfloat16: (5e-2, 5e-2), torch.float16: (3e-2, 3e-2)}
Q4_0 = {torch.float32: (5e-1, 5e-1), torch.bfloat16: (5e-1, 5e-1), torch.float16: (5e-1, 5e-1)}


def is_available() -> bool:
    """True when Triton is importable and a CUDA device is present (the variants' native setting)."""
    return importlib.util.find_spec("triton") is not None and torch.cuda.is_available()


def _lazy(module: str, attribute: str) -> Callable:
    """A callable that imports kernels.triton.<module> (and so Triton) at its first call, then forwards."""
    resolved: list[Callable] = []

    def call(*args, **kwargs):
        if not resolved:
            resolved.append(getattr(importlib.import_module(f"kernels.triton.{module}"), attribute))
        return resolved[0](*args, **kwargs)

    call.__name__ = call.__qualname__ = f"triton_{attribute}"
    call.__doc__ = f"kernels.triton.{module}.{attribute}, imported at the first call."
    return call


def _quantized_linear(qtype: str) -> Callable:
    """The "linear" op through `quant_matmul.QuantizedLinear(qtype)`, made (and Triton imported) at the first call."""
    made: list[Callable] = []

    def call(x, weight, bias=None):
        if not made:
            made.append(importlib.import_module("kernels.triton.quant_matmul").QuantizedLinear(qtype))
        return made[0](x, weight, bias)

    call.__name__ = call.__qualname__ = f"triton_{qtype}_linear"
    return call


def triton_variants() -> list[Variant]:
    """The Triton kernels as tuner candidates for the dispatch ops (CUDA only; none registered here)."""
    dtypes = (torch.float32, torch.bfloat16, torch.float16)
    common = dict(devices=("cuda",), dtypes=dtypes, available=is_available)
    return [
        Variant("rms_norm", "triton", _lazy("rms_norm", "rms_norm"), tolerance=dict(EXACT_ISH),
                description="Triton RMSNorm, one row per program", **common),
        Variant("rotary", "triton", _lazy("rotary", "rotary"), tolerance=dict(EXACT_ISH),
                description="Triton rotary embedding (half-split), q/k read in place", **common),
        Variant("gated_mlp", "triton", _lazy("activation", "gated_mlp"), tolerance=dict(MATMUL),
                description="torch matmuls around a Triton SwiGLU/GeGLU gating kernel", **common),
        Variant("paged_attention", "triton", _lazy("paged_attention", "paged_attention"), tolerance=dict(ATTENTION),
                description="Triton paged decode attention (split over long sequences); prefill: reference", **common),
        Variant("linear", "triton_q8_0", _quantized_linear("q8_0"), tolerance=dict(Q8_0),
                description="Triton matmul on Q8_0 weights (quantized at first use; lossy)", **common),
        Variant("linear", "triton_q4_0", _quantized_linear("q4_0"), tolerance=dict(Q4_0),
                description="Triton matmul on Q4_0 weights (quantized at first use; lossy)", **common),
    ]
