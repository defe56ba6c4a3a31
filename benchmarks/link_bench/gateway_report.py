"""The gateway benchmark's report: one cell per (system, mode, concurrency), the latency each proxy adds
over the direct call, its ratios against LiteLLM's proxy and the Rich tables.

    cell = summarize_cell("link", "stream", 8, records, wall_s=1.2, cpu_s=0.9, rss_mb=180.0)
    add_added_latency(cells)              # fills added_p50_s / added_p99_s from the direct cells
    ratios = compute_gateway_ratios(cells)
"""

from __future__ import annotations

from benchmarks.link_bench.report import ms
from benchmarks.link_bench.timing import percentile

# The gateway's targets against LiteLLM's proxy: (ours' added latency / LiteLLM's at most, ours' requests/s / LiteLLM's at
# least). `link` is the default configuration (request log and budgets on), held to 10x LiteLLM's requests/s.
TARGETS = {"link-lean": (0.5, 2.0), "link": (None, 10.0)}
# Server CPU per request at most (ms), at concurrency 1, in the default configuration.
CPU_TARGETS_MS = {("link", "whole"): 0.5, ("link", "stream"): 1.0}
CPU_TARGET_CONCURRENCY = 1


def cpu_target_ms(cell: dict) -> float | None:
    """The CPU-per-request target (ms) that applies to `cell`, or None."""
    if cell["concurrency"] != CPU_TARGET_CONCURRENCY:
        return None
    return CPU_TARGETS_MS.get((cell["system"], cell["mode"]))


def describe_target(system: str, mode: str, concurrency: int) -> str:
    """The target of a ratio row, in words (as `compute_gateway_ratios` checks it)."""
    max_added, min_rate = TARGETS[system]
    parts = ([f"added <= {max_added:g}x"] if max_added is not None else []) + [f"req/s >= {min_rate:g}x"]
    cpu = cpu_target_ms({"system": system, "mode": mode, "concurrency": concurrency})
    return ", ".join(parts + ([f"CPU <= {cpu:g} ms"] if cpu is not None else []))


def summarize_cell(system: str, mode: str, concurrency: int, records: list[dict], wall_s: float, cpu_s: float, rss_mb: float) -> dict:
    """One cell: rates (1/s), latency and TTFT percentiles (s), server CPU s per request, server RSS (MiB), records.

    `records` are the load generator's ({"start_s", "latency_s", "ttft_s", "status"}); a status other than
    200 counts in `num_errors`. The percentiles are over every record.
    """
    latencies = [r["latency_s"] for r in records]
    ttfts = [r["ttft_s"] for r in records]
    return {
        "system": system, "mode": mode, "concurrency": concurrency, "num_requests": len(records),
        "num_errors": sum(r["status"] != 200 for r in records), "duration_s": wall_s,
        "requests_per_s": len(records) / wall_s,
        "latency_p50_s": percentile(latencies, 50), "latency_p99_s": percentile(latencies, 99),
        "ttft_p50_s": percentile(ttfts, 50) if mode == "stream" else None,
        "ttft_p99_s": percentile(ttfts, 99) if mode == "stream" else None,
        "added_p50_s": None, "added_p99_s": None,
        "cpu_s_per_request": cpu_s / len(records), "rss_mb": rss_mb, "requests": records,
    }


def add_added_latency(cells: list[dict]) -> None:
    """Set each non-direct cell's added_p50_s / added_p99_s = its latency percentile minus the direct
    cell's at the same mode and concurrency (left None when that direct cell is missing)."""
    direct = {(c["mode"], c["concurrency"]): c for c in cells if c["system"] == "direct"}
    for cell in cells:
        base = direct.get((cell["mode"], cell["concurrency"]))
        if cell["system"] != "direct" and base is not None:
            cell["added_p50_s"] = cell["latency_p50_s"] - base["latency_p50_s"]
            cell["added_p99_s"] = cell["latency_p99_s"] - base["latency_p99_s"]


def _ratio(ours: float | None, theirs: float | None) -> float | None:
    return None if ours is None or not theirs or theirs <= 0 else ours / theirs


def compute_gateway_ratios(cells: list[dict]) -> list[dict]:
    """Ours (link, link-lean) against LiteLLM's proxy, per mode and concurrency: added latency p50 and p99
    (ours / LiteLLM's: below 1 is better; None when LiteLLM added nothing measurable), requests/s (ours /
    LiteLLM's: above 1 is better), ours' server CPU per request (ms), and `meets_target` against TARGETS and, at
    concurrency 1, CPU_TARGETS_MS."""
    by = {(c["system"], c["mode"], c["concurrency"]): c for c in cells}
    ratios = []
    for (system, mode, concurrency), ours in by.items():
        theirs = by.get(("litellm", mode, concurrency))
        if system not in TARGETS or theirs is None:
            continue
        row = {"system": system, "mode": mode, "concurrency": concurrency,
               "added_p50_ratio": _ratio(ours["added_p50_s"], theirs["added_p50_s"]),
               "added_p99_ratio": _ratio(ours["added_p99_s"], theirs["added_p99_s"]),
               "requests_per_s_ratio": ours["requests_per_s"] / theirs["requests_per_s"]}
        max_added, min_rate = TARGETS[system]
        checks = [row["requests_per_s_ratio"] >= min_rate]
        if max_added is not None:
            checks += [r is not None and r <= max_added for r in (row["added_p50_ratio"], row["added_p99_ratio"])]
        cpu = cpu_target_ms(ours)
        row["cpu_ms_per_request"] = 1000 * ours["cpu_s_per_request"]
        if cpu is not None:
            checks.append(row["cpu_ms_per_request"] <= cpu)
        row["meets_target"] = all(checks)
        ratios.append(row)
    return ratios


def render_gateway_report(result: dict):
    """A Rich table of the cells and one of the ratios against LiteLLM's proxy."""
    from rich.console import Group
    from rich.markup import escape
    from rich.table import Table

    machine, pins = result["machine"], result["pinning"]
    def cores(key: str) -> str:
        return ",".join(map(str, pins[key]))

    where = (f"taskset: load generator on core {cores('loadgen')}, server under test on core {cores('server')}, "
             f"mock backend sharing core {cores('mock')} with the load generator") if pins else "not pinned (taskset or a second core is missing)"
    caption = [f"{machine['cpu_count']} CPUs; {where}",
               f"load average (1 min) {machine['load_average_before'][0]:.2f} before, "
               f"{machine.get('load_average_after', [float('nan')])[0]:.2f} after",
               "added = latency percentile - direct's at the same mode and concurrency; CPU = server process CPU / request"]
    caption += [f"{system}: {escape(reason)}" for system, reason in {**result["skipped"], **result["errors"]}.items()]
    table = Table(title=f"Gateway overhead: {result['num_requests']} requests per cell after {result['num_warmup']} warm-up, "
                        "chat completions against an instant mock backend", caption="\n".join(caption))
    for header in ("system", "mode", "conc.", "req/s", "p50 ms", "p99 ms", "added p50 ms", "added p99 ms",
                   "TTFT p50 ms", "CPU ms/req", "RSS MiB", "errors"):
        table.add_column(header, justify="left" if header in ("system", "mode") else "right")
    for c in result["cells"]:
        table.add_row(c["system"], c["mode"], str(c["concurrency"]), f"{c['requests_per_s']:.0f}", ms(c["latency_p50_s"], 2),
                      ms(c["latency_p99_s"], 2), ms(c["added_p50_s"], 2), ms(c["added_p99_s"], 2), ms(c["ttft_p50_s"], 2),
                      ms(c["cpu_s_per_request"], 2), f"{c['rss_mb']:.0f}", str(c["num_errors"]))
    if not result["ratios"]:
        return Group(table, "No ratios: LiteLLM's proxy was not measured in this run.")
    ratios = Table(title="Ours / LiteLLM's proxy (added latency: below 1 is better; req/s: above 1 is better)")
    for header in ("system", "mode", "conc.", "added p50", "added p99", "req/s", "target"):
        ratios.add_column(header, justify="left" if header in ("system", "mode") else "right")

    def x(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}x"

    for r in result["ratios"]:
        target = describe_target(r["system"], r["mode"], r["concurrency"])
        ratios.add_row(r["system"], r["mode"], str(r["concurrency"]), x(r["added_p50_ratio"]), x(r["added_p99_ratio"]),
                       x(r["requests_per_s_ratio"]), f"{'met' if r['meets_target'] else 'missed'} ({target})")
    return Group(table, ratios)
