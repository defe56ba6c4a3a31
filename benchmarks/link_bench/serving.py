"""Serving benchmark: our engine behind its OpenAI server against `transformers` and llama.cpp, same GGUF.

    link bench serving --model smollm2-135m-instruct -c 1 -c 4 -c 16 --json out.json
    python benchmarks/bench_serving.py --json out.json
    link bench serving -s link -s llama-cpp --fresh --warmup-s 180      # the comparison against llama.cpp
    run_serving_benchmark("smollm2-135m-instruct", concurrencies=(1, 4, 16))   # -> dict, see below

Workload (benchmarks/link_bench/workload.py): AlpacaEval instructions and MT-Bench first turns from the data
directory, shuffled with `seed`, each rendered as one user message with the model's chat template and
tokenized by our tokenizer, so every system gets the same prompt token ids. Concurrency level k takes
its own slice of `num_prompts` prompts (the same slice for every system), so the engine's prefix cache
never sees a prompt twice. Greedy decoding with EOS ignored: every request generates exactly
`max_tokens` tokens.

Systems, each in a process of its own, never two measured at once:
- `link`: `link engine serve` as a subprocess, the server users run (benchmarks/link_bench/link_server.py).
  This process is the client: `concurrency` asyncio clients (httpx) each send streamed `/v1/completions`
  requests (prompt as token ids, `ignore_eos`) back to back, a closed loop. TTFT = request sent -> first
  SSE chunk with text; output tokens from the final usage chunk. One server serves every level. `fresh`:
  the server gets an empty temporary $LINK_HOME (the model cache linked in, nothing re-assembled, no stored
  kernel winners) and `warmup_s` seconds of warm-up traffic (closed loops at each level in turn) before
  the measured phases; the warm-up's ITL p50/p99 per level are reported next to the measured ones.
- `transformers` (benchmarks/link_bench/baselines.py): `AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)`
  in a spawned worker. At concurrency c, the prompts run as static batches of c through one `generate`
  each, left-padded; c=1 is one request at a time. Token times come from a stopping criterion that
  runs after every decode step.
- `llama-cpp`: llama-cpp-python (`make install-bench`), one request at a time on the same GGUF with a 4096-token
  context, in a worker that stays up (benchmarks/link_bench/llama_session.py), reported at concurrency 1
  only; skipped with a message when `llama_cpp` does not import. Its phases interleave with link's: both
  load first, then link c=1, llama-cpp c=1, link's other levels, link prefill, llama-cpp prefill.
- `link-engine`: our `LLMEngine` measured as llama-cpp is (a spawned worker, one request at a time, no
  HTTP, concurrency 1 only; stored kernel winners installed), for an engine-to-engine comparison: `link`
  also pays the server, the SSE stream and a client process on the same cores.

Workloads (`workload`, benchmarks/link_bench/workloads.py): "default" (above), "repetitive" (HumanEval code edits
and MT-Bench quote-summaries, whose answers repeat their prompt; closed loops like the default) and
"mixed" (bursts of 1 to 16 concurrent requests of the default prompts, `num_prompts` requests in all,
one row at concurrency 16; link only). `save_mix` writes the link rows' request shapes (lengths and
send times) as a JSONL mix for `link compile tune-config --mix`.

Prefill phase (link and llama-cpp, `prefill_tokens` > 0; benchmarks/link_bench/prefill.py): `num_prefill_prompts`
prompts of exactly `prefill_tokens` tokens with max_tokens=1, one at a time; prefill tokens/s = prompt tokens /
TTFT for link, / llama.cpp's own prompt-evaluation time for llama-cpp.

Memory (`result["memory"]`): each process's peak RSS as the kernel's high-water mark (`VmHWM` in
/proc/<pid>/status, psutil's RSS where there is no /proc) read at the end of its phases, model load and the
Python interpreter included (our server also holds torch); our resident weight bytes from the server's
GET /v1/models (`LoadedModel.resident_bytes`), next to the GGUF file's size, which llama.cpp maps.
`result["comparison"]` (benchmarks/link_bench/comparison.py) puts link and llama-cpp side by side with ratios.

Per request: TTFT (s); ITL (s) = (last token time - first token time) / (tokens - 1); latency (s).
Per level (benchmarks/link_bench/report.py): output tokens/s and requests/s over the level's wall time (first
request sent -> last token), decode tokens/s per request = sum(tokens - 1) / sum(last - first), TTFT
and ITL p50/p99 over requests, peak RSS (MiB) of the system's process since it started (model loading
included): the server's `VmHWM` from /proc, the workers' `getrusage(RUSAGE_SELF).ru_maxrss`.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
from contextlib import ExitStack
from pathlib import Path
from typing import Callable, Sequence

from benchmarks.link_bench.baselines import engine_worker, transformers_worker
from benchmarks.link_bench.comparison import compare_with_llama_cpp
from benchmarks.link_bench.cpuinfo import read_cpu_info
from benchmarks.link_bench.link_server import bursts, closed_loop, fresh_link_home, model_card, prefill, start_engine_server, warm_up
from benchmarks.link_bench.llama_session import N_CTX, LlamaCppSession
from benchmarks.link_bench.prefill import long_prompts, summarize_prefill
from benchmarks.link_bench.processes import in_worker, peak_rss_mb_of
from benchmarks.link_bench.report import compute_ratios, summarize
from benchmarks.link_bench.timing import percentile
from benchmarks.link_bench.workload import WARMUP_MESSAGE, default_data_dir, prompt_renderer
from benchmarks.link_bench.workloads import MAX_BURST, burst_plan, records_to_mix, workload_texts

SYSTEMS = ("link", "transformers", "llama-cpp", "link-engine")
ONE_AT_A_TIME = ("llama-cpp", "link-engine")  # systems measured at concurrency 1 only
NUM_WARMUP_PROMPTS = 64  # distinct prompts the warm-up traffic cycles through
MEMORY_METHOD = ("peak RSS: the kernel's high-water mark VmHWM of /proc/<pid>/status (psutil RSS without /proc) of "
                 "each system's own process, model load and Python included")


class _Phases:
    """Runs one system's phases in turn; after a failure that system's later phases are skipped."""

    def __init__(self, result: dict, progress: Callable[[str], None]):
        self.result, self.progress = result, progress

    def run(self, system: str, label: str, fn: Callable):
        if system in self.result["errors"]:
            return None
        self.progress(f"{system}: {label}")
        try:
            return fn()
        except Exception as exc:
            self.result["errors"][system] = f"{type(exc).__name__}: {exc}"
            self.progress(f"{system} failed: {self.result['errors'][system]}")
            return None


def _warmup_rows(by_level: dict[int, list]) -> list[dict]:
    rows = []
    for concurrency, records in by_level.items():
        itls = [r.itl_s for r in records if r.itl_s is not None]
        rows.append({"concurrency": concurrency, "num_requests": len(records), "itl_p50_s": percentile(itls, 50),
                     "itl_p99_s": percentile(itls, 99)})
    return rows


def _link_and_llama(result: dict, phases: _Phases, server, llama, model: str, prompts: dict, concurrencies: list[int],
                    max_tokens: int, warmup_s: float, burst_sizes: list[int] | None) -> list:
    """link and llama-cpp, phase by phase interleaved (see the module docstring); link's measured levels."""
    url, measured = server.url if server else None, []
    if server:
        phases.run("link", "loading", server.wait_healthy)
    if llama:
        phases.run("llama-cpp", "loading", llama.wait_ready)
    if server and phases.run("link", "warm-up request", lambda: asyncio.run(closed_loop(url, model, [prompts["warmup"]], 1, min(4, max_tokens)))):
        if warmup_s > 0:
            by_level = phases.run("link", f"{warmup_s:g} s of warm-up traffic",
                                  lambda: asyncio.run(warm_up(url, model, prompts["warm"], concurrencies, max_tokens, warmup_s)))
            result["warmup"] = _warmup_rows(by_level or {})
    for k, concurrency in enumerate(concurrencies):
        if server and burst_sizes:
            level = phases.run("link", "bursts", lambda: asyncio.run(bursts(url, model, prompts["slices"][0], burst_sizes, max_tokens)))
        elif server:
            level = phases.run("link", f"concurrency {concurrency}",
                               lambda: asyncio.run(closed_loop(url, model, prompts["slices"][k], concurrency, max_tokens)))
        if server and level:
            measured.append(level[0])
            result["rows"].append(summarize("link", concurrency, level[0], level[1], peak_rss_mb_of(server.pid)))
        if llama and concurrency == concurrencies[0]:
            level = phases.run("llama-cpp", "concurrency 1",
                               lambda: llama.decode(prompts["warmup"], prompts["slices"][0], max_tokens))
            if level:
                result["rows"].append(summarize("llama-cpp", 1, level[0], level[1], llama.peak_rss_mb()))
    if prompts["long"]:
        warm, long = prompts["long"][0], prompts["long"][1:]
        for system, fn in (("link", lambda: asyncio.run(prefill(url, model, warm, long))),
                           ("llama-cpp", lambda: llama.prefill(warm, long))):
            if (server if system == "link" else llama) is not None:
                records = phases.run(system, f"prefill of {len(long)} prompts x {len(long[0])} tokens", fn)
                if records:
                    result["prefill"].append(summarize_prefill(system, records))
    memory = result["memory"]
    if server and "link" not in result["errors"]:
        memory["link"] = {"peak_rss_mb": peak_rss_mb_of(server.pid), "resident_weight_bytes": model_card(url).get("resident_bytes")}
    if llama and "llama-cpp" not in result["errors"]:
        memory["llama-cpp"] = {"peak_rss_mb": llama.peak_rss_mb(), "gguf_bytes": Path(result["gguf"]).stat().st_size, "n_ctx": N_CTX}
    return measured


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
    prefill_tokens: int = 512,
    num_prefill_prompts: int = 8,
    fresh: bool = False,
    warmup_s: float | None = None,
) -> dict:
    """Benchmark `systems` at each concurrency on `num_prompts` requests of `max_tokens` tokens per level
    (the mixed workload: `num_prompts` requests in bursts, link only), then the prefill phase of
    `num_prefill_prompts` prompts of `prefill_tokens` tokens (0: none); see the module docstring.
    `warmup_s`: seconds of warm-up traffic to link before it is measured (default 180 with `fresh`, else 0).

    Returns a JSON-ready dict: the settings, `machine` (CPU count, load average before and after), `cpu`
    (`CpuInfo.to_dict`), `rows` (one `summarize` dict per system and level, with every request), `prefill`
    (`summarize_prefill` rows), `warmup` (link's ITL per level during the warm-up), `memory`, `ratios`
    (`compute_ratios`), `comparison` (`compare_with_llama_cpp`), `skipped` and `errors` ({system: reason};
    a system that fails does not stop the others).
    Raises:
        ValueError: an unknown system or workload, non-positive sizes, or more prompts than the workload holds.
        UnknownModelError, ServingError, FileNotFoundError: see `render_prompts` and `load_workload`.
    """
    concurrencies = sorted(set(concurrencies))
    warmup_s = (180.0 if fresh else 0.0) if warmup_s is None else warmup_s
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown or not systems:
        raise ValueError(f"unknown systems {unknown}; choose from {', '.join(SYSTEMS)}")
    if min(concurrencies, default=0) < 1 or num_prompts < 1 or max_tokens < 1 or prefill_tokens < 0 or warmup_s < 0:
        raise ValueError("concurrencies, num_prompts and max_tokens must be positive; prefill_tokens and warmup_s not negative")
    data_dir = Path(data_dir) if data_dir else default_data_dir()
    texts = workload_texts(workload, data_dir, seed)
    burst_sizes = burst_plan(num_prompts, seed) if workload == "mixed" else None
    if burst_sizes:
        concurrencies = [MAX_BURST]
    num_measured = num_prompts * len(concurrencies)
    if num_measured > len(texts):
        raise ValueError(f"{num_prompts} prompts x {len(concurrencies)} levels exceeds the {len(texts)} prompts of the workload")
    from serving.registry import default_registry

    default_registry().get(model)  # an unknown name fails here, before any process starts
    result = {
        "model": model, "dtype": dtype, "max_tokens": max_tokens, "num_prompts": num_prompts, "concurrencies": concurrencies,
        "systems": list(systems), "seed": seed, "data_dir": str(data_dir), "workload": workload, "bursts": burst_sizes,
        "engine": {"kv_cache_mb": kv_cache_mb, "max_num_seqs": max_num_seqs}, "fresh": fresh, "warmup_s": warmup_s,
        "prefill_tokens": prefill_tokens, "num_prefill_prompts": num_prefill_prompts if prefill_tokens else 0,
        "machine": {"cpu_count": os.cpu_count(), "load_average_before": list(os.getloadavg())},
        "cpu": read_cpu_info().to_dict(), "memory": {"method": MEMORY_METHOD},
        "rows": [], "prefill": [], "warmup": [], "skipped": {}, "errors": {},
    }
    for system in systems:
        if burst_sizes and system != "link":
            result["skipped"][system] = "the mixed workload runs on link only"
        elif system == "llama-cpp" and importlib.util.find_spec("llama_cpp") is None:
            result["skipped"][system] = "llama_cpp is not installed (make install-bench)"
    for system, reason in result["skipped"].items():
        progress(f"skipping {system}: {reason}")
    running = [s for s in systems if s not in result["skipped"]]
    phases = _Phases(result, progress)
    with ExitStack() as stack:
        home = stack.enter_context(fresh_link_home()) if fresh and "link" in running else None
        # the server loads its model while the prompts render here
        server = start_engine_server(model, dtype, kv_cache_mb, max_num_seqs, home) if "link" in running else None
        if server:
            stack.callback(server.stop)
        progress(f"rendering {num_measured} prompts with the {model} chat template")
        path, render = prompt_renderer(model)
        result["gguf"] = str(path)
        ids = [render(t) for t in [WARMUP_MESSAGE] + texts[:num_measured]]
        long, used = (long_prompts(render, texts[num_measured:], num_prefill_prompts + 1, prefill_tokens)
                      if prefill_tokens and {"link", "llama-cpp"} & set(running) else ([], 0))
        prompts = {"warmup": ids[0], "long": long, "slices": [ids[1 + k * num_prompts : 1 + (k + 1) * num_prompts] for k in range(len(concurrencies))],
                   "warm": [render(t) for t in texts[num_measured + used :][:NUM_WARMUP_PROMPTS]] if warmup_s and server else []}
        if warmup_s and server and not prompts["warm"]:
            raise ValueError("no workload texts are left for the warm-up traffic; lower --num-prompts or --prefill-prompts")
        llama = stack.enter_context(LlamaCppSession(str(path), seed)) if "llama-cpp" in running else None
        measured = _link_and_llama(result, phases, server, llama, model, prompts, concurrencies, max_tokens, warmup_s, burst_sizes)
    if save_mix and measured:
        from serving.tuning.traffic import save_mix as write_mix

        result["mix"] = str(write_mix(records_to_mix(measured), save_mix))
    for system in [s for s in running if s not in ("link", "llama-cpp")]:  # idle servers are gone: memory is free
        levels = [1] if system in ONE_AT_A_TIME else concurrencies
        if system == "transformers":
            fn = lambda: in_worker(transformers_worker, str(path), dtype, prompts["warmup"], prompts["slices"], levels, max_tokens)  # noqa: E731
        else:
            fn = lambda: in_worker(engine_worker, model, dtype, prompts["warmup"], prompts["slices"][0], max_tokens)  # noqa: E731
        for concurrency, (records, wall_s, rss_mb) in zip(levels, phases.run(system, f"concurrency {', '.join(map(str, levels))}", fn) or []):
            result["rows"].append(summarize(system, concurrency, records, wall_s, rss_mb))
    result["ratios"] = compute_ratios(result["rows"])
    result["comparison"] = compare_with_llama_cpp(result)
    result["machine"]["load_average_after"] = list(os.getloadavg())
    return result
