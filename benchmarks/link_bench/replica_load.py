"""The replica benchmark's load: streamed chat completions through the gateway, open-loop (Poisson) or closed-loop.

    records, wall_s = asyncio.run(open_loop(url, headers, model, texts, offsets, max_tokens=16))
    records, wall_s = asyncio.run(closed_loop(url, headers, model, texts, concurrency=4, max_tokens=16))

Every request is `POST /v1/chat/completions` with one user message, greedy (`temperature` 0), `ignore_eos` (so each
answer is exactly `max_tokens` tokens and the two routings generate the same work), streamed with the usage chunk.
TTFT (s) = request sent -> first SSE chunk carrying text; latency (s) = sent -> end of the stream; prompt and output
tokens from the usage chunk. A request fails (its `error` says why, nothing raises) on a status other than 200, an
SSE error event, a stream without text, usage or `data: [DONE]`, or a transport error or timeout.

Open loop: request i is sent at `offsets[i]` seconds after the start whether or not earlier ones have finished (a
late send, when the event loop was busy, is recorded: `start_s` against `scheduled_s`); wall time = start -> the
last answer's end. Closed loop: `concurrency` clients each send their next request when their last one ended, to
measure capacity; wall time = start -> the last end.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Sequence

REQUEST_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class ChatRecord:
    """One request through the gateway. Times in s from the run's start (`scheduled_s`, `start_s`) or from its own
    send (`ttft_s`, `latency_s`); `ttft_s` None and token counts 0 when it failed (`error` set)."""

    scheduled_s: float
    start_s: float
    ttft_s: float | None
    latency_s: float
    num_prompt_tokens: int
    num_output_tokens: int
    error: str | None = None

    @property
    def is_ok(self) -> bool:
        return self.error is None


def chat_body(model: str, text: str, max_tokens: int) -> dict:
    """The benchmark's request body for one user message `text`."""
    return {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}


async def stream_chat(client, model: str, text: str, max_tokens: int, t0: float, scheduled_s: float) -> ChatRecord:
    """Send one streamed chat completion now and time it; never raises (a failure is a record with `error`)."""
    import httpx

    start = time.perf_counter()
    first = usage = error = None
    is_done = False
    try:
        async with client.stream("POST", "/v1/chat/completions", json=chat_body(model, text, max_tokens)) as response:
            if response.status_code != 200:
                error = f"HTTP {response.status_code}: {(await response.aread()).decode(errors='replace')[:300]}"
            else:
                async for line in response.aiter_lines():
                    if line == "data: [DONE]":
                        is_done = True
                    elif line.startswith("data: "):
                        event = json.loads(line[6:])
                        if "error" in event:
                            error = f"error event: {json.dumps(event['error'])[:300]}"
                        usage = event.get("usage") or usage
                        if first is None and any((c.get("delta") or {}).get("content") for c in event.get("choices") or []):
                            first = time.perf_counter()
    except (httpx.HTTPError, OSError, ValueError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    end = time.perf_counter()
    if error is None and (first is None or usage is None or not is_done):
        error = "the stream ended without " + ", ".join(
            name for name, missing in (("text", first is None), ("usage", usage is None), ("[DONE]", not is_done)) if missing)
    if error is not None:
        return ChatRecord(scheduled_s, start - t0, None, end - start, 0, 0, error)
    return ChatRecord(scheduled_s, start - t0, first - start, end - start, usage["prompt_tokens"], usage["completion_tokens"])


def _client(url: str, headers: dict, max_connections: int):
    import httpx

    return httpx.AsyncClient(base_url=url, headers=headers, timeout=REQUEST_TIMEOUT_S,
                             limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections))


async def open_loop(url: str, headers: dict, model: str, texts: Sequence[str], offsets: Sequence[float],
                    max_tokens: int) -> tuple[list[ChatRecord], float]:
    """Send texts[i] at offsets[i] s after the start (see the module docstring); (records in send order, wall s).

    Raises:
        ValueError: `texts` and `offsets` differ in length.
    """
    if len(texts) != len(offsets):
        raise ValueError(f"{len(texts)} texts but {len(offsets)} send offsets")
    async with _client(url, headers, max(len(texts), 1)) as client:
        t0 = time.perf_counter()
        tasks = []
        for text, offset in zip(texts, offsets):
            await asyncio.sleep(max(0.0, t0 + offset - time.perf_counter()))
            tasks.append(asyncio.create_task(stream_chat(client, model, text, max_tokens, t0, offset)))
        records = list(await asyncio.gather(*tasks))
        return records, time.perf_counter() - t0


async def closed_loop(url: str, headers: dict, model: str, texts: Sequence[str], concurrency: int,
                      max_tokens: int) -> tuple[list[ChatRecord], float]:
    """`concurrency` clients over `texts`, each sending its next when its last ended; (records, wall s).

    Raises:
        ValueError: `concurrency` below 1.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    pending, records = list(reversed(texts)), []
    async with _client(url, headers, concurrency) as client:
        t0 = time.perf_counter()

        async def user() -> None:
            while pending:
                now = time.perf_counter() - t0
                records.append(await stream_chat(client, model, pending.pop(), max_tokens, t0, now))

        await asyncio.gather(*(user() for _ in range(concurrency)))
        return records, time.perf_counter() - t0
