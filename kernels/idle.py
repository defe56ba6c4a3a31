"""`IdleGate`: when a serving engine has been idle long enough to tune, and when tuning must give way.

    gate = IdleGate(lambda: async_engine.has_work, min_idle_s=2.0)
    if gate.wait_idle(stop_event):          # blocks until idle for min_idle_s (False: stopped)
        tuner.interrupt = gate.should_yield  # True as soon as the engine has work again

Why tune only while idle: on a 2-core CPU the engine's step uses both cores, so a candidate timed beside a step
measures the contention, not the kernel, and slows the step it competes with (the inter-token latency).
Timing in the idle gaps gives clean numbers; a request that arrives mid-measurement makes `should_yield`
true at the tuner's next check (between timed passes, milliseconds apart), the measurement in progress is
dropped and taken again in a later gap. `min_idle_s` keeps a closed-loop client's next request (sent as soon as the
previous one finished) from landing on a freshly started slice. The engine's own state is polled
(`poll_s`), so a request shorter than the poll may be missed; it is also shorter than any slice it meets.
"""

from __future__ import annotations

import threading
import time
from typing import Callable


class IdleGate:
    """Idle detection over a busy probe.

    Args:
        is_busy: () -> bool, True while the engine has requests or queued work (`AsyncLLMEngine.has_work`);
            read from the tuner's thread, so it must only read state.
        min_idle_s: seconds without work before tuning may start.
        poll_s: seconds between probes while waiting.
    Raises:
        ValueError: a negative `min_idle_s` or a `poll_s` that is not positive.
    """

    def __init__(self, is_busy: Callable[[], bool], min_idle_s: float = 2.0, poll_s: float = 0.05):
        if min_idle_s < 0 or poll_s <= 0:
            raise ValueError(f"min_idle_s must be >= 0 and poll_s > 0, got {min_idle_s} and {poll_s}")
        self.is_busy, self.min_idle_s, self.poll_s = is_busy, min_idle_s, poll_s
        self._last_busy = time.monotonic()  # a server that just started counts as busy until proven idle
        self.num_yields = 0

    def idle_for(self) -> float:
        """Seconds since the engine was last seen busy (0.0 while it is busy)."""
        now = time.monotonic()
        if self.is_busy():
            self._last_busy = now
            return 0.0
        return now - self._last_busy

    def wait_idle(self, stop: threading.Event, timeout_s: float | None = None) -> bool:
        """Block until the engine has been idle for `min_idle_s`; False when `stop` is set or `timeout_s` passes first."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            idle = self.idle_for()
            if idle >= self.min_idle_s:
                return True
            wait = max(self.poll_s, self.min_idle_s - idle) if idle > 0 else self.poll_s
            if deadline is not None:
                if time.monotonic() >= deadline:
                    return False
                wait = min(wait, max(0.0, deadline - time.monotonic()))
            if stop.wait(min(wait, self.poll_s * 4)):
                return False

    def should_yield(self) -> bool:
        """True when the engine has work now (the tuner's `interrupt`); counts the yields."""
        busy = self.is_busy()
        if busy:
            self._last_busy = time.monotonic()
            self.num_yields += 1
        return busy
