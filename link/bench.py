"""Serving benchmark: our engine behind its OpenAI server against `transformers` and llama.cpp, same GGUF.

    link bench serving --model smollm2-135m-instruct -c 1 -c 4 -c 16 --json out.json
    python benchmarks/bench_serving.py --json out.json
    run_serving_benchmark("smollm2-135m-instruct", concurrencies=(1, 4, 16))   # -> dict, see below

Workload: AlpacaEval instructions and MT-Bench first turns from the data directory, shuffled with
`seed`, each rendered as one user message with the model's chat template and tokenized by our
tokenizer, so every system gets the same prompt token ids. Concurrency level k takes its own slice of
`num_prompts` prompts (the same slice for every system), so the engine's prefix cache never sees a
prompt twice. Greedy decoding with EOS ignored: every request generates exactly `max_tokens` tokens.

Systems, one after another (never overlapping), each in a process of its own:
- `link`: `link engine serve` as a subprocess, the server users run. This process is the client:
  `concurrency` asyncio clients (httpx) each send streamed `/v1/completions` requests (prompt as token
  ids, `ignore_eos`) back to back, a closed loop. TTFT = request sent -> first SSE chunk with text;
  output tokens from the final usage chunk. One server serves every level.
- `transformers`: `AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)` in a spawned worker. At
  concurrency c, the prompts run as static batches of c through one `generate` each, left-padded; c=1 is
  one request at a time. Token times come from a stopping criterion that runs after every decode step.
- `llama-cpp`: llama-cpp-python (`pip install 'togetherlink[bench]'`), one request at a time on the same
  GGUF, reported at concurrency 1 only; skipped with a message when `llama_cpp` does not import.

Per request: TTFT (s); ITL (s) = (last token time - first token time) / (tokens - 1); latency (s).
Per level: output tokens/s and requests/s over the level's wall time (first request sent -> last token),
decode tokens/s per request = sum(tokens - 1) / sum(last - first), TTFT and ITL p50/p99 over requests,
peak RSS (MiB) of the system's process since it started (model loading included): the server's
`VmHWM` from /proc, the workers' `getrusage(RUSAGE_SELF).ru_maxrss`.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import multiprocessing
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

SYSTEMS = ("link", "transformers", "llama-cpp")
ROOT = Path(__file__).resolve().parent.parent
ALPACA_EVAL_MODEL = "gpt4_1106_preview"  # every model_outputs.json holds the same 805 instructions
WARMUP_MESSAGE = "Say hello."


@dataclass(frozen=True)
class RequestRecord:
    """One request's timings (seconds); `itl_s` is None for a single output token."""

    num_prompt_tokens: int
    num_output_tokens: int
    ttft_s: float
    itl_s: float | None
    latency_s: float


def _record(num_prompt_tokens: int, num_output_tokens: int, start: float, first: float, last: float) -> RequestRecord:
    itl = (last - first) / (num_output_tokens - 1) if num_output_tokens > 1 else None
    return RequestRecord(num_prompt_tokens, num_output_tokens, first - start, itl, last - start)


def default_data_dir() -> Path:
    return Path(os.environ.get("LINK_DATASETS_DIR") or ROOT.parent / "shared" / "data")


def load_workload(data_dir: str | Path, seed: int = 0) -> list[str]:
    """AlpacaEval instructions and MT-Bench first turns, shuffled with `seed`.

    Raises:
        FileNotFoundError: either data set is missing under `data_dir`.
    """
    data_dir = Path(data_dir)
    alpaca = data_dir / "alpaca_eval" / "results" / ALPACA_EVAL_MODEL / "model_outputs.json"
    if not alpaca.is_file():
        alpaca = next(iter(sorted((data_dir / "alpaca_eval" / "results").glob("*/model_outputs.json"))), alpaca)
    mt_bench = data_dir / "mt-bench" / "mt_bench" / "question.jsonl"
    for path in (alpaca, mt_bench):
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found; point --data-dir or LINK_DATASETS_DIR at the shared data folder")
    texts = [row["instruction"] for row in json.loads(alpaca.read_text())]
    texts += [json.loads(line)["turns"][0] for line in mt_bench.read_text().splitlines() if line.strip()]
    random.Random(seed).shuffle(texts)
    return texts


def render_prompts(model: str, texts: Sequence[str]) -> tuple[Path, list[list[int]]]:
    """(GGUF path, prompt token ids): each text as one user message in the model's chat format,
    tokenized as `serving.model_loader.load_model` sets the tokenizer and chat format up.

    Raises:
        UnknownModelError: `model` is not registered; ServingError: the model is not a GGUF file.
    """
    from serving.chat_format import InContextChatFormat, TemplateChatFormat
    from serving.errors import ServingError
    from serving.loader.gguf_loader import open_gguf
    from serving.registry import default_registry
    from serving.tokenizer import Tokenizer

    spec = default_registry().get(model)
    path = spec.resolve_path()
    if path.is_dir() or spec.tokenizer != "model":
        raise ServingError(f"the serving benchmark needs a GGUF model with its own tokenizer; {model!r} is not one")
    tok = Tokenizer.from_gguf(path, open_gguf(path).metadata)
    fmt = TemplateChatFormat(tok.chat_template, tok.bos_token, tok.eos_token) if spec.chat_format == "template" else InContextChatFormat()
    return path, [tok.encode(fmt.render([{"role": "user", "content": t}]), add_special_tokens=fmt.add_special_tokens) for t in texts]


# ---- link: the engine's OpenAI server in a subprocess, driven over HTTP -------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _peak_rss_mb_of(pid: int) -> float:
    """Peak RSS (MiB) of a live process: VmHWM on Linux, else its current RSS through psutil."""
    status = Path(f"/proc/{pid}/status")
    if status.is_file():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    import psutil

    return psutil.Process(pid).memory_info().rss / 2**20


async def _stream_one(client, model: str, prompt_ids: list[int], max_tokens: int) -> RequestRecord:
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
    return _record(len(prompt_ids), usage["completion_tokens"], start, first, last)


async def _closed_loop(base_url: str, model: str, prompts: list[list[int]], concurrency: int, max_tokens: int) -> tuple[list[RequestRecord], float]:
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


class EngineServer:
    """`link engine serve` in a subprocess (its output in a temporary file); it starts loading at once.

    Raises (`wait_healthy`): RuntimeError with the end of the server's output if it exits or times out.
    """

    def __init__(self, model: str, dtype: str, kv_cache_mb: int, max_num_seqs: int):
        self.url = f"http://127.0.0.1:{_free_port()}"
        self.cmd = [sys.executable, "-m", "link.cli", "engine", "serve", "--model", model, "--port", self.url.rsplit(":", 1)[1],
                    "--dtype", dtype, "--kv-cache-mb", str(kv_cache_mb), "--max-num-seqs", str(max_num_seqs)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
        self._log = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env)

    def wait_healthy(self, timeout_s: float = 600) -> None:
        import httpx

        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self._log.seek(0)
                raise RuntimeError(f"`{' '.join(self.cmd[1:])}` did not become healthy:\n{self._log.read()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.25)

    def stop(self) -> None:
        """Terminate the server (idempotent)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def _bench_link(server: EngineServer, model: str, warmup: list[int], slices: list[list[list[int]]],
                concurrencies: Sequence[int], max_tokens: int) -> list[tuple]:
    server.wait_healthy()
    asyncio.run(_closed_loop(server.url, model, [warmup], 1, min(4, max_tokens)))
    levels = []
    for prompts, concurrency in zip(slices, concurrencies):
        records, wall = asyncio.run(_closed_loop(server.url, model, prompts, concurrency, max_tokens))
        levels.append((records, wall, _peak_rss_mb_of(server.proc.pid)))
    return levels


# ---- transformers and llama.cpp: spawned workers that time themselves --------------------------------------


def _self_peak_rss_mb() -> float:
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024  # bytes on macOS, kB on Linux


def _transformers_worker(path: str, dtype: str, warmup: list[int], slices: list[list[list[int]]],
                         concurrencies: Sequence[int], max_tokens: int) -> list[tuple]:
    os.environ.setdefault("TQDM_DISABLE", "1")  # the GGUF dequantization progress bar
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig, StoppingCriteria, StoppingCriteriaList
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    gguf = Path(path)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=getattr(torch, dtype)).eval()
    model.generation_config.eos_token_id = None  # with eos_token_id=None below: exactly max_new_tokens tokens

    class StepClock(StoppingCriteria):
        """Called after every generated token (the first one included): records when it came out."""

        def __init__(self) -> None:
            self.times: list[float] = []

        def __call__(self, input_ids, scores, **kwargs):
            self.times.append(time.perf_counter())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    def generate(batch: list[list[int]], num_tokens: int) -> list[RequestRecord]:
        width = max(len(p) for p in batch)  # left padding: every prompt ends where generation starts
        ids = torch.tensor([[0] * (width - len(p)) + p for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        clock = StepClock()
        config = GenerationConfig(max_new_tokens=num_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=mask, generation_config=config, stopping_criteria=StoppingCriteriaList([clock]))
        return [_record(len(p), out.shape[1] - width, start, clock.times[0], clock.times[-1]) for p in batch]

    generate([warmup], min(4, max_tokens))
    levels = []
    for prompts, concurrency in zip(slices, concurrencies):
        start, records = time.perf_counter(), []
        for i in range(0, len(prompts), concurrency):
            records += generate(prompts[i : i + concurrency], max_tokens)
        levels.append((records, time.perf_counter() - start, _self_peak_rss_mb()))
    return levels


def _llama_cpp_worker(path: str, warmup: list[int], prompts: list[list[int]], max_tokens: int, seed: int) -> list[tuple]:
    from llama_cpp import Llama

    n_ctx = max(512, max(len(p) for p in prompts + [warmup]) + max_tokens + 1)
    llm = Llama(model_path=path, n_ctx=n_ctx, n_threads=os.cpu_count(), seed=seed, verbose=False)

    def run(ids: list[int], num_tokens: int) -> RequestRecord:
        start, times = time.perf_counter(), []
        # `generate` yields sampled ids and never stops at EOS by itself; top_k=1 / temp=0 is greedy.
        for _ in llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True):
            times.append(time.perf_counter())
            if len(times) == num_tokens:
                break
        return _record(len(ids), len(times), start, times[0], times[-1])

    run(warmup, min(4, max_tokens))
    start = time.perf_counter()
    records = [run(p, max_tokens) for p in prompts]
    return [(records, time.perf_counter() - start, _self_peak_rss_mb())]


def _in_worker(fn: Callable, *args):
    """Run fn(*args) in a fresh spawned process (its own peak RSS, no state shared with this one)."""
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


# ---- the report ---------------------------------------------------------------------------------------------


def _percentile(values: list[float], q: float) -> float | None:
    import numpy as np

    return float(np.percentile(values, q)) if values else None


def summarize(system: str, concurrency: int, records: list[RequestRecord], wall_s: float, peak_rss_mb: float) -> dict:
    """One row of the report (see the module docstring for each field)."""
    ttfts = [r.ttft_s for r in records]
    itls = [r.itl_s for r in records if r.itl_s is not None]
    num_tokens = sum(r.num_output_tokens for r in records)
    decode_s = sum(r.latency_s - r.ttft_s for r in records)
    return {
        "system": system, "concurrency": concurrency, "num_requests": len(records),
        "mean_prompt_tokens": sum(r.num_prompt_tokens for r in records) / len(records),
        "num_output_tokens": num_tokens, "duration_s": wall_s,
        "output_tokens_per_s": num_tokens / wall_s, "requests_per_s": len(records) / wall_s,
        "decode_tokens_per_s": (num_tokens - len(records)) / decode_s if decode_s > 0 else None,
        "ttft_p50_s": _percentile(ttfts, 50), "ttft_p99_s": _percentile(ttfts, 99),
        "itl_p50_s": _percentile(itls, 50), "itl_p99_s": _percentile(itls, 99),
        "latency_p50_s": _percentile([r.latency_s for r in records], 50),
        "peak_rss_mb": peak_rss_mb, "requests": [asdict(r) for r in records],
    }


def compute_ratios(rows: list[dict]) -> dict[str, float]:
    """link against each baseline: aggregate tokens/s at link's top concurrency vs the baseline one at a
    time, batch-1 decode speed, and tokens/s at equal concurrency against transformers' static batches."""
    by = {(r["system"], r["concurrency"]): r for r in rows}
    link_levels = sorted(c for s, c in by if s == "link")
    ratios: dict[str, float] = {}
    for base in ("transformers", "llama-cpp"):
        b1 = by.get((base, 1))
        if not link_levels or b1 is None:
            continue
        top = link_levels[-1]
        ratios[f"link c={top} tok/s / {base} c=1 tok/s"] = by[("link", top)]["output_tokens_per_s"] / b1["output_tokens_per_s"]
        if ("link", 1) in by and by[("link", 1)]["decode_tokens_per_s"] and b1["decode_tokens_per_s"]:
            ratios[f"link c=1 decode tok/s / {base} c=1 decode tok/s"] = by[("link", 1)]["decode_tokens_per_s"] / b1["decode_tokens_per_s"]
    for c in link_levels:
        if c > 1 and ("transformers", c) in by:
            ratios[f"link c={c} tok/s / transformers c={c} (static batch) tok/s"] = (
                by[("link", c)]["output_tokens_per_s"] / by[("transformers", c)]["output_tokens_per_s"])
    return ratios


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
) -> dict:
    """Benchmark `systems` at each concurrency on `num_prompts` requests of `max_tokens` tokens per level.

    Returns a JSON-ready dict: the settings, `machine` (CPU count, load average before and after),
    `rows` (one `summarize` dict per system and level, with every request), `ratios` (`compute_ratios`),
    `skipped` and `errors` ({system: reason}; a system that fails does not stop the others).
    Raises:
        ValueError: an unknown system, non-positive sizes, or more prompts than the workload holds.
        UnknownModelError, ServingError, FileNotFoundError: see `render_prompts` and `load_workload`.
    """
    concurrencies = sorted(set(concurrencies))
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown or not systems:
        raise ValueError(f"unknown systems {unknown}; choose from {', '.join(SYSTEMS)}")
    if min(concurrencies, default=0) < 1 or num_prompts < 1 or max_tokens < 1:
        raise ValueError("concurrencies, num_prompts and max_tokens must be positive")
    data_dir = Path(data_dir) if data_dir else default_data_dir()
    texts = load_workload(data_dir, seed)
    if num_prompts * len(concurrencies) > len(texts):
        raise ValueError(f"{num_prompts} prompts x {len(concurrencies)} levels exceeds the {len(texts)} prompts of the workload")
    from serving.registry import default_registry

    default_registry().get(model)  # an unknown name fails here, before any process starts
    # the server loads its model while the prompts render here
    server = EngineServer(model, dtype, kv_cache_mb, max_num_seqs) if "link" in systems else None
    try:
        progress(f"rendering {num_prompts * len(concurrencies)} prompts with the {model} chat template")
        path, ids = render_prompts(model, [WARMUP_MESSAGE] + texts[: num_prompts * len(concurrencies)])
        warmup, slices = ids[0], [ids[1 + k * num_prompts : 1 + (k + 1) * num_prompts] for k in range(len(concurrencies))]
        result = {
            "model": model, "dtype": dtype, "max_tokens": max_tokens, "num_prompts": num_prompts, "concurrencies": concurrencies,
            "systems": list(systems), "seed": seed, "data_dir": str(data_dir), "gguf": str(path),
            "engine": {"kv_cache_mb": kv_cache_mb, "max_num_seqs": max_num_seqs},
            "machine": {"cpu_count": os.cpu_count(), "load_average_before": list(os.getloadavg())},
            "rows": [], "skipped": {}, "errors": {},
        }
        for system in systems:
            if system == "llama-cpp" and importlib.util.find_spec("llama_cpp") is None:
                result["skipped"][system] = "llama_cpp is not installed (pip install 'togetherlink[bench]')"
                progress(f"skipping {system}: {result['skipped'][system]}")
                continue
            levels = [1] if system == "llama-cpp" else concurrencies
            progress(f"{system}: concurrency {', '.join(map(str, levels))}")
            try:
                if system == "link":
                    measured = _bench_link(server, model, warmup, slices, levels, max_tokens)
                elif system == "transformers":
                    measured = _in_worker(_transformers_worker, str(path), dtype, warmup, slices, levels, max_tokens)
                else:
                    measured = _in_worker(_llama_cpp_worker, str(path), warmup, slices[0], max_tokens, seed)
            except Exception as exc:
                result["errors"][system] = f"{type(exc).__name__}: {exc}"
                progress(f"{system} failed: {result['errors'][system]}")
                continue
            finally:
                if system == "link":
                    server.stop()  # idle from here on: free its memory before the next system loads
            for concurrency, (records, wall_s, rss_mb) in zip(levels, measured):
                result["rows"].append(summarize(system, concurrency, records, wall_s, rss_mb))
    finally:
        if server is not None:
            server.stop()
    result["ratios"] = compute_ratios(result["rows"])
    result["machine"]["load_average_after"] = list(os.getloadavg())
    return result


def render_report(result: dict):
    """A Rich table of the rows and one of the ratios."""
    from rich.console import Group
    from rich.markup import escape
    from rich.table import Table

    def ms(seconds: float | None) -> str:
        return "-" if seconds is None else f"{seconds * 1e3:.0f}"

    machine = result["machine"]
    table = Table(title=f"Serving {result['model']} ({result['dtype']}): {result['num_prompts']} requests per level, "
                        f"{result['max_tokens']} output tokens each",
                  caption="\n".join([f"{machine['cpu_count']} CPUs; load average (1 min) {machine['load_average_before'][0]:.2f} before, "
                                      f"{machine.get('load_average_after', [float('nan')])[0]:.2f} after"]
                                     + [f"{system}: {escape(reason)}" for system, reason in {**result["skipped"], **result["errors"]}.items()]))
    for header in ("system", "conc.", "out tok/s", "req/s", "decode tok/s/req", "TTFT p50 ms", "TTFT p99 ms",
                   "ITL p50 ms", "ITL p99 ms", "peak RSS MiB"):
        table.add_column(header, justify="left" if header == "system" else "right")
    for r in result["rows"]:
        table.add_row(r["system"], str(r["concurrency"]), f"{r['output_tokens_per_s']:.1f}", f"{r['requests_per_s']:.2f}",
                      "-" if r["decode_tokens_per_s"] is None else f"{r['decode_tokens_per_s']:.1f}",
                      ms(r["ttft_p50_s"]), ms(r["ttft_p99_s"]), ms(r["itl_p50_s"]), ms(r["itl_p99_s"]), f"{r['peak_rss_mb']:.0f}")
    ratios = Table(title="Ratios (above 1: link is faster)")
    ratios.add_column("ratio")
    ratios.add_column("value", justify="right")
    for name, value in result["ratios"].items():
        ratios.add_row(name, f"{value:.2f}x")
    return Group(table, ratios)
