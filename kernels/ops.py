"""The operations `kernels.dispatch` serves: each op's name and its PyTorch reference (`kernels.ref`).

    REFERENCES["rms_norm"](x, weight, eps)    # the ground truth of an op's contract
    check_op("decode_step")                   # a dispatch op or a step op: fine; anything else: KeyError

Both the dispatch table (`kernels.dispatch`) and the variant registry (`kernels.variants`) read this list,
so neither imports the other. Step ops (`kernels.recorder.STEP_OPS`, a whole engine step) are recorded
and tuned like the dispatch ops but never dispatched.
"""

from __future__ import annotations

from typing import Callable

from kernels import ref
from kernels.recorder import STEP_OPS

REFERENCES: dict[str, Callable] = {
    "rms_norm": ref.ref_rms_norm,
    "rotary_cos_sin": ref.ref_rotary_cos_sin,
    "rotary": ref.ref_rotary,
    "attention": ref.ref_attention,
    "paged_attention": ref.ref_paged_attention,
    "gated_mlp": ref.ref_gated_mlp,
    "linear": ref.ref_linear,
}


def known_ops() -> list[str]:
    """The dispatch ops (sorted), then the step ops."""
    return sorted(REFERENCES) + list(STEP_OPS)


def is_known_op(op: str) -> bool:
    """Whether `op` is a dispatch op or a step op."""
    return op in REFERENCES or op in STEP_OPS
