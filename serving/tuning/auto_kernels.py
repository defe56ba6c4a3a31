"""Background kernel tuning for a served engine: `start_auto_tune(async_engine)` (on by default).

    auto = start_auto_tune(engine)           # None when EngineConfig.auto_tune or tuned_kernels is off
    ...
    auto.stop()                              # in the server's shutdown

Both servers call it when they start an engine: `link engine serve` (`serving/api/server.py`) and the
gateway's local engines (`link.backends.local.EnginePool`). It attaches a `ShapeRecorder` to the dispatch
(once per process), registers the candidates and starts a `kernels.background.AutoTuner` gated on the engine
being idle (`kernels.idle.IdleGate` over `AsyncLLMEngine.has_work`, or the caller's probe over several
engines). Candidates: the "cpu" provider on a CPU ("triton" too on CUDA). The "compiled" provider is left to
`link compile tune`: a `torch.compile` takes seconds of Python that cannot yield to a step (it holds the GIL),
where every "cpu" candidate is timed in slices that yield within milliseconds.
"""

from __future__ import annotations

import logging
from typing import Callable

import torch

from serving.engine.async_engine import AsyncLLMEngine

logger = logging.getLogger(__name__)

MIN_IDLE_S = 2.0  # seconds without work before a slice starts (`kernels.idle`)


def auto_tune_providers() -> tuple[str, ...]:
    """The variant providers background tuning times: "cpu", plus "triton" where CUDA is present."""
    return ("cpu", "triton") if torch.cuda.is_available() else ("cpu",)


def start_auto_tune(engine: AsyncLLMEngine, *, is_busy: Callable[[], bool] | None = None, min_idle_s: float = MIN_IDLE_S):
    """Start tuning `engine`'s recorded shapes in its idle gaps; returns the started `AutoTuner`, or None when
    the engine's `EngineConfig` has `auto_tune` or `tuned_kernels` off.

    Args:
        engine: the served engine (its model is timed and installed into).
        is_busy: the probe of work (default: `engine.has_work`); a process serving several engines passes one
            over all of them, so tuning never times beside any step.
        min_idle_s: seconds without work before a slice starts.
    """
    import kernels
    from kernels.background import AutoTuner
    from kernels.candidates import register_candidates
    from kernels.idle import IdleGate
    from kernels.tuner import Tuner
    from kernels.winners import WinnerTable

    config, loaded = engine.engine.config, engine.engine.loaded
    if not (config.auto_tune and config.tuned_kernels):
        return None
    if kernels.recorder() is None:
        kernels.attach_recorder(kernels.ShapeRecorder())
    register_candidates(auto_tune_providers())
    tuner = Tuner(WinnerTable(), loaded.spec.name, model=loaded.model)
    auto = AutoTuner(tuner, kernels.recorder(), IdleGate(is_busy or (lambda: engine.has_work), min_idle_s))
    auto.start()
    logger.info("background kernel tuning of %s is on (winners in %s; --no-auto-tune turns it off)", loaded.spec.name,
                tuner.table.path)
    return auto
