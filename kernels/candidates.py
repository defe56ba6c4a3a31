"""Which variant providers the tuner may choose from, registered on demand.

    register_candidates(("cpu", "compiled", "triton"))  # the defaults: results equal the fp32 reference
                                                        # within float rounding (greedy fp32 outputs unchanged)
    register_candidates(("cpu", "compiled", "quantized"))  # adds lossy weight-only int8/int4 variants (opt-in)
    provider_variants("cpu")                            # a provider's variants, not registered

This is the provider registry: each provider is the variant lists of one or more modules, gathered here, so
no provider module imports another and `kernels.dispatch` imports none of them. Providers: "cpu" (plain
PyTorch and our C++ kernels: decode attention as batched matmuls, `kernels.cpu`; the float linears for a few
rows, `kernels.cpu_linear`; the whole decode step, `kernels.native_step`), "compiled" (`kernels.compiled`:
torch.compile and thread counts), "triton" (`kernels.triton.triton_variants`, CUDA only), "quantized"
(`kernels.quant_cpu`'s int8/int4 linears and `kernels.compiled`'s W4A16 decode steps).
A provider one of whose modules is missing or fails to import is skipped with a log line.
"""

from __future__ import annotations

import importlib
import logging

from kernels.variants import Variant, register_variant

logger = logging.getLogger(__name__)

# provider -> its (module, function returning a list of `Variant`s), gathered in this order
PROVIDERS: dict[str, tuple[tuple[str, str], ...]] = {
    "cpu": (("kernels.cpu", "attention_variants"), ("kernels.cpu_linear", "linear_variants"),
            ("kernels.native_step", "native_variants")),
    "compiled": (("kernels.compiled", "register_compiled_variants"),),
    "triton": (("kernels.triton", "triton_variants"),),
    "quantized": (("kernels.quant_cpu", "cpu_quant_variants"), ("kernels.compiled", "quantized_step_variants")),
}
DEFAULT_PROVIDERS = ("cpu", "compiled", "triton")


def provider_variants(name: str) -> list[Variant]:
    """The variants of provider `name`, not registered (its modules imported now).

    Raises:
        ValueError: an unknown provider name.
        ImportError (or whatever a provider module raises when imported): a provider unavailable here.
    """
    if name not in PROVIDERS:
        raise ValueError(f"unknown variant provider {name!r}; choose from {', '.join(PROVIDERS)}")
    return [v for module, function in PROVIDERS[name] for v in getattr(importlib.import_module(module), function)()]


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
        try:
            made = provider_variants(name)
        except Exception as exc:  # an optional provider must not stop the others
            logger.warning("variant provider %s unavailable: %s", name, exc)
            continue
        out.extend(register_variant(v) for v in made)
    return out
