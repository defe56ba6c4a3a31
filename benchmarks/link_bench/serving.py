"""Serving benchmark: our engine behind its OpenAI server against `transformers` and llama.cpp, same GGUF.

    link bench serving --model smollm2-135m-instruct -c 1 -c 4 -c 16 --json out.json
    python benchmarks/bench_serving.py --json out.json
    run_serving_benchmark("smollm2-135m-instruct", concurrencies=(1, 4, 16))   # -> dict, see below

Workload (benchmarks/link_bench/workload.py): AlpacaEval instructions and MT-Bench first turns from the data
directory, shuffled with `seed`, each rendered as one user message with the model's chat template and
tokenized by our tokenizer, so every system gets the same prompt token ids. Concurrency level k takes
its own slice of `num_prompts` prompts (the same slice for every system), so the engine's prefix cache
never sees a prompt twice. Greedy decoding with EOS ignored: every request generates exactly
`max_tokens` tokens.

Systems, one after another (never overlapping), each in a process of its own:
- `link`: `link engine serve` as a subprocess, the server users run. This process is the client:
  `concurrency` asyncio clients (httpx) each send streamed `/v1/completions` requests (prompt as token
  ids, `ignore_eos`) back to back, a closed loop. TTFT = request sent -> first SSE chunk with text;
  output tokens from the final usage chunk. One server serves every level.
- `transformers` (benchmarks/link_bench/baselines.py): `AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)`
  in a spawned worker. At concurrency c, the prompts run as static batches of c through one `generate`
  each, left-padded; c=1 is one request at a time. Token times come from a stopping criterion that
  runs after every decode step.
- `llama-cpp`: llama-cpp-python (`pip install 'togetherlink[bench]'`), one request at a time on the same
  GGUF, reported at concurrency 1 only; skipped with a message when `llama_cpp` does not import.
- `link-engine`: our `LLMEngine` measured as llama-cpp is (a spawned worker, one request at a time, no
  HTTP, concurrency 1 only; stored kernel winners installed), for an engine-to-engine comparison: `link`
  also pays the server, the SSE stream and a client process on the same cores.

Workloads (`workload`, benchmarks/link_bench/workloads.py): "default" (above), "repetitive" (HumanEval code edits
and MT-Bench quote-summaries, whose answers repeat their prompt; closed loops like the default) and
"mixed" (bursts of 1 to 16 concurrent requests of the default prompts, `num_prompts` requests in all,
one row at concurrency 16; link only). `save_mix` writes the link rows' request shapes (lengths and
send times) as a JSONL mix for `link compile tune-config --mix`.

Per request: TTFT (s); ITL (s) = (last token time - first token time) / (tokens - 1); latency (s).
Per level (benchmarks/link_bench/report.py): output tokens/s and requests/s over the level's wall time (first
request sent -> last token), decode tokens/s per request = sum(tokens - 1) / sum(last - first), TTFT
and ITL p50/p99 over requests, peak RSS (MiB) of the system's process since it started (model loading
included): the server's `VmHWM` from /proc, the workers' `getrusage(RUSAGE_SELF).ru_maxrss`.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

from benchmarks.link_bench.baselines import engine_worker, llama_cpp_worker, transformers_worker
from benchmarks.link_bench.processes import ServerProcess, free_port, in_worker, peak_rss_mb_of
from benchmarks.link_bench.report import compute_ratios, summarize
from benchmarks.link_bench.timing import TimedRequest, record_from_times
from benchmarks.link_bench.workload import WARMUP_MESSAGE, default_data_dir, render_prompts
from benchmarks.link_bench.workloads import MAX_BURST, burst_plan, records_to_mix, workload_texts

SYSTEMS = ("link", "transformers", "llama-cpp", "link-engine")
ONE_AT_A_TIME = ("llama-cpp", "link-engine")  # systems measured at concurrency 1 only


def start_engine_server(model: str, dtype: str, kv_cache_mb: int, max_num_seqs: int) -> ServerProcess:
    """`link engine serve` in a subprocess on a free port; it starts loading at once."""
    port = free_port()
    return ServerProcess([sys.executable, "-m", "cli", "engine", "serve", "--model", model, "--port", str(port),
                          "--dtype", dtype, "--kv-cache-mb", str(kv_cache_mb), "--max-num-seqs", str(max_num_seqs)], port)


async def _stream_one(client, model: str, prompt_ids: list[int], max_tokens: int) -> TimedRequest:
    body = {"model": model, "prompt": prompt_ids, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    first = last = usage = None
    async with client.stream("POST", "/v1/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"engine server answered {response.status_code}: {(await response.aread()).decode()[:500]}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            usage = event.get("usage") or usage
            if event["choices"]:  # a text delta, or the final chunk carrying finish_reason
                last = time.perf_counter()
                if first is None and event["choices"][0]["text"]:
                    first = last
    if first is None or usage is None:
        raise RuntimeError("the stream ended without text or usage")
    return record_from_times(len(prompt_ids), usage["completion_tokens"], start, first, last)


async def _closed_loop(base_url: str, model: str, prompts: list[list[int]], concurrency: int, max_tokens: int) -> tuple[list[TimedRequest], float]:
    """`concurrency` clients, each sending its next request when the last one finished; (records, wall s)."""
    import httpx

    pending, records = list(reversed(prompts)), []
    async with httpx.AsyncClient(base_url=base_url, timeout=None, limits=httpx.Limits(max_connections=concurrency)) as client:

        async def user() -> None:
            while pending:
                records.append(await _stream_one(client, model, pending.pop(), max_tokens))

        start = time.perf_counter()
        await asyncio.gather(*(user() for _ in range(concurrency)))
        return records, time.perf_counter() - start


async def _bursts(base_url: str, model: str, prompts: list[list[int]], sizes: list[int], max_tokens: int) -> tuple[list[TimedRequest], float]:
    """Each burst's requests sent at once; the next burst when all of them finished; (records, wall s)."""
    import httpx

    records, pending = [], list(prompts)
    async with httpx.AsyncClient(base_url=base_url, timeout=None, limits=httpx.Limits(max_connections=max(sizes))) as client:
        start = time.perf_counter()
        for size in sizes:
            burst, pending = pending[:size], pending[size:]
            records += await asyncio.gather(*(_stream_one(client, model, p, max_tokens) for p in burst))
        return records, time.perf_counter() - start


def _bench_link(server: ServerProcess, model: str, warmup: list[int], slices: list[list[list[int]]],
                concurrencies: Sequence[int], max_tokens: int, bursts: list[int] | None = None) -> list[tuple]:
    server.wait_healthy()
    asyncio.run(_closed_loop(server.url, model, [warmup], 1, min(4, max_tokens)))
    if bursts:
        records, wall = asyncio.run(_bursts(server.url, model, slices[0], bursts, max_tokens))
        return [(records, wall, peak_rss_mb_of(server.pid))]
    levels = []
    for prompts, concurrency in zip(slices, concurrencies):
        records, wall = asyncio.run(_closed_loop(server.url, model, prompts, concurrency, max_tokens))
        levels.append((records, wall, peak_rss_mb_of(server.pid)))
    return levels


def run_serving_benchmark(
    model: str = "smollm2-135m-instruct",
    concurrencies: Sequence[int] = (1, 4, 16),
    num_prompts: int = 32,
    max_tokens: int = 64,
    systems: Sequence[str] = SYSTEMS,
    seed: int = 0,
    data_dir: str | Path | None = None,
    dtype: str = "float32",
    kv_cache_mb: int = 256,
    max_num_seqs: int = 32,
    progress: Callable[[str], None] = lambda message: None,
    workload: str = "default",
    save_mix: str | Path | None = None,
) -> dict:
    """Benchmark `systems` at each concurrency on `num_prompts` requests of `max_tokens` tokens per level
    (the mixed workload: `num_prompts` requests in bursts, link only; see the module docstring).

    Returns a JSON-ready dict: the settings, `machine` (CPU count, load average before and after),
    `rows` (one `summarize` dict per system and level, with every request), `ratios` (`compute_ratios`),
    `skipped` and `errors` ({system: reason}; a system that fails does not stop the others).
    Raises:
        ValueError: an unknown system or workload, non-positive sizes, or more prompts than the workload holds.
        UnknownModelError, ServingError, FileNotFoundError: see `render_prompts` and `load_workload`.
    """
    concurrencies = sorted(set(concurrencies))
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown or not systems:
        raise ValueError(f"unknown systems {unknown}; choose from {', '.join(SYSTEMS)}")
    if min(concurrencies, default=0) < 1 or num_prompts < 1 or max_tokens < 1:
        raise ValueError("concurrencies, num_prompts and max_tokens must be positive")
    data_dir = Path(data_dir) if data_dir else default_data_dir()
    texts = workload_texts(workload, data_dir, seed)
    bursts = burst_plan(num_prompts, seed) if workload == "mixed" else None
    if bursts:
        concurrencies = [MAX_BURST]
    if num_prompts * len(concurrencies) > len(texts):
        raise ValueError(f"{num_prompts} prompts x {len(concurrencies)} levels exceeds the {len(texts)} prompts of the workload")
    from serving.registry import default_registry

    default_registry().get(model)  # an unknown name fails here, before any process starts
    # the server loads its model while the prompts render here
    server = start_engine_server(model, dtype, kv_cache_mb, max_num_seqs) if "link" in systems else None
    try:
        progress(f"rendering {num_prompts * len(concurrencies)} prompts with the {model} chat template")
        path, ids = render_prompts(model, [WARMUP_MESSAGE] + texts[: num_prompts * len(concurrencies)])
        warmup, slices = ids[0], [ids[1 + k * num_prompts : 1 + (k + 1) * num_prompts] for k in range(len(concurrencies))]
        result = {
            "model": model, "dtype": dtype, "max_tokens": max_tokens, "num_prompts": num_prompts, "concurrencies": concurrencies,
            "systems": list(systems), "seed": seed, "data_dir": str(data_dir), "gguf": str(path),
            "engine": {"kv_cache_mb": kv_cache_mb, "max_num_seqs": max_num_seqs}, "workload": workload, "bursts": bursts,
            "machine": {"cpu_count": os.cpu_count(), "load_average_before": list(os.getloadavg())},
            "rows": [], "skipped": {}, "errors": {},
        }
        for system in systems:
            if bursts and system != "link":
                result["skipped"][system] = "the mixed workload runs on link only"
                continue
            if system == "llama-cpp" and importlib.util.find_spec("llama_cpp") is None:
                result["skipped"][system] = "llama_cpp is not installed (pip install 'togetherlink[bench]')"
                progress(f"skipping {system}: {result['skipped'][system]}")
                continue
            levels = [1] if system in ONE_AT_A_TIME else concurrencies
            progress(f"{system}: concurrency {', '.join(map(str, levels))}")
            try:
                if system == "link":
                    measured = _bench_link(server, model, warmup, slices, levels, max_tokens, bursts)
                elif system == "transformers":
                    measured = in_worker(transformers_worker, str(path), dtype, warmup, slices, levels, max_tokens)
                elif system == "link-engine":
                    measured = in_worker(engine_worker, model, dtype, warmup, slices[0], max_tokens)
                else:
                    measured = in_worker(llama_cpp_worker, str(path), warmup, slices[0], max_tokens, seed)
            except Exception as exc:
                result["errors"][system] = f"{type(exc).__name__}: {exc}"
                progress(f"{system} failed: {result['errors'][system]}")
                continue
            finally:
                if system == "link":
                    server.stop()  # idle from here on: free its memory before the next system loads
            for concurrency, (records, wall_s, rss_mb) in zip(levels, measured):
                result["rows"].append(summarize(system, concurrency, records, wall_s, rss_mb))
            if system == "link" and save_mix:
                from serving.tuning.traffic import save_mix as write_mix

                result["mix"] = str(write_mix(records_to_mix([m[0] for m in measured]), save_mix))
    finally:
        if server is not None:
            server.stop()
    result["ratios"] = compute_ratios(result["rows"])
    result["machine"]["load_average_after"] = list(os.getloadavg())
    return result
