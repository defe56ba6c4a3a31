"""Our engine server under the serving benchmark: started as users start it, driven by streamed HTTP clients.

    with fresh_link_home() as home:                       # empty $LINK_HOME, the model cache linked in
        server = start_engine_server("smollm2-135m-instruct", "float32", 256, 32, home=home)
        server.wait_healthy()
        records, wall_s = asyncio.run(closed_loop(server.url, model, prompts, concurrency=4, max_tokens=64))
        by_level = asyncio.run(warm_up(server.url, model, prompts, [1, 4], 64, seconds=180))
        prefill_records = asyncio.run(prefill(server.url, model, warmup_ids, long_prompts))
        model_card(server.url)["resident_bytes"]          # the loaded model's weights and buffers, bytes

Every request is a streamed `/v1/completions` with the prompt as token ids, greedy, EOS ignored. TTFT = request
sent -> first SSE chunk with text; output tokens from the final usage chunk.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from contextlib import contextmanager
from itertools import cycle
from pathlib import Path
from typing import Iterator, Sequence

from benchmarks.link_bench.prefill import PrefillRecord
from benchmarks.link_bench.processes import ServerProcess, free_port, python_env
from benchmarks.link_bench.timing import TimedRequest, record_from_times


@contextmanager
def fresh_link_home() -> Iterator[Path]:
    """A temporary, empty $LINK_HOME whose cache/models links to this one's (`serving.paths.cache_dir("models")`),
    so a fresh server finds the assembled model files but no stored kernel winners or other state."""
    from serving.paths import cache_dir

    models = cache_dir("models")
    with tempfile.TemporaryDirectory(prefix="link-bench-home-") as tmp:
        home = Path(tmp)
        (home / "cache").mkdir()
        (home / "cache" / "models").symlink_to(models, target_is_directory=True)
        yield home


def start_engine_server(model: str, dtype: str, kv_cache_mb: int, max_num_seqs: int,
                        home: str | Path | None = None) -> ServerProcess:
    """`link engine serve` in a subprocess on a free port; it starts loading at once. `home`: its $LINK_HOME
    (and no $LINK_COMPILE_DB, so its kernel winners live there too); None keeps this environment's."""
    port = free_port()
    env = python_env()
    if home is not None:
        env["LINK_HOME"] = str(home)
        env.pop("LINK_COMPILE_DB", None)
    return ServerProcess([sys.executable, "-m", "cli", "engine", "serve", "--model", model, "--port", str(port),
                          "--dtype", dtype, "--kv-cache-mb", str(kv_cache_mb), "--max-num-seqs", str(max_num_seqs)],
                         port, env=env)


def model_card(url: str) -> dict:
    """The server's one entry of GET /v1/models (id, max_model_len, resident_bytes, ...)."""
    import httpx

    return httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]


async def stream_one(client, model: str, prompt_ids: list[int], max_tokens: int) -> TimedRequest:
    """One streamed completion, timed. Raises RuntimeError on a non-200 answer or a stream without text."""
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


def _client(url: str, concurrency: int):
    import httpx

    return httpx.AsyncClient(base_url=url, timeout=None, limits=httpx.Limits(max_connections=concurrency))


async def closed_loop(url: str, model: str, prompts: list[list[int]], concurrency: int, max_tokens: int,
                      deadline: float | None = None) -> tuple[list[TimedRequest], float]:
    """`concurrency` clients, each sending its next prompt when its last request finished, until the prompts run
    out (or, with `deadline`, a perf_counter instant, none is sent after it); (records, wall s)."""
    pending, records = list(reversed(prompts)), []
    async with _client(url, concurrency) as client:

        async def user() -> None:
            while pending and (deadline is None or time.perf_counter() < deadline):
                records.append(await stream_one(client, model, pending.pop(), max_tokens))

        start = time.perf_counter()
        await asyncio.gather(*(user() for _ in range(concurrency)))
        return records, time.perf_counter() - start


async def bursts(url: str, model: str, prompts: list[list[int]], sizes: list[int], max_tokens: int) -> tuple[list[TimedRequest], float]:
    """Each burst's requests sent at once; the next burst when all of them finished; (records, wall s)."""
    records, pending = [], list(prompts)
    async with _client(url, max(sizes)) as client:
        start = time.perf_counter()
        for size in sizes:
            burst, pending = pending[:size], pending[size:]
            records += await asyncio.gather(*(stream_one(client, model, p, max_tokens) for p in burst))
        return records, time.perf_counter() - start


async def warm_up(url: str, model: str, prompts: list[list[int]], concurrencies: Sequence[int], max_tokens: int,
                  seconds: float) -> dict[int, list[TimedRequest]]:
    """Closed loops of 2 x c requests at each concurrency c in turn, round after round, cycling through `prompts`,
    until `seconds` have passed (after the first round, no request starts after that); {concurrency: records}."""
    deadline = time.perf_counter() + seconds
    source, by_level = cycle(prompts), {c: [] for c in concurrencies}
    is_first_round = True  # it runs whole, so every level has warm-up records
    while is_first_round or time.perf_counter() < deadline:
        for c in concurrencies:
            records, _ = await closed_loop(url, model, [next(source) for _ in range(2 * c)], c, max_tokens,
                                           None if is_first_round else deadline)
            by_level[c] += records
        is_first_round = False
    return by_level


async def prefill(url: str, model: str, warmup: list[int], prompts: list[list[int]]) -> list[PrefillRecord]:
    """Each long prompt in turn with max_tokens=1, after `warmup` (not recorded): TTFT records (no own eval timer)."""
    records = []
    async with _client(url, 1) as client:
        await stream_one(client, model, warmup, 1)
        for ids in prompts:
            timed = await stream_one(client, model, ids, 1)
            records.append(PrefillRecord(timed.num_prompt_tokens, timed.ttft_s))
    return records

