"""Which variant providers the tuner may choose from, registered on demand.

    register_candidates(("cpu", "compiled", "triton"))  # the defaults: results equal the fp32 reference
                                                        # within float rounding (greedy fp32 outputs unchanged)
    register_candidates(("cpu", "compiled", "quantized"))  # adds lossy weight-only int8/int4 variants (opt-in)

Providers: "cpu" (`kernels.cpu.cpu_variants`: plain PyTorch, e.g. decode attention as batched matmuls, and
our C++ kernels: the few-rows linear, the whole decode step, `kernels.native_step`),
"compiled" (`kernels.compiled`: torch.compile and thread counts), "triton"
(`kernels.triton.triton_variants`, CUDA only), "quantized" (`kernels.quant_cpu.cpu_quant_variants`).
A provider whose module is missing or fails to import is skipped with a log line.
"""

from __future__ import annotations

import importlib
import logging

from kernels.variants import Variant, register_variant

logger = logging.getLogger(__name__)

PROVIDERS = {
    "cpu": ("kernels.cpu", "cpu_variants"),
    "compiled": ("kernels.compiled", "register_compiled_variants"),
    "triton": ("kernels.triton", "triton_variants"),
    "quantized": ("kernels.quant_cpu", "cpu_quant_variants"),
}
DEFAULT_PROVIDERS = ("cpu", "compiled", "triton")


def register_candidates(providers=DEFAULT_PROVIDERS) -> list[Variant]:
    """Register every variant of `providers` (idempotent); returns them.

    Raises:
        ValueError: an unknown provider name.
    """
    unknown = [p for p in providers if p not in PROVIDERS]
    if unknown:
        raise ValueError(f"unknown variant providers {unknown}; choose from {', '.join(PROVIDERS)}")
    out: list[Variant] = []
    for name in providers:
        module, function = PROVIDERS[name]
        try:
            made = getattr(importlib.import_module(module), function)()
        except Exception as exc:  # an optional provider must not stop the others
            logger.warning("variant provider %s unavailable: %s", name, exc)
            continue
        out.extend(register_variant(v) for v in made)
    return out
