"""Background tuning's scheduling, timed for real: `IdleGate` (idle detection) and `AutoTuner` slices that give way
to work, write nothing when they do (keeping what they measured whole for the next slice), and persist and stage
the winner when they finish."""

from __future__ import annotations

import threading
import time

import pytest
import torch

import kernels
import kernels.tuner as tuner_module
from kernels import ref
from kernels.background import AutoTuner, running
from kernels.idle import IdleGate
from kernels.metrics import KernelCollector
from kernels.recorder import Bucket
from kernels.tuner import Tuner
from kernels.variants import Variant
from kernels.winners import WinnerTable

MODEL = "test-model"
HOT = Bucket("rms_norm", ((2, 24),), "float32")


DEFAULT_S = 0.03  # far slower than `_fast` even when a loaded 2-core machine makes a tiny op take milliseconds


def _slow_default(x, weight, eps, *, offset=0.0):
    time.sleep(DEFAULT_S)
    return ref.ref_rms_norm(x, weight, eps, offset=offset)


def _fast(x, weight, eps, *, offset=0.0):
    return ref.ref_rms_norm(x, weight, eps, offset=offset)


@pytest.fixture(autouse=True)
def isolated(monkeypatch):
    kernels.reset()
    kernels.register("rms_norm", _slow_default)
    monkeypatch.setattr(tuner_module, "variants", lambda op: [Variant("rms_norm", "fast", _fast, exact=True)] if op == "rms_norm" else [])
    yield
    kernels.attach_recorder(None)
    kernels.reset()


def _busy_after(delay_s: float, flag: threading.Event) -> threading.Timer:
    timer = threading.Timer(delay_s, flag.set)
    timer.start()
    return timer


def test_gate_waits_until_the_engine_has_been_idle_for_min_idle_s():
    busy = threading.Event()
    busy.set()
    gate = IdleGate(busy.is_set, min_idle_s=0.3, poll_s=0.01)
    threading.Timer(0.2, busy.clear).start()  # the engine's last request ends 0.2 s from now
    start = time.monotonic()
    assert gate.wait_idle(threading.Event(), timeout_s=5)
    waited = time.monotonic() - start
    assert 0.5 - 0.02 <= waited < 1.5  # 0.2 s busy + 0.3 s idle, one poll of slack below
    assert gate.idle_for() >= 0.3


def test_gate_gives_up_when_stopped_or_out_of_time():
    busy = threading.Event()
    busy.set()
    gate = IdleGate(busy.is_set, min_idle_s=0.1, poll_s=0.01)
    start = time.monotonic()
    assert not gate.wait_idle(threading.Event(), timeout_s=0.2)
    assert 0.2 <= time.monotonic() - start < 1.0
    stop = threading.Event()
    threading.Timer(0.1, stop.set).start()
    start = time.monotonic()
    assert not gate.wait_idle(stop)
    assert time.monotonic() - start < 1.0
    with pytest.raises(ValueError):
        IdleGate(busy.is_set, poll_s=0)


def test_should_yield_follows_the_engine_and_counts_yields():
    busy = threading.Event()
    gate = IdleGate(busy.is_set, min_idle_s=0.0)
    assert not gate.should_yield() and gate.num_yields == 0
    busy.set()
    assert gate.should_yield() and gate.idle_for() == 0.0 and gate.num_yields == 1


def _auto(tmp_path, busy: threading.Event, **gate_options) -> tuple[AutoTuner, WinnerTable]:
    table = WinnerTable(tmp_path / "compile" / "winners.sqlite")
    recorder = kernels.ShapeRecorder()
    kernels.attach_recorder(recorder)
    for _ in range(20):
        kernels.dispatch("rms_norm", torch.randn(2, 24), torch.ones(24), 1e-6)
    auto = AutoTuner(Tuner(table, MODEL, repeats=10, warmup=1), recorder, IdleGate(busy.is_set, **gate_options))
    auto.status.cpu_defaults = {}  # chosen already: no C++ build in this test
    return auto, table


def test_a_slice_gives_way_within_a_repeat_and_writes_nothing(tmp_path):
    busy = threading.Event()
    auto, table = _auto(tmp_path, busy, min_idle_s=0.0)
    # Untouched, the slice times the default for 11 passes of 30 ms (>= 330 ms); work arrives after 45 ms.
    _busy_after(0.045, busy)
    start = time.monotonic()
    assert auto.run_slice() == "preempted"
    assert time.monotonic() - start < 0.25  # it yielded at the next pass, not at the end of the bucket
    assert auto.status.num_preempted == 1 and table.results() == [] and auto.status.winners == {}
    busy.clear()
    assert auto.run_slice() == "tuned"
    (winner,) = table.winners(auto.tuner.env).values()
    assert winner.bucket == HOT and winner.variant == "fast" and winner.speedup > 1.05
    assert table.counts(MODEL) == {HOT: 20}  # the recorded shapes persist with the verdicts
    assert auto.run_slice() == "nothing"
    assert kernels.installed() == {}  # staged: the engine applies it at its next step
    kernels.apply_pending()
    assert kernels.installed() == {HOT: "fast"}


def test_a_bucket_goes_on_from_what_the_preempted_slice_measured(tmp_path):
    busy = threading.Event()
    auto, table = _auto(tmp_path, busy, min_idle_s=0.0)
    calls = []

    def default_then_work(x, weight, eps, *, offset=0.0):
        calls.append(x.shape[0])
        if len(calls) == 11:  # the default's last timed call (1 warm-up + 10 repeats): a request arrives
            busy.set()
        return _slow_default(x, weight, eps, offset=offset)

    kernels.register("rms_norm", default_then_work)
    assert auto.run_slice() == "preempted" and table.results() == []
    busy.clear()
    assert auto.run_slice() == "tuned"
    assert len(calls) == 11  # the default was not timed again
    (winner,) = table.winners(auto.tuner.env).values()
    assert winner.variant == "fast" and winner.baseline_ms >= DEFAULT_S * 1e3  # the first slice's timing


def test_the_thread_tunes_in_an_idle_gap_and_reports_it(tmp_path):
    busy = threading.Event()
    busy.set()
    auto, table = _auto(tmp_path, busy, min_idle_s=0.2, poll_s=0.01)
    auto.tuner.repeats = 5
    auto.start()
    try:
        time.sleep(0.4)
        assert auto.status.state == "waiting" and table.results() == []  # busy: nothing timed
        busy.clear()
        deadline = time.monotonic() + 20
        while auto.status.state != "idle" and time.monotonic() < deadline:
            time.sleep(0.05)
        report = auto.report()
        assert report["winners"] == {"rms_norm 2x24 float32": "fast"} and report["num_tuned"] == 1
        assert auto in running()
        metrics = {m.name: m for m in KernelCollector().collect()}
        samples = {s.labels["outcome"]: s.value for s in metrics["link_kernel_autotune_buckets"].samples}
        assert samples == {"winner": 1, "default": 0}
    finally:
        auto.stop()
    assert not auto._thread.is_alive() and auto not in running() and auto.status.state == "stopped"
