"""The engine loop's stall bound (serving/engine/async_engine.py): the configured timeout, stretched to 3x the
slowest recent step on a machine that slow, never shortened, and forgetting steps older than the window."""

from __future__ import annotations

from types import SimpleNamespace

from serving.engine.async_engine import RECENT_STEPS, STALL_STEP_FACTOR, AsyncLLMEngine


def _engine(timeout_s: float = 30.0) -> AsyncLLMEngine:
    return AsyncLLMEngine(SimpleNamespace(config=SimpleNamespace(stall_timeout_s=timeout_s)))


def test_the_bound_is_the_timeout_until_a_step_is_slower_than_a_third_of_it():
    engine = _engine()
    assert engine.stall_bound_s == 30.0
    engine._recent_steps_s.extend([0.5, 9.0, 2.0])
    assert engine.stall_bound_s == 30.0  # 3 x 9 s = 27 s < 30 s
    engine._recent_steps_s.append(14.0)  # a 512-token prefill chunk of a 1.5B model on a loaded 2-core machine
    assert engine.stall_bound_s == STALL_STEP_FACTOR * 14.0 == 42.0


def test_a_slow_step_stops_counting_once_it_leaves_the_window():
    engine = _engine()
    engine._recent_steps_s.append(20.0)
    engine._recent_steps_s.extend([0.1] * (RECENT_STEPS - 1))
    assert engine.stall_bound_s == 60.0
    engine._recent_steps_s.append(0.1)
    assert engine.stall_bound_s == 30.0
