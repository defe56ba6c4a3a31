"""A winner is compiled before it serves: warm-up on the bucket's inputs, then its compile-free form.

`torch.compile` compiles at the first call whose guards miss (a new shape, stride or dtype), which
takes seconds on a CPU. Left to the engine, that call is a served step: after `link compile tune`,
concurrency 16 fell from 86 to 50 output tokens/s in a measured run because the compiled rotary winner, warmed
on contiguous inputs, met the engine's strided q/k view (a slice of the fused QKV output) in the first
prefill of its bucket and compiled again inside the measured requests. So every install goes through
`install_warm`:

1. the variant runs on the bucket's inputs (`kernels.tuner_inputs.warmup_cases`: the bucket's largest
   and smallest shapes, the layouts the engine passes), under inference mode like the engine's steps,
   so every compilation happens now;
2. what is staged is the variant's serving form (`serving_form`): for a compiled variant, the same
   compiled code in run-only mode (`torch._dynamo.run`), which runs compiled code where the guards
   pass and the eager function where they do not, and never compiles inside a step.

The engine applies the staged winner between two steps (`kernels.apply_pending`), after the warm-up.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

import torch

from kernels.dispatch import install
from kernels.recorder import Bucket
from kernels.variants import Variant

logger = logging.getLogger(__name__)


def serving_form(fn: Callable) -> Callable:
    """What a step calls: `fn.serving()` for a compiled variant (compiled code only), else `fn` itself."""
    serving = getattr(fn, "serving", None)
    return serving() if callable(serving) else fn


@torch.inference_mode()
def warm_up(fn: Callable, cases: list[tuple[tuple, dict]]) -> float:
    """Call `fn(*args, **kwargs)` on every case (compiling what it compiles); returns the seconds spent.

    The process's torch thread count is restored afterwards (a thread-count variant sets it per call).
    """
    threads = torch.get_num_threads()
    start = time.monotonic()
    try:
        for args, kwargs in cases:
            fn(*args, **kwargs)
    finally:
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
    return time.monotonic() - start


def install_warm(bucket: Bucket, variant: Variant, model=None) -> Callable:
    """Warm `variant` up on `bucket`'s inputs, then stage its serving form as the bucket's winner.

    Args:
        bucket: the shape bucket it wins.
        variant: the winner.
        model: the loaded `CausalLM` (step ops run it; unused for kernel ops).
    Returns:
        the staged callable.
    Raises:
        ValueError: a step bucket without `model`.
    """
    from kernels.tuner_inputs import warmup_cases

    seconds = warm_up(variant.fn, warmup_cases(bucket, model))
    fn = serving_form(variant.fn)
    install(bucket, variant.name, fn)
    logger.info("warmed up %s for %s %s [%s] in %.1f s", variant.name, bucket.op, bucket.label, bucket.dtype, seconds)
    return fn
