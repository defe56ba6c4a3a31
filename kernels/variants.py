"""The registry of implementation variants the tuner may install over a dispatch op.

A `Variant` is one way to compute a dispatch op (`kernels.ops`): a Triton kernel, a `torch.compile`d
function, a weight-only quantized matmul. It has the op's contract (the same arguments and result as the
op's `ref_*` reference), says where it can run (torch device types, input dtypes) and how close to the
reference it must be (the tolerance per dtype, checked by the tuner on recorded shapes before the variant
is ever used). Registering a variant makes it a candidate; only the tuner installs one, per shape bucket.
The provider modules (cpu, compiled, triton, quantized) list their variants; `kernels.candidates` gathers
and registers them, so this registry imports none of them and they import only it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable

import torch

from kernels.ops import is_known_op, known_ops
from kernels.recorder import STEP_OPS

# (atol, rtol) against the reference when the reference runs in float32 on the same inputs.
DEFAULT_TOLERANCE: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (1e-5, 1e-5),
    torch.bfloat16: (2e-2, 2e-2),
    torch.float16: (2e-3, 2e-3),
}


@dataclass(frozen=True)
class Variant:
    """One candidate implementation of a dispatch op.

    Attributes:
        op: the dispatch op it implements ("rms_norm", "linear", ...).
        name: unique among the op's variants ("triton", "compile", "int8_weight", ...).
        fn: a callable with the op's reference contract.
        devices: torch device types it runs on ("cpu", "cuda").
        dtypes: input dtypes it accepts.
        tolerance: (atol, rtol) per dtype against the float32 reference; a variant outside it is rejected.
            For a step op, against the eager step's logits, rtol scaled by each row's largest |logit|,
            and every greedy token must match (`kernels.step_check`).
        exact: True when its float32 results equal the reference's bit for bit (greedy outputs unchanged).
        max_relative_error: for a quantized matmul, the largest relative RMS error ||y - y_ref|| / ||y_ref||
            allowed on the model's own weights (checked by the tuner when it has the model); None: unchecked.
        lossy: True when it computes with approximated weights (a weight-only quantized step): the tuner
            tries it only when lossy variants are allowed. An op variant whose tolerance is looser than
            `DEFAULT_TOLERANCE` counts as lossy too.
        available: returns False where the variant cannot run here (say, Triton is not installed).
        description: one line for `link compile status`.
    """

    op: str
    name: str
    fn: Callable
    devices: tuple[str, ...] = ("cpu",)
    dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16)
    tolerance: dict[torch.dtype, tuple[float, float]] = field(default_factory=lambda: dict(DEFAULT_TOLERANCE))
    exact: bool = False
    lossy: bool = False
    max_relative_error: float | None = None
    available: Callable[[], bool] = lambda: True
    description: str = ""

    def runs_on(self, device: str, dtype: torch.dtype) -> bool:
        """True when this variant accepts `dtype` inputs on torch device type `device` and is available."""
        return device in self.devices and dtype in self.dtypes and self.available()

    def tolerance_for(self, dtype: torch.dtype) -> tuple[float, float]:
        """(atol, rtol) for `dtype`: this variant's, else `DEFAULT_TOLERANCE`'s, else exact."""
        return self.tolerance.get(dtype, DEFAULT_TOLERANCE.get(dtype, (0.0, 0.0)))

    def is_lossy(self, dtype: torch.dtype) -> bool:
        """Whether it changes results beyond float rounding: `lossy`, or an op variant (not a step) whose
        tolerance for `dtype` is looser than `DEFAULT_TOLERANCE` (the tuner tries it only when allowed)."""
        exact = DEFAULT_TOLERANCE.get(dtype, (0.0, 0.0))
        atol, rtol = self.tolerance_for(dtype)
        return self.lossy or (self.op not in STEP_OPS and (atol > exact[0] or rtol > exact[1]))


_lock = threading.Lock()
_variants: dict[str, dict[str, Variant]] = {}


def register_variant(variant: Variant) -> Variant:
    """Add `variant` to its op's candidates (replacing one of the same name). Returns it.

    Step ops (`kernels.recorder.STEP_OPS`, e.g. "decode_step": a whole decode step of a model, called as
    fn(model, token_ids, batch, cache)) are accepted beside the dispatch ops.

    Raises:
        ValueError: the op is neither a dispatch op nor a step op.
    """
    if not is_known_op(variant.op):
        raise ValueError(f"variant {variant.name!r}: unknown op {variant.op!r}; known: {known_ops()}")
    with _lock:
        _variants.setdefault(variant.op, {})[variant.name] = variant
    return variant


def variants(op: str) -> list[Variant]:
    """The registered variants of `op`, in registration order (empty when none)."""
    with _lock:
        return list(_variants.get(op, {}).values())


def get_variant(op: str, name: str) -> Variant:
    """The variant `name` of `op`. Raises KeyError naming the registered ones."""
    with _lock:
        found = _variants.get(op, {})
        if name not in found:
            raise KeyError(f"no variant {name!r} of {op!r}; registered: {sorted(found)}")
        return found[name]
