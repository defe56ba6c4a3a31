"""The replica benchmark's numbers: one summary per measured cell, pooled per (workload, routing), the ratios
cache-aware / fewest-outstanding, the acceptance check (the targets cache-aware routing must meet to become the
default), and the Rich tables.

    cell = summarize_cell("shared_prefix", "cache_aware", 1, records, wall_s, before, after, offered_rate_per_s=0.2,
                          groups=[p.group for p in prompts])
    pooled = pool_cells([cell, ...])              # the repetitions of one (workload, routing) together
    ratios = compute_ratios(pooled_ca, pooled_fo)  # {"output_tok_per_s": 1.3, "ttft_p50_s": 0.7, ...}

Per cell: output tokens/s and requests/s over its wall time (first send -> last answer); TTFT and latency
percentiles over its answered requests (numpy's linear interpolation, `timing.percentile`); the prefix-cache hit
rate = the growth of the engines' `prefix_cache_hits` / the growth of their `prefix_cache_queries` over the cell
(prompt tokens whose KV came from the cache / prompt tokens, summed over the replicas, from `GET /v1/engine/state`);
each replica's share of the cell's prompt tokens (the balance); `repeat_fraction` = the fraction of requests whose
prefix group (MMLU subject) was already sent earlier in the cell: the most requests any routing could serve from a
cached few-shot prefix. Pooled: sums of tokens, requests and wall times (so tokens/s is a time-weighted mean),
percentiles over every answered request of every repetition, hits / queries over all of them.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Sequence

from benchmarks.link_bench.replica_load import ChatRecord
from benchmarks.link_bench.timing import percentile

# acceptance: shared prefixes, throughput >= 1.5x or TTFT p50 <= 0.6x; no shared prefix, throughput >= 0.9x
SHARED_THROUGHPUT_RATIO, SHARED_TTFT_RATIO, NO_PREFIX_THROUGHPUT_RATIO = 1.5, 0.6, 0.9
RATIO_KEYS = ("output_tok_per_s", "requests_per_s", "ttft_p50_s", "ttft_p99_s", "latency_p50_s", "prefix_hit_rate")


def repeat_fraction(groups: Sequence[str]) -> float:
    """Fraction of `groups` equal to an earlier one (0.0 for none or an empty list)."""
    return (len(groups) - len(set(groups))) / len(groups) if groups else 0.0


def summarize_cell(workload: str, routing: str, repetition: int, records: list[ChatRecord], wall_s: float,
                   before: list[dict], after: list[dict], offered_rate_per_s: float | None, groups: Sequence[str]) -> dict:
    """One measured cell (see the module docstring); `before`/`after`: each engine's state around it."""
    ok = [r for r in records if r.is_ok]
    hits = [a["prefix_cache_hits"] - b["prefix_cache_hits"] for b, a in zip(before, after)]
    queries = [a["prefix_cache_queries"] - b["prefix_cache_queries"] for b, a in zip(before, after)]
    num_tokens = sum(r.num_output_tokens for r in ok)
    return {
        "workload": workload, "routing": routing, "repetition": repetition, "requests": len(records),
        "errors": len(records) - len(ok), "error_samples": sorted({r.error for r in records if not r.is_ok})[:3],
        "offered_rate_per_s": offered_rate_per_s, "duration_s": wall_s, "output_tokens": num_tokens,
        "output_tok_per_s": num_tokens / wall_s if wall_s > 0 else None,
        "requests_per_s": len(ok) / wall_s if wall_s > 0 else None,
        "ttft_p50_s": percentile([r.ttft_s for r in ok], 50), "ttft_p99_s": percentile([r.ttft_s for r in ok], 99),
        "latency_p50_s": percentile([r.latency_s for r in ok], 50),
        "mean_prompt_tokens": sum(r.num_prompt_tokens for r in ok) / len(ok) if ok else None,
        "prefix_cache_hits": sum(hits), "prefix_cache_queries": sum(queries),
        "prefix_hit_rate": sum(hits) / sum(queries) if sum(queries) else None,
        "replica_prompt_token_shares": [q / sum(queries) if sum(queries) else None for q in queries],
        "repeat_fraction": repeat_fraction(groups),
        "max_send_lag_s": max((r.start_s - r.scheduled_s for r in records), default=0.0),
        "records": [asdict(r) for r in records],
    }


def pool_cells(cells: list[dict]) -> dict:
    """The repetitions of one (workload, routing) pooled (see the module docstring), with `per_repetition` summaries.

    Raises:
        ValueError: no cells.
    """
    if not cells:
        raise ValueError("no cells to pool")
    ok = [r for c in cells for r in c["records"] if r["error"] is None]
    wall = sum(c["duration_s"] for c in cells)
    tokens = sum(c["output_tokens"] for c in cells)
    hits, queries = sum(c["prefix_cache_hits"] for c in cells), sum(c["prefix_cache_queries"] for c in cells)
    keep = ("repetition", "requests", "errors", "output_tok_per_s", "requests_per_s", "ttft_p50_s", "ttft_p99_s",
            "prefix_hit_rate", "repeat_fraction", "replica_prompt_token_shares")
    return {
        "workload": cells[0]["workload"], "routing": cells[0]["routing"], "repetitions": len(cells),
        "requests": sum(c["requests"] for c in cells), "errors": sum(c["errors"] for c in cells),
        "offered_rate_per_s": cells[0]["offered_rate_per_s"], "duration_s": wall, "output_tokens": tokens,
        "output_tok_per_s": tokens / wall if wall > 0 else None, "requests_per_s": len(ok) / wall if wall > 0 else None,
        "ttft_p50_s": percentile([r["ttft_s"] for r in ok], 50), "ttft_p99_s": percentile([r["ttft_s"] for r in ok], 99),
        "latency_p50_s": percentile([r["latency_s"] for r in ok], 50),
        "mean_prompt_tokens": sum(r["num_prompt_tokens"] for r in ok) / len(ok) if ok else None,
        "prefix_cache_hits": hits, "prefix_cache_queries": queries, "prefix_hit_rate": hits / queries if queries else None,
        "repeat_fraction": sum(c["repeat_fraction"] for c in cells) / len(cells),
        "per_repetition": [{k: c[k] for k in keep} for c in cells],
    }


def _ratio(ours: float | None, theirs: float | None) -> float | None:
    return ours / theirs if ours is not None and theirs else None


def compute_ratios(cache_aware: dict, fewest: dict) -> dict:
    """cache_aware / fewest_outstanding for each of RATIO_KEYS (None where either is missing or the divisor is 0),
    and `per_repetition`: the same ratios of throughput and TTFT p50 within each repetition (paired)."""
    ratios: dict = {key: _ratio(cache_aware.get(key), fewest.get(key)) for key in RATIO_KEYS}
    ratios["per_repetition"] = [
        {"repetition": a["repetition"], "output_tok_per_s": _ratio(a["output_tok_per_s"], b["output_tok_per_s"]),
         "ttft_p50_s": _ratio(a["ttft_p50_s"], b["ttft_p50_s"])}
        for a, b in zip(cache_aware["per_repetition"], fewest["per_repetition"])]
    return ratios


def check_acceptance(ratios: dict[str, dict], num_errors: int) -> dict:
    """The acceptance targets against `ratios` ({workload: compute_ratios(...)}) and the run's errors; a workload that
    was not measured gives None for its check, and `met` is True only when every check is True."""
    shared, no_prefix = ratios.get("shared_prefix"), ratios.get("no_prefix")
    shared_ok = None if shared is None else bool(
        (shared["output_tok_per_s"] or 0) >= SHARED_THROUGHPUT_RATIO
        or (shared["ttft_p50_s"] is not None and shared["ttft_p50_s"] <= SHARED_TTFT_RATIO))
    no_prefix_ok = None if no_prefix is None else bool((no_prefix["output_tok_per_s"] or 0) >= NO_PREFIX_THROUGHPUT_RATIO)
    checks = {"shared_prefix": shared_ok, "no_prefix": no_prefix_ok, "no_errors": num_errors == 0}
    return {**checks, "met": all(v is True for v in checks.values()),
            "targets": f"shared prefix: throughput >= {SHARED_THROUGHPUT_RATIO}x or TTFT p50 <= {SHARED_TTFT_RATIO}x; "
                       f"no shared prefix: throughput >= {NO_PREFIX_THROUGHPUT_RATIO}x; 0 errors"}


def _s(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def render_replicas_report(result: dict):
    """Rich tables: pooled rows per (workload, routing), every cell, the ratios and the acceptance check."""
    from rich.console import Group
    from rich.markup import escape
    from rich.table import Table

    s, machine, kv = result["settings"], result["machine"], result["kv_cache"]
    capacity = ", ".join(f"{w} {c['requests_per_s']:.3f} req/s" for w, c in result["capacity"].items())
    caption = [f"CPU: {result['cpu']['summary']}; {machine['cpu_count']} CPUs, cores {escape(str(result['pinning']))}",
               f"load average (1 min) {machine['load_average_before'][0]:.2f} before, "
               f"{machine.get('load_average_after', [float('nan')])[0]:.2f} after",
               f"KV cache per replica: {kv['num_blocks']} blocks x {kv['block_size']} tokens = {kv['tokens']} tokens",
               f"capacity (closed loop, fewest_outstanding, {s['capacity_concurrency']} clients): {capacity}; "
               f"offered load {s['rate_fraction']:g} x capacity, Poisson",
               "cold caches: each cell's prompts start with its own tag, so no KV block or gateway prefix entry of an "
               "earlier cell can match"]
    pooled = Table(title=f"Replica routing: {s['num_replicas']} replicas of {s['model']}, {s['num_requests']} requests x "
                         f"{s['repetitions']} repetitions per row, max_tokens {s['max_tokens']}", caption="\n".join(caption))
    for header in ("workload", "routing", "requests", "errors", "offered req/s", "req/s", "out tok/s", "TTFT p50 s",
                   "TTFT p99 s", "latency p50 s", "prefix hit rate", "repeats", "prompt tok"):
        pooled.add_column(header, justify="left" if header in ("workload", "routing") else "right")
    for row in result["pooled"]:
        pooled.add_row(row["workload"], row["routing"], str(row["requests"]), str(row["errors"]),
                       _s(row["offered_rate_per_s"], 3), _s(row["requests_per_s"], 3), _s(row["output_tok_per_s"]),
                       _s(row["ttft_p50_s"]), _s(row["ttft_p99_s"]), _s(row["latency_p50_s"]), _s(row["prefix_hit_rate"], 3),
                       _s(row["repeat_fraction"]), _s(row["mean_prompt_tokens"], 0))
    cells = Table(title="Every cell, in the order run")
    for header in ("rep", "workload", "routing", "errors", "out tok/s", "TTFT p50 s", "TTFT p99 s", "hit rate", "shares"):
        cells.add_column(header, justify="left" if header in ("workload", "routing") else "right")
    for c in result["cells"]:
        shares = "/".join("-" if v is None else f"{v:.2f}" for v in c["replica_prompt_token_shares"])
        cells.add_row(str(c["repetition"]), c["workload"], c["routing"], str(c["errors"]), _s(c["output_tok_per_s"]),
                      _s(c["ttft_p50_s"]), _s(c["ttft_p99_s"]), _s(c["prefix_hit_rate"], 3), shares)
    ratios = Table(title="cache_aware / fewest_outstanding (throughput: above 1 is better; TTFT: below 1 is better)")
    for header in ("workload", "out tok/s", "TTFT p50", "TTFT p99", "hit rate", "per rep: tok/s | TTFT p50"):
        ratios.add_column(header, justify="left" if header == "workload" else "right")
    for workload, r in result["ratios"].items():
        per_rep = "  ".join(f"{_x(p['output_tok_per_s'])}|{_x(p['ttft_p50_s'])}" for p in r["per_repetition"])
        ratios.add_row(workload, _x(r["output_tok_per_s"]), _x(r["ttft_p50_s"]), _x(r["ttft_p99_s"]),
                       _x(r["prefix_hit_rate"]), per_rep)
    a = result["acceptance"]
    verdict = (f"acceptance: {'met' if a['met'] else 'missed'} (shared prefix {a['shared_prefix']}, no prefix "
               f"{a['no_prefix']}, no errors {a['no_errors']}); targets: {a['targets']}")
    return Group(pooled, cells, ratios, verdict)
