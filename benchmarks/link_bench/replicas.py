"""Replica benchmark: cache-aware against fewest-outstanding routing over N engine replicas behind the gateway.

    link bench replicas --replicas 2 --json replicas.json
    run_replicas_benchmark(num_replicas=2, num_requests=40, repetitions=3)      # -> dict, see below

Processes (benchmarks/link_bench/replica_fleet.py): N `link engine serve` replicas of `model`, each pinned to its own
equal share of the cores with as many threads, the engine's default KV cache (`--kv-cache-mb` to change it), and two
`link serve` gateways over them, one per routing (`replica_routing: cache_aware`, `fewest_outstanding`).

Workloads (benchmarks/link_bench/replica_workloads.py): "shared_prefix", MMLU 5-shot prompts of all 57 subjects
(each subject's header and 5 shots shared by its prompts; subjects drawn uniformly, seeded); "no_prefix", prompts of 6
MMLU questions from all subjects with nothing in common. Every request is a streamed chat completion through the
gateway, greedy, `ignore_eos`, `max_tokens` tokens (16 by default: prefill dominates, as in few-shot traffic).

Method:
1. Capacity, per workload: a closed loop of `capacity_requests` requests from C = 2 clients per replica through the
   fewest-outstanding gateway; capacity = answered requests / wall s. It errs low by the run's tail (the last
   requests run with fewer than C in flight), less the more requests it has. (Counting only the answers before
   the tail, k / the k-th end with k = answered - C, errs lower: the first k answers end with C requests still
   part done; 0.090 against 0.157 req/s on the same 8 requests in one run.) Both routings then get the same
   offered load, `rate_fraction` (0.8) x that capacity: the baseline's, so the baseline is the one near saturation.
2. Cells: `repetitions` rounds; in each, per workload, both routings replay the same `num_requests` prompts (seed
   `seed + round`) on the same Poisson schedule (benchmarks/link_bench/replica_load.py: open loop), the routing order
   alternating between rounds (cache_aware first in rounds 1, 3, ...; fewest_outstanding first in 2, 4, ...) so a
   drift in the machine's load does not favour one routing.
3. Cold caches without reloading the models: every cell's prompts begin with the cell's own tag ("[cell 07] "), so
   their KV blocks, chained over every token before them, match none of an earlier cell's, and neither do the
   gateway's chained prefix hashes; only the chat template's fixed system prompt (its first KV block) stays cached,
   for every request alike. It works as a flush between cells, and costs nothing, where restarting the replicas
   would reload every model for every cell.

Returns (JSON-ready): "cache_aware" and "fewest_outstanding": the shared-prefix workload's pooled rows
(benchmarks/link_bench/replicas_report.py: output_tok_per_s, requests_per_s, ttft_p50_s, ttft_p99_s, latency_p50_s,
prefix_hit_rate, requests, errors, per_repetition, ...); "no_prefix": the same pair for the other workload; "pooled"
(every pooled row), "cells" (every cell, every request), "ratios" ({workload: cache_aware / fewest_outstanding}),
"acceptance" (the targets cache-aware routing must meet to become the default), "capacity", "settings", "machine",
"cpu", "pinning" and "kv_cache".
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Callable, Sequence

from benchmarks.link_bench.cpuinfo import read_cpu_info
from benchmarks.link_bench.replica_fleet import ROUTINGS, Fleet, plan_cores
from benchmarks.link_bench.replica_load import closed_loop, open_loop
from benchmarks.link_bench.replica_workloads import WORKLOADS, Prompt, poisson_arrivals, workload_prompts
from benchmarks.link_bench.replicas_report import check_acceptance, compute_ratios, pool_cells, summarize_cell
from benchmarks.link_bench.workload import default_data_dir

CAPACITY_CLIENTS_PER_REPLICA = 2  # closed-loop clients per replica when measuring capacity: each engine always has work


def tagged(prompts: Sequence[Prompt], cell: int) -> list[str]:
    """The prompts' texts, each starting with cell `cell`'s tag (see the module docstring, step 3)."""
    return [f"[cell {cell:02d}] {p.text}" for p in prompts]


def routing_order(repetition: int) -> tuple[str, ...]:
    """The routings in the order round `repetition` (1-based) runs them: alternating which goes first."""
    return ROUTINGS if repetition % 2 == 1 else tuple(reversed(ROUTINGS))


def run_replicas_benchmark(
    num_replicas: int = 2,
    model: str = "smollm2-135m-instruct",
    num_requests: int = 40,
    repetitions: int = 3,
    max_tokens: int = 16,
    rate_fraction: float = 0.8,
    capacity_requests: int | None = None,
    kv_cache_mb: int | None = None,
    workloads: Sequence[str] = WORKLOADS,
    seed: int = 0,
    data_dir: str | Path | None = None,
    pin: bool = True,
    progress: Callable[[str], None] = lambda message: None,
) -> dict:
    """Measure both routings on each workload (see the module docstring); `capacity_requests` defaults to
    max(4 x num_replicas, num_requests // 2): at least 2C.

    Raises:
        ValueError: non-positive sizes, a rate fraction outside (0, 2], or an unknown workload.
        FileNotFoundError: the MMLU data is missing under `data_dir`.
        RuntimeError: a server did not start, or a capacity run answered nothing (the gateway's output attached).
    """
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown or not workloads:
        raise ValueError(f"unknown workloads {unknown}; choose from {', '.join(WORKLOADS)}")
    if min(num_replicas, num_requests, repetitions, max_tokens) < 1 or not 0 < rate_fraction <= 2:
        raise ValueError("replicas, requests, repetitions and max_tokens must be positive and rate_fraction in (0, 2]")
    capacity_requests = capacity_requests or max(4 * num_replicas, num_requests // 2)
    data_dir = Path(data_dir) if data_dir else default_data_dir()
    workloads = [w for w in WORKLOADS if w in workloads]
    capacity_prompts = {w: workload_prompts(w, data_dir, capacity_requests, seed + 1000) for w in workloads}
    rounds = {(w, rep): workload_prompts(w, data_dir, num_requests, seed + rep) for w in workloads
              for rep in range(1, repetitions + 1)}
    plan = plan_cores(os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1),
                      num_replicas, pin=pin)
    cpu = read_cpu_info()
    progress(f"CPU: {cpu.summary}; cores {plan.to_dict()}")
    concurrency = CAPACITY_CLIENTS_PER_REPLICA * num_replicas
    result = {
        "settings": {"num_replicas": num_replicas, "model": model, "num_requests": num_requests, "repetitions": repetitions,
                     "max_tokens": max_tokens, "rate_fraction": rate_fraction, "capacity_requests": capacity_requests,
                     "capacity_concurrency": concurrency, "kv_cache_mb": kv_cache_mb, "workloads": workloads, "seed": seed},
        "machine": {"cpu_count": os.cpu_count(), "load_average_before": list(os.getloadavg())},
        "cpu": {**cpu.to_dict(), "summary": cpu.summary}, "pinning": plan.to_dict(), "capacity": {}, "cells": [],
    }
    cell_index = 0
    progress(f"starting {num_replicas} engines and {len(ROUTINGS)} gateways")
    with Fleet(model, plan, kv_cache_mb) as fleet:
        fleet.warm_up()
        state = fleet.engine_states()[0]
        result["kv_cache"] = {"num_blocks": state["num_blocks"], "block_size": state["block_size"],
                              "tokens": state["num_blocks"] * state["block_size"]}

        def measure(routing: str, texts: list[str], offsets: list[float] | None) -> tuple[list, float, list, list]:
            before = fleet.engine_states()
            url = fleet.urls[routing]
            run = (open_loop(url, fleet.headers, fleet.model_name, texts, offsets, max_tokens) if offsets is not None
                   else closed_loop(url, fleet.headers, fleet.model_name, texts, concurrency, max_tokens))
            records, wall_s = asyncio.run(run)
            return records, wall_s, before, fleet.engine_states()

        rates = {}
        for workload in workloads:
            cell_index += 1
            progress(f"capacity of {workload}: {capacity_requests} requests, {concurrency} clients")
            records, wall_s, before, after = measure("fewest_outstanding", tagged(capacity_prompts[workload], cell_index), None)
            row = summarize_cell(workload, "fewest_outstanding", 0, records, wall_s, before, after, None,
                                 [p.group for p in capacity_prompts[workload]])
            capacity = row["requests_per_s"]
            if not capacity:
                raise RuntimeError(f"the capacity run of {workload} answered nothing ({row['error_samples']}); gateway output:\n"
                                   f"{fleet.gateway_output('fewest_outstanding')}")
            result["capacity"][workload] = row
            rates[workload] = rate_fraction * capacity
            progress(f"capacity of {workload}: {capacity:.3f} req/s -> offered {rates[workload]:.3f} req/s")
        for rep in range(1, repetitions + 1):
            for workload in workloads:
                offsets = poisson_arrivals(rates[workload], num_requests, seed=seed * 1000 + rep)
                for routing in routing_order(rep):
                    cell_index += 1
                    progress(f"round {rep}, {workload}, {routing}: {num_requests} requests at {rates[workload]:.3f} req/s")
                    records, wall_s, before, after = measure(routing, tagged(rounds[workload, rep], cell_index), offsets)
                    cell = summarize_cell(workload, routing, rep, records, wall_s, before, after, rates[workload],
                                          [p.group for p in rounds[workload, rep]])
                    if cell["errors"]:
                        cell["gateway_output"] = fleet.gateway_output(routing)
                    result["cells"].append(cell)
                    progress(f"  {cell['output_tok_per_s']:.2f} tok/s, TTFT p50 {cell['ttft_p50_s'] or float('nan'):.2f} s, "
                             f"hit rate {cell['prefix_hit_rate'] or 0:.3f}, {cell['errors']} errors")
    result["machine"]["load_average_after"] = list(os.getloadavg())
    return finish(result, workloads)


def finish(result: dict, workloads: Sequence[str]) -> dict:
    """Add the pooled rows, the ratios, the acceptance check and the top-level keys to `result` (its "cells" and
    "capacity" filled in); returns it."""
    pooled = {(w, r): pool_cells([c for c in result["cells"] if (c["workload"], c["routing"]) == (w, r)])
              for w in workloads for r in ROUTINGS}
    result["pooled"] = list(pooled.values())
    result["ratios"] = {w: compute_ratios(pooled[w, "cache_aware"], pooled[w, "fewest_outstanding"]) for w in workloads}
    num_errors = sum(c["errors"] for c in result["cells"]) + sum(c["errors"] for c in result["capacity"].values())
    result["acceptance"] = check_acceptance(result["ratios"], num_errors)
    for workload in workloads:
        pair = {r: {k: v for k, v in pooled[workload, r].items() if k not in ("workload", "routing")} for r in ROUTINGS}
        if workload == "shared_prefix":
            result.update(pair)
        else:
            result[workload] = pair
    return result
