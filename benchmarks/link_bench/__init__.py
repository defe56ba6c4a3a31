"""Benchmarks of the platform (`link bench ...`), one idea per module:

    workload.py      the serving benchmark's prompts (AlpacaEval + MT-Bench) rendered with a chat template
    workloads.py     the repetitive and mixed workloads; measured requests as a replayable traffic mix
    timing.py        per-request records, percentiles, timed calls
    processes.py     servers in subprocesses pinned with taskset, their CPU time and RSS; spawned workers
    serving.py       `link bench serving`: our engine server against transformers and llama.cpp
    link_server.py   our engine server under benchmark: fresh $LINK_HOME, closed loops, warm-up, prefill
    baselines.py     the transformers and in-process engine workers of the serving benchmark
    llama_session.py llama.cpp in a worker that stays up, so its phases interleave with our server's
    prefill.py       the prefill phase: long prompts, prefill tokens/s
    cpuinfo.py       the CPU's name and instruction-set flags; llama.cpp's CMake flags for it
    report.py        serving summaries, ratios and tables; `show_and_save` (print + JSON) for every benchmark
    comparison.py    link against llama.cpp, metric by metric, with ratios ours / llama.cpp
    mock_backend.py  a minimal, instant OpenAI-compatible backend (`python -m benchmarks.link_bench.mock_backend`)
    loadgen.py       a closed-loop httpx load generator in its own process (`python -m benchmarks.link_bench.loadgen`)
    gateway.py       `link bench gateway`: the gateway's overhead over a direct call, next to LiteLLM's proxy
    gateway_report.py  the gateway benchmark's cells, added latency, ratios and tables
    replicas.py      `link bench replicas`: cache-aware against fewest-outstanding routing over N engine replicas
    replica_workloads.py  MMLU 5-shot prompts (shared prefixes), prompts sharing nothing, Poisson arrival times
    replica_fleet.py N engines pinned to disjoint cores and a gateway per routing over them
    replica_load.py  open-loop (Poisson) and closed-loop streamed chat clients through the gateway
    replicas_report.py  the replica benchmark's cells, pooled rows, ratios, acceptance check and tables
    replica_cache_replay.py  the prefix-cache hits each routing can get, prompts replayed through the real router
                     and block managers without timing (`python -m benchmarks.link_bench.replica_cache_replay`)
"""

from benchmarks.link_bench.report import compute_ratios, render_report, show_and_save, summarize
from benchmarks.link_bench.serving import SYSTEMS, run_serving_benchmark
from benchmarks.link_bench.timing import TimedRequest, percentile, record_from_times, time_call
from benchmarks.link_bench.workload import default_data_dir, load_workload, render_prompts

__all__ = ["SYSTEMS", "TimedRequest", "compute_ratios", "default_data_dir", "load_workload", "percentile",
           "record_from_times", "render_prompts", "render_report", "run_serving_benchmark", "show_and_save",
           "summarize", "time_call"]
