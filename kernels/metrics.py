"""Prometheus view of continuous compilation: recorded calls per (op, bucket) and the installed winners.

A custom collector, read at scrape time from the attached `ShapeRecorder` and the dispatch's installed
winners (no state of its own); register it in an app-owned registry:

    registry.register(KernelCollector())

    link_kernel_calls_total{op, bucket, dtype, model}          counter: calls recorded since the engine started
    link_kernel_winner_speedup{op, bucket, dtype, variant}     gauge: default time / winner time, per installed winner
    link_kernel_autotune_buckets{model, outcome}               gauge: buckets tuned in the background ("winner"/"default")
    link_kernel_autotune_pending{model}                        gauge: recorded buckets not tuned yet
    link_kernel_autotune_preemptions_total{model}              counter: tuning slices that gave way to a request
    link_kernel_default{op, variant}                           gauge: 1 for the CPU default in effect (`kernels.cpu_defaults`)
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
        yield from _auto_tune_metrics()


def _auto_tune_metrics():
    """The background tuners' counts (`kernels.background.running`) and the CPU defaults in effect."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    from kernels.background import running
    from kernels.dispatch import default_names

    tuned = GaugeMetricFamily("link_kernel_autotune_buckets", "Buckets the background tuner has tuned, by outcome.",
                              labels=("model", "outcome"))
    pending = GaugeMetricFamily("link_kernel_autotune_pending", "Recorded buckets the background tuner has not tuned yet.",
                                labels=("model",))
    preempted = CounterMetricFamily("link_kernel_autotune_preemptions", "Tuning slices dropped because the engine got work.",
                                    labels=("model",))
    for auto in running():
        report = auto.report()
        num_default = sum(v == "default" for v in report["winners"].values())
        tuned.add_metric((report["model"], "winner"), report["num_tuned"] - num_default)
        tuned.add_metric((report["model"], "default"), num_default)
        preempted.add_metric((report["model"],), report["num_preempted"])
        if report["num_pending"] is not None:
            pending.add_metric((report["model"],), report["num_pending"])
    yield tuned
    yield pending
    yield preempted
    defaults = GaugeMetricFamily("link_kernel_default", "The default kernel chosen for this CPU, per op (1).",
                                 labels=("op", "variant"))
    for op, name in sorted(default_names().items()):
        defaults.add_metric((op, name), 1)
    yield defaults


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
