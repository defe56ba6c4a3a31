"""`link bench serving|gateway|replicas`: the platform's benchmarks, over the library in benchmarks/link_bench/.

    link bench serving --json out.json      serving throughput and latency against transformers and llama.cpp
    link bench serving -s link -s llama-cpp --fresh      the comparison with llama.cpp: decode, prefill, ITL, memory
    link bench gateway --json out.json      the gateway's overhead over a direct call, next to LiteLLM's proxy
    link bench replicas --replicas 2 --json out.json     cache-aware against fewest-outstanding replica routing

Each command prints a report and writes every request's timings with `--json`; benchmarks/link_bench/serving.py
gateway.py and replicas.py say what each system runs and what each number measures.
"""

from __future__ import annotations

import typer
from rich.console import Console

from cli.errors import fail

bench_app = typer.Typer(help="Benchmarks of the platform.", no_args_is_help=True)
err_console = Console(stderr=True)


@bench_app.command("serving")
def bench_serving(
    model: str = typer.Option("smollm2-135m-instruct", "--model", "-m", help="A GGUF model name from `link models`."),
    concurrency: list[int] = typer.Option([1, 4, 16], "--concurrency", "-c", help="Concurrent clients; repeat for several levels."),
    num_prompts: int = typer.Option(32, help="Requests per concurrency level."),
    max_tokens: int = typer.Option(64, help="Output tokens of every request (EOS ignored)."),
    system: list[str] = typer.Option(["link", "transformers", "llama-cpp"], "--system", "-s",
                                     help="link, transformers, llama-cpp, link-engine (our engine in-process, as llama-cpp); repeat."),
    seed: int = typer.Option(0, help="Seed of the prompt shuffle."),
    data_dir: str = typer.Option(None, help="Shared data folder (default: $LINK_DATASETS_DIR or ../shared/data)."),
    dtype: str = typer.Option("float32", help="float32 or bfloat16, for link and transformers."),
    kv_cache_mb: int = typer.Option(256, help="KV cache memory of the link server in MiB."),
    max_num_seqs: int = typer.Option(32, help="Sequences in one batch at most (link server)."),
    json_path: str = typer.Option(None, "--json", help="Also write the full results (every request) to this JSON file."),
    workload: str = typer.Option("default", help="default, repetitive (answers quote the prompt) or mixed (bursts of 1-16; link only)."),
    save_mix: str = typer.Option(None, "--save-mix", help="Write link's request shapes as a mix JSONL for `link compile tune-config`."),
    prefill_tokens: int = typer.Option(512, help="Prompt tokens of each prefill-phase request (max_tokens=1; 0: no prefill phase)."),
    prefill_prompts: int = typer.Option(8, help="Requests of the prefill phase (link and llama-cpp)."),
    fresh: bool = typer.Option(False, "--fresh", help="Run the link server with an empty temporary LINK_HOME (model cache linked in)."),
    warmup_s: float = typer.Option(None, "--warmup-s", help="Seconds of warm-up traffic to link before it is measured "
                                                            "(default 180 with --fresh, else 0)."),
) -> None:
    """Serving throughput and latency of our engine against transformers and llama.cpp on real prompts."""
    from serving import ServingError

    from benchmarks.link_bench import render_report, run_serving_benchmark, show_and_save

    try:
        result = run_serving_benchmark(model, concurrency, num_prompts, max_tokens, system, seed, data_dir, dtype,
                                       kv_cache_mb, max_num_seqs, progress=lambda message: err_console.log(message, markup=False),
                                       workload=workload, save_mix=save_mix, prefill_tokens=prefill_tokens,
                                       num_prefill_prompts=prefill_prompts, fresh=fresh, warmup_s=warmup_s)
    except (ServingError, ValueError, FileNotFoundError) as exc:
        raise fail(exc) from None
    show_and_save(render_report(result), result, json_path)


@bench_app.command("gateway")
def bench_gateway(
    concurrency: list[int] = typer.Option([1, 8, 32], "--concurrency", "-c", help="Concurrent clients; repeat for several levels."),
    requests: int = typer.Option(200, "--requests", help="Measured requests per cell (system, mode, concurrency)."),
    warmup: int = typer.Option(20, "--warmup", help="Warm-up requests before each cell (at least one per client)."),
    system: list[str] = typer.Option(["direct", "link", "link-lean", "litellm"], "--system", "-s",
                                     help="direct, link, link-lean, litellm; repeat (direct always runs)."),
    mode: list[str] = typer.Option(["whole", "stream"], "--mode", help="whole, stream; repeat."),
    pin: bool = typer.Option(True, "--pin/--no-pin", help="Pin load generator and server to different cores with taskset."),
    json_path: str = typer.Option(None, "--json", help="Also write the full results (every request) to this JSON file."),
) -> None:
    """The gateway's overhead over a direct call to an instant mock backend, next to LiteLLM's proxy."""
    from benchmarks.link_bench import show_and_save
    from benchmarks.link_bench.gateway import run_gateway_benchmark
    from benchmarks.link_bench.gateway_report import render_gateway_report

    try:
        result = run_gateway_benchmark(concurrency, requests, warmup, system, mode, pin=pin,
                                       progress=lambda message: err_console.log(message, markup=False))
    except ValueError as exc:
        raise fail(exc) from None
    show_and_save(render_gateway_report(result), result, json_path)


@bench_app.command("replicas")
def bench_replicas(
    replicas: int = typer.Option(2, "--replicas", "-n", min=1, help="Engine replicas (`link engine serve`), each on its share of the cores."),
    model: str = typer.Option("smollm2-135m-instruct", "--model", "-m", help="The replicas' model, a name from `link models`."),
    requests: int = typer.Option(40, "--requests", min=1, help="Requests per cell (workload, routing, repetition)."),
    repetitions: int = typer.Option(3, "--repetitions", min=1, help="Interleaved rounds of both routings per workload."),
    max_tokens: int = typer.Option(16, "--max-tokens", min=1, help="Output tokens of every request (EOS ignored)."),
    rate_fraction: float = typer.Option(0.8, "--rate-fraction", help="Poisson arrival rate as a fraction of the measured capacity."),
    capacity_requests: int = typer.Option(None, "--capacity-requests", min=1,
                                          help="Requests of each closed-loop capacity run (default max(4 x replicas, requests / 2))."),
    kv_cache_mb: int = typer.Option(None, "--kv-cache-mb", min=1, help="KV cache of each replica in MiB (default: the engine's)."),
    workload: list[str] = typer.Option(["shared_prefix", "no_prefix"], "--workload", "-w",
                                       help="shared_prefix (MMLU 5-shot), no_prefix; repeat."),
    seed: int = typer.Option(0, help="Seed of the prompt draws and the arrival times."),
    data_dir: str = typer.Option(None, help="Shared data folder with mmlu/ (default: $LINK_DATASETS_DIR or ../shared/data)."),
    pin: bool = typer.Option(True, "--pin/--no-pin", help="Pin each replica to its own cores with taskset."),
    json_path: str = typer.Option(None, "--json", help="Also write the results ({\"cache_aware\": ..., \"fewest_outstanding\": ...}, "
                                                       "every cell and request) to this JSON file."),
) -> None:
    """Cache-aware against fewest-outstanding replica routing: N engines behind the gateway, Poisson load."""
    from benchmarks.link_bench import show_and_save
    from benchmarks.link_bench.replicas import run_replicas_benchmark
    from benchmarks.link_bench.replicas_report import render_replicas_report

    try:
        result = run_replicas_benchmark(replicas, model, requests, repetitions, max_tokens, rate_fraction, capacity_requests,
                                        kv_cache_mb, workload, seed, data_dir, pin,
                                        progress=lambda message: err_console.log(message, markup=False))
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        raise fail(exc) from None
    show_and_save(render_replicas_report(result), result, json_path)
