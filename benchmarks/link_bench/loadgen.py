"""A closed-loop load generator in a process of its own (so it can be pinned to a core with taskset).

    python -m benchmarks.link_bench.loadgen            # driven over stdin/stdout, one JSON object per line:

    -> {"url": "http://127.0.0.1:P", "path": "/v1/chat/completions", "headers": {...}, "body": {...},
        "concurrency": 8, "num_requests": 200, "num_warmup": 16}
    <- {"event": "warm", "warmup_ok": true, "warmup_error": null}   warm-up done, connections open
    -> "go"
    <- {"event": "done", "wall_s": 1.9, "records": [{"start_s", "latency_s", "ttft_s", "status"}, ...]}
    ... the next cell's spec, or EOF to exit

`concurrency` clients (one httpx.AsyncClient, at most `concurrency` connections) each send their next
request as soon as the last one finished, until `num_requests` have been sent. A request whose body
has `"stream": true` is read line by line to `data: [DONE]`; TTFT (s) is the time to the first SSE line
carrying content, latency (s) the time to the end of the answer; `start_s` counts from the cell's start.
The warm-up runs `num_warmup` requests (at least one per client, so every connection is open before the
clock starts) and checks the first answer: status 200 and a non-empty text.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time


def _text(event: dict) -> str:
    """The text an SSE chunk carries (chat delta content or completion text), "" for none."""
    return "".join((c.get("delta") or {}).get("content") or c.get("text") or "" for c in event.get("choices") or [])


async def _one(client, spec: dict, t0: float) -> dict:
    start = time.perf_counter()
    ttft = None
    if spec["body"].get("stream"):
        async with client.stream("POST", spec["path"], json=spec["body"], headers=spec["headers"]) as response:
            async for line in response.aiter_lines():
                if ttft is None and line.startswith("data: {") and _text(json.loads(line[6:])):
                    ttft = time.perf_counter() - start
                if line == "data: [DONE]":
                    break
            status = response.status_code
    else:
        response = await client.post(spec["path"], json=spec["body"], headers=spec["headers"])
        status = response.status_code
    latency = time.perf_counter() - start
    return {"start_s": start - t0, "latency_s": latency, "ttft_s": latency if ttft is None else ttft, "status": status}


async def _closed_loop(client, spec: dict, num_requests: int) -> tuple[list[dict], float]:
    records: list[dict] = []
    remaining = [num_requests]
    t0 = time.perf_counter()

    async def user() -> None:
        while remaining[0] > 0:
            remaining[0] -= 1
            records.append(await _one(client, spec, t0))

    await asyncio.gather(*(user() for _ in range(spec["concurrency"])))
    return records, time.perf_counter() - t0


async def _check_answer(client, spec: dict) -> str | None:
    """Why the first answer is wrong (status or empty text), or None when it is fine."""
    async with client.stream("POST", spec["path"], json=spec["body"], headers=spec["headers"]) as response:
        raw = (await response.aread()).decode()
    if response.status_code != 200:
        return f"HTTP {response.status_code}: {raw[:300]}"
    if spec["body"].get("stream"):
        events = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: {")]
        text = "".join(_text(e) for e in events)
        if not raw.rstrip().endswith("data: [DONE]"):
            return f"the stream did not end with data: [DONE]: {raw[-300:]}"
    else:
        choice = json.loads(raw)["choices"][0]
        text = (choice.get("message") or {}).get("content") or choice.get("text")
    return None if text else f"no text in the answer: {raw[:300]}"


async def _run(lines) -> None:
    import httpx

    clients: dict[tuple, httpx.AsyncClient] = {}
    try:
        for line in lines:
            spec = json.loads(line)
            key = (spec["url"], spec["concurrency"])
            if key not in clients:
                limits = httpx.Limits(max_connections=spec["concurrency"], max_keepalive_connections=spec["concurrency"])
                clients[key] = httpx.AsyncClient(base_url=spec["url"], timeout=120.0, limits=limits)
            client = clients[key]
            error = await _check_answer(client, spec)
            await _closed_loop(client, spec, max(spec["num_warmup"], spec["concurrency"]))
            _send({"event": "warm", "warmup_ok": error is None, "warmup_error": error})
            if (await asyncio.to_thread(sys.stdin.readline)).strip() != "go":
                return
            records, wall_s = await _closed_loop(client, spec, spec["num_requests"])
            _send({"event": "done", "wall_s": wall_s, "records": records})
    finally:
        for client in clients.values():
            await client.aclose()


def _send(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def main() -> None:
    def lines():
        while line := sys.stdin.readline():
            if line.strip():
                yield line

    asyncio.run(_run(lines()))


if __name__ == "__main__":
    main()
