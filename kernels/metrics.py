"""Prometheus view of continuous compilation: recorded calls per (op, bucket) and the installed winners.

A custom collector, read at scrape time from the attached `ShapeRecorder` and the dispatch's installed
winners (no state of its own); register it in an app-owned registry:

    registry.register(KernelCollector())

    link_kernel_calls_total{op, bucket, dtype, model}          counter: calls recorded since the engine started
    link_kernel_winner_speedup{op, bucket, dtype, variant}     gauge: default time / winner time, per installed winner
"""

from __future__ import annotations


class KernelCollector:
    """Collects from `kernels.dispatch` (process-wide) on each scrape; speedups from the winner table."""

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        from kernels.dispatch import installed, recorder

        calls = CounterMetricFamily("link_kernel_calls", "Kernel calls recorded per op and shape bucket.",
                                    labels=("op", "bucket", "dtype", "model"))
        rec = recorder()
        if rec is not None:
            for bucket, count in sorted(rec.snapshot().items(), key=lambda item: (item[0].op, item[0].label)):
                calls.add_metric((bucket.op, bucket.label, bucket.dtype, bucket.model), count)
        yield calls
        winners = GaugeMetricFamily("link_kernel_winner_speedup", "Installed kernel winners: default time / winner time.",
                                    labels=("op", "bucket", "dtype", "variant"))
        for bucket, name in sorted(installed().items(), key=lambda item: (item[0].op, item[0].label)):
            winners.add_metric((bucket.op, bucket.label, bucket.dtype, name), _stored_speedup(bucket, name))
        yield winners


def _stored_speedup(bucket, name: str) -> float:
    """The speedup the tuner stored for this winner in this environment (NaN when unknown)."""
    from kernels.winners import Environment, WinnerTable, default_path

    if not default_path().is_file():
        return float("nan")
    env = Environment.current(bucket.model) if bucket.model else None
    for result in WinnerTable().results(env):
        if result.bucket.op == bucket.op and result.bucket.label == bucket.label and result.variant == name and result.speedup:
            return result.speedup
    return float("nan")
