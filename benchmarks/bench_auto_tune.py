"""Inter-token latency while a fresh `link engine serve` tunes its kernels in the background, against after.

    .venv/bin/python benchmarks/bench_auto_tune.py [--model smollm2-135m-instruct] [--gap-s 2.5] [--max-tokens 48]

Starts the server with an empty $LINK_HOME (the model caches linked in), so background tuning has every bucket
to do, and sends one streamed request at a time with `--gap-s` seconds between them: each gap lets the tuner
start a slice, and each request then arrives in the middle of one, the worst case for its latency. "warm-up" is
every request until /metrics reports no bucket pending; "after" the same number of requests once it is done;
"untuned" a server with `--no-auto-tune` first (the kernels the warm-up starts from, never disturbed). Prints
each phase's ITL p50 / p99 (ms) and the p99 ratios (the acceptance: warm-up at most 1.3x after). Tuned kernels
make "after" faster, so warm-up / untuned is the disturbance alone.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks.link_bench.processes import ServerProcess, free_port, python_env


def stream_itls(url: str, model: str, max_tokens: int) -> list[float]:
    """One streamed chat request; the seconds between its consecutive content chunks."""
    body = {"model": model, "messages": [{"role": "user", "content": "Tell me about the sea."}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True}
    times = []
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=300) as response:
        for line in response.iter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"]:
                times.append(time.perf_counter())
    return [b - a for a, b in zip(times, times[1:])]


def pending(url: str) -> float | None:
    found = re.findall(r"^link_kernel_autotune_pending\{[^}]*\} ([0-9.e+]+)$", httpx.get(url + "/metrics").text, re.M)
    return float(found[0]) if found else None


def start(model: str, home: Path, *flags: str) -> ServerProcess:
    port = free_port()
    server = ServerProcess([sys.executable, "-m", "cli", "engine", "serve", "--model", model, "--port", str(port), *flags], port,
                           env=python_env(LINK_HOME=str(home)))
    server.wait_healthy(timeout_s=300)
    return server


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--gap-s", type=float, default=2.5)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--max-requests", type=int, default=400, help="warm-up requests at most")
    parser.add_argument("--baseline-requests", type=int, default=20, help="requests to a server with --no-auto-tune")
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="link-home-"))
    (home / "cache").mkdir()
    shared = Path(os.environ.get("LINK_HOME") or Path.home() / ".link") / "cache"
    for name in ("models", "tokenizers"):
        if (shared / name).exists():
            (home / "cache" / name).symlink_to(shared / name)
    phases: dict[str, list[float]] = {"untuned": [], "warm-up": [], "after": []}
    server = start(args.model, home, "--no-auto-tune")  # the same kernels as the warm-up's start, never tuned
    try:
        for _ in range(args.baseline_requests):
            phases["untuned"].extend(stream_itls(server.url, args.model, args.max_tokens))
            time.sleep(args.gap_s)
    finally:
        server.stop(timeout_s=10)
    server = start(args.model, home)
    try:
        num_warmup = 0
        while num_warmup < args.max_requests:
            phases["warm-up"].extend(stream_itls(server.url, args.model, args.max_tokens))
            num_warmup += 1
            time.sleep(args.gap_s)
            if num_warmup > 1 and pending(server.url) == 0:
                break
        for _ in range(num_warmup):
            phases["after"].extend(stream_itls(server.url, args.model, args.max_tokens))
            time.sleep(args.gap_s)
    finally:
        server.stop(timeout_s=10)
    for name, itls in phases.items():
        print(f"{name:8s} {len(itls):5d} ITLs  p50 {statistics.median(itls) * 1e3:7.1f} ms  p99 {p99(itls) * 1e3:7.1f} ms")
    print(f"p99 warm-up / after: {p99(phases['warm-up']) / p99(phases['after']):.2f} ({num_warmup} requests each); "
          f"warm-up / untuned: {p99(phases['warm-up']) / p99(phases['untuned']):.2f}")


if __name__ == "__main__":
    main()
