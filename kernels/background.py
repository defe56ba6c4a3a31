"""Tuning inside a serving process: `AutoTuner` (on by default, while the engine is idle) and `BackgroundTuner`
(fixed rounds, link.yaml `engine: {compile_tune: true}`).

    auto = AutoTuner(Tuner(WinnerTable(), "smollm2-135m-instruct", model=loaded.model), recorder,
                     IdleGate(lambda: async_engine.has_work))
    auto.start()        # a daemon thread at nice 19
    auto.report()       # {"state": "idle", "num_tuned": 5, "winners": {...}, ...}
    auto.stop()

`AutoTuner` works in slices, each started only after the engine has been idle for `IdleGate.min_idle_s`:
1. once: the CPU's default kernels (`kernels.cpu_defaults`), building our C++ kernel if need be;
2. then one bucket per slice: the hottest recorded bucket with no verdict in the winner table
   (`Tuner.todo`), verified, timed, its verdicts stored in $LINK_HOME/compile/winners.sqlite and its winner
   staged (`kernels.warmup.install_warm`), which the engine applies at its next step (`kernels.apply_pending`);
   the recorded counts are saved beside it (the input of `link compile tune --workload recorded`).
A slice yields as soon as the engine has work (`Tuner.interrupt`, `TuningPreempted`): nothing of the bucket is
written yet, and a later idle gap goes on from the measurements the slice finished (each one taken whole in an
idle gap), so a bucket longer than any gap still completes. The thread runs at nice 19 (Linux sets it per thread; g++ builds
it starts inherit it), and only one tuner of the process works at a time (`_WORK`). Each slice is logged, and
`/metrics` shows the counts (`kernels.metrics`, `link_kernel_autotune`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field

from kernels.idle import IdleGate
from kernels.recorder import ShapeRecorder
from kernels.tuner import Tuner, TuningPreempted
from kernels.winners import Result

logger = logging.getLogger(__name__)

_WORK = threading.Lock()  # one tuning slice at a time in the process (two models' tuners would time each other)
_running: list["AutoTuner"] = []  # the started AutoTuners, for /metrics


@dataclass
class AutoTuneStatus:
    """What an `AutoTuner` has done so far (read by `report` and /metrics).

    Attributes:
        state: "waiting" (for an idle gap), "tuning", "idle" (nothing left to tune), "stopped".
        cpu_defaults: {op: kernel} chosen for this CPU (`kernels.cpu_defaults`); None before the first slice.
        winners: {"op bucket dtype": variant} of every bucket tuned here ("default": nothing beat the default).
        num_pending: recorded buckets with no verdict yet, as of the last slice (None before the first look).
        num_preempted: slices dropped because the engine got work.
        num_failed: buckets whose tuning raised (skipped until restart).
    """

    state: str = "waiting"
    cpu_defaults: dict[str, str] | None = None
    winners: dict[str, str] = field(default_factory=dict)
    num_pending: int | None = None
    num_preempted: int = 0
    num_failed: int = 0


def lower_priority() -> bool:
    """Give the calling thread nice 19 (Linux: per thread); False where the OS refuses or has no such call."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        return True
    except (AttributeError, OSError):
        return False


class AutoTuner:
    """Tunes the buckets a serving engine records, in its idle gaps, on a low-priority daemon thread.

    Args:
        tuner: the `Tuner` of the served model (its table, environment and model).
        recorder: the `ShapeRecorder` attached to the dispatch.
        gate: the `IdleGate` over the engine (or every engine of the process).
        rest_s: seconds to wait after a pass that found nothing to tune.
    """

    def __init__(self, tuner: Tuner, recorder: ShapeRecorder, gate: IdleGate, rest_s: float = 2.0):
        self.tuner, self.recorder, self.gate, self.rest_s = tuner, recorder, gate, rest_s
        self.status = AutoTuneStatus()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failed: set = set()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"auto-tune-{self.tuner.env.model}", daemon=True)
            self._thread.start()
            _running.append(self)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Ask the thread to stop and wait up to `timeout_s` for its slice to yield (it checks every few ms)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        self.status.state = "stopped"
        if self in _running:
            _running.remove(self)

    def report(self) -> dict:
        """The status as JSON-ready data (`AutoTuneStatus` fields and the model)."""
        s = self.status
        return {"model": self.tuner.env.model, "state": s.state, "cpu_defaults": s.cpu_defaults, "winners": dict(s.winners),
                "num_tuned": len(s.winners), "num_pending": s.num_pending, "num_preempted": s.num_preempted, "num_failed": s.num_failed}

    def run_slice(self) -> str:
        """One unit of work now (the caller checked the engine is idle): "defaults", "tuned", "preempted",
        "failed" or "nothing" (no recorded bucket left without a verdict)."""
        from kernels.cpu_defaults import install_cpu_defaults

        with _WORK:
            if self.status.cpu_defaults is None:
                self.status.cpu_defaults = install_cpu_defaults(build=True)
                logger.info("default kernels for this CPU: %s", self.status.cpu_defaults or "the PyTorch references")
                return "defaults"
            counts = self.recorder.snapshot()
            todo = [(b, n) for b, n in self.tuner.todo(counts) if b not in self._failed]
            self.status.num_pending = len(todo)
            if not todo:
                self._save_counts()
                return "nothing"
            bucket, calls = todo[0]
            self.tuner.interrupt = lambda: self._stop.is_set() or self.gate.should_yield()
            started = time.monotonic()
            try:
                results = self.tuner.tune_bucket(bucket, calls)
            except TuningPreempted:
                self.status.num_preempted += 1
                return "preempted"
            except Exception:  # a bucket that cannot be tuned must not stop the others
                logger.exception("auto-tune of %s %s [%s] failed; skipped until restart", bucket.op, bucket.label, bucket.dtype)
                self._failed.add(bucket)
                self.status.num_failed += 1
                self.status.num_pending -= 1
                return "failed"
            finally:
                self.tuner.interrupt = None
            self._save_counts()
            self.status.num_pending -= 1
        self._note(bucket, results, time.monotonic() - started)
        return "tuned"

    def _save_counts(self) -> None:
        """Add the calls recorded since the last save to the table (`link compile tune --workload recorded`)."""
        counts = self.recorder.since_mark()
        if counts:
            self.tuner.table.add_counts(self.tuner.env.model, counts)

    def _note(self, bucket, results: list[Result], seconds: float) -> None:
        winner = next((r for r in results if r.status == "winner"), None)
        name = winner.variant if winner is not None else "default"
        self.status.winners[f"{bucket.op} {bucket.label} {bucket.dtype}"] = name
        speedup = f", {winner.speedup:.2f}x" if winner is not None and winner.speedup and name != "default" else ""
        logger.info("auto-tuned %s %s [%s] in %.1f s: %s%s", bucket.op, bucket.label, bucket.dtype, seconds, name, speedup)

    def _run(self) -> None:
        lower_priority()
        while not self._stop.is_set() and self.gate.wait_idle(self._stop):
            self.status.state = "tuning"
            try:
                done = self.run_slice()
            except Exception:  # the engine keeps serving; the next gap tries again
                logger.exception("auto-tune slice failed")
                done = "nothing"
            self.status.state = "idle" if done == "nothing" else "waiting"
            if done == "nothing":
                self._stop.wait(self.rest_s)


def running() -> list[AutoTuner]:
    """The `AutoTuner`s started in this process and not stopped."""
    return list(_running)


class BackgroundTuner:
    """Tuning rounds on a daemon thread: every `interval_s`, the buckets that were hot since the last round.

    Args:
        tuner: the `Tuner` of the served model.
        recorder: the attached `ShapeRecorder`.
        budget_s: seconds of tuning per round at most (the CPU budget; tuning runs with one thread).
        interval_s: seconds between rounds.
    """

    def __init__(self, tuner: Tuner, recorder: ShapeRecorder, budget_s: float = 60.0, interval_s: float = 300.0):
        self.tuner, self.recorder, self.budget_s, self.interval_s = tuner, recorder, budget_s, interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.rounds = 0

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="kernel-tuner", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def run_round(self) -> list[Result]:
        """One round now: save the counts recorded since the previous round and tune what was hot in them."""
        self.rounds += 1
        counts = self.recorder.since_mark()
        self.tuner.table.add_counts(self.tuner.env.model, counts)
        return self.tuner.tune(counts, budget_s=self.budget_s)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.run_round()
            except Exception:  # the engine keeps serving; the next round tries again
                logger.exception("background tuning round failed")

