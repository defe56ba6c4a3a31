"""Gateway benchmark: the gateway's own overhead over a direct call to the same instant OpenAI-compatible
backend, next to LiteLLM's proxy in the same run.

    link bench gateway -c 1 -c 8 -c 32 --requests 200 --json gateway.json
    run_gateway_benchmark(concurrencies=(1, 8, 32), num_requests=200)     # -> dict, see below

Processes, each its own (all on 127.0.0.1):
- the backend: benchmarks/link_bench/mock_backend.py, a fixed 7-word answer at once, for the whole run;
- the server under test, one system after another: `direct` (none: the clients call the backend),
  `link` (`link serve` in its default configuration: a stored API key with a budget, the request log
  and budgets on, SQLite in a temporary LINK_HOME), `link-lean` (`link serve` with LINK_REQUEST_LOG=false
  and LINK_BUDGETS=false, the master key: like for like with LiteLLM's proxy without a database), and
  `litellm` (`litellm --config cfg.yaml`, master key, no database, the backend as `openai/mock-model`
  with `api_base`; only when `litellm[proxy]` is installed). Access logs are off in all of them.
- the load generator (benchmarks/link_bench/loadgen.py): closed-loop httpx clients, POST /v1/chat/completions
  {"model": "mock-model", one user message, "max_tokens": 16}, whole or streamed (`stream_options.include_usage`).
With `taskset` and two cores: load generator and backend on core 0, the server under test on core 1.

Per cell (system, mode, concurrency): `num_warmup` requests first (connections opened, the answer
checked), then `num_requests` measured ones. Reported (benchmarks/link_bench/gateway_report.py): requests/s over
the cell's wall time; latency p50/p99 (s); added latency p50/p99 (s) = the system's latency percentile
minus the direct call's at the same mode and concurrency; CPU time per request (s) = the growth of the
server process tree's user + system CPU seconds (psutil) from just before the first measured request to
0.25 s after the last (so background work a request causes, like log writes, counts) / num_requests; for
`direct` that is the backend's own; RSS (MiB) of the server after the cell.
"""

from __future__ import annotations

import importlib.util
import json
import os
import select
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from benchmarks.link_bench.gateway_report import add_added_latency, compute_gateway_ratios, summarize_cell
from benchmarks.link_bench.processes import (ServerProcess, can_pin, free_port, pinned, process_cpu_seconds, process_rss_mb, python_env,
                                  stop_process)

GATEWAY_SYSTEMS = ("direct", "link", "link-lean", "litellm")
MODES = ("whole", "stream")
LOADGEN_CORES, MOCK_CORES, SERVER_CORES = (0,), (0,), (1,)
MASTER_KEY = "sk-link-bench-master-0123456789abcdef"
MODEL = "mock-model"
SETTLE_S = 0.25  # after the last answer, before the server's CPU time is read again
CELL_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class GatewayWorkload:
    """What every system is measured on: cells of `num_requests` (after `num_warmup`) per mode and concurrency."""

    concurrencies: tuple[int, ...]
    num_requests: int
    num_warmup: int
    modes: tuple[str, ...]
    max_tokens: int

    def __post_init__(self) -> None:
        unknown = [m for m in self.modes if m not in MODES]
        if unknown or not self.modes:
            raise ValueError(f"unknown modes {unknown}; choose from {', '.join(MODES)}")
        if min(self.concurrencies, default=0) < 1 or self.num_requests < 1 or self.num_warmup < 0 or self.max_tokens < 1:
            raise ValueError("concurrencies, num_requests and max_tokens must be positive and num_warmup not negative")

    def spec(self, url: str, headers: dict, mode: str, concurrency: int) -> dict:
        """The load generator's cell spec (see loadgen.py)."""
        return {"url": url, "path": "/v1/chat/completions", "headers": headers, "concurrency": concurrency,
                "body": request_body(mode == "stream", self.max_tokens), "num_requests": self.num_requests,
                "num_warmup": self.num_warmup}


def litellm_proxy_missing() -> str | None:
    """Why LiteLLM's proxy cannot run here (a reason), or None when `litellm[proxy]` is installed."""
    for module in ("litellm", "backoff", "apscheduler", "fastapi_sso"):  # the last three come with [proxy]
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed (pip install 'litellm[proxy]' or 'togetherlink[bench]')"
    return None


def request_body(stream: bool, max_tokens: int = 16) -> dict:
    """The benchmark's chat request (whole, or streamed with the usage chunk)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": max_tokens}
    return {**body, "stream": True, "stream_options": {"include_usage": True}} if stream else body


def _link_env(home: Path, lean: bool) -> dict[str, str]:
    env = python_env(LINK_HOME=str(home), LINK_MASTER_KEY=MASTER_KEY, LINK_ENVIRONMENT="development",
                     LINK_REQUEST_LOG=str(not lean).lower(), LINK_BUDGETS=str(not lean).lower())
    for name in ("LINK_DATABASE_URL", "LINK_REDIS_URL", "LINK_CONFIG"):
        env.pop(name, None)
    return env


def _budget_key(home: Path) -> str:
    """A stored API key with a large budget (USD 1e6) in the gateway's database at `home`; its plaintext."""
    from sqlmodel import Session

    from link.db import make_db_engine, upgrade
    from link.keys import create_key

    url = f"sqlite:///{home / 'link.db'}"
    upgrade(url)
    engine = make_db_engine(url, pool_size=1)
    try:
        with Session(engine) as session:
            return create_key(session, "bench", budget_usd=1e6)[1]
    finally:
        engine.dispose()


def start_link(mock_url: str, home: Path, *, lean: bool, cores: Sequence[int] | None) -> tuple[ServerProcess, dict]:
    """`link serve` over the mock (default configuration, or `lean`: no request log, no budgets); (server, headers)."""
    import yaml

    home.mkdir(parents=True, exist_ok=True)
    model = {"name": MODEL, "kind": "openai", "model": MODEL, "api_base": mock_url + "/v1",
             "input_cost_per_million": 1.0, "output_cost_per_million": 2.0}
    config = home / "link.yaml"
    config.write_text(yaml.safe_dump({"models": [model], "policies": []}))
    key = MASTER_KEY if lean else _budget_key(home)
    port = free_port()
    server = ServerProcess([sys.executable, "-m", "cli", "serve", "--config", str(config), "--port", str(port),
                            "--log-level", "warning"], port, cores=cores, env=_link_env(home, lean))
    return server, {"Authorization": f"Bearer {key}"}


def start_litellm(mock_url: str, home: Path, *, cores: Sequence[int] | None) -> tuple[ServerProcess, dict]:
    """LiteLLM's proxy over the mock: master key, no database, uvicorn with one worker; (server, headers)."""
    import yaml

    home.mkdir(parents=True, exist_ok=True)
    config = home / "litellm.yaml"
    config.write_text(yaml.safe_dump({
        "model_list": [{"model_name": MODEL, "litellm_params": {"model": f"openai/{MODEL}", "api_base": mock_url + "/v1",
                                                                "api_key": "unused"}}],
        "general_settings": {"master_key": MASTER_KEY},
    }))
    env = python_env(LITELLM_LOCAL_MODEL_COST_MAP="True", LITELLM_LOG="ERROR")
    env.pop("DATABASE_URL", None)
    port = free_port()
    server = ServerProcess([sys.executable, "-m", "litellm.proxy.proxy_cli", "--config", str(config), "--host", "127.0.0.1",
                            "--port", str(port), "--num_workers", "1"], port, cores=cores, env=env, cwd=home)
    return server, {"Authorization": f"Bearer {MASTER_KEY}"}


class LoadGenerator:
    """`python -m benchmarks.link_bench.loadgen` pinned to `cores`; `measure` runs one cell against a server."""

    def __init__(self, cores: Sequence[int] | None):
        self.proc = subprocess.Popen(pinned([sys.executable, "-m", "benchmarks.link_bench.loadgen"], cores), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=python_env())

    def _send(self, message: str) -> None:
        self.proc.stdin.write(message + "\n")
        self.proc.stdin.flush()

    def _receive(self, timeout_s: float) -> dict:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            raise RuntimeError("the load generator " + ("timed out" if not ready else f"exited ({self.proc.poll()})"))
        return json.loads(line)

    def measure(self, spec: dict, server_pid: int, timeout_s: float = CELL_TIMEOUT_S) -> tuple[list[dict], float, float, float]:
        """Warm up, then measure `spec` (see loadgen.py); (records, wall s, server CPU s, server RSS MiB).

        Raises:
            RuntimeError: the warm-up answer was wrong (not 200, no text, a stream without [DONE]) or the
                load generator failed or took longer than `timeout_s`.
        """
        self._send(json.dumps(spec))
        warm = self._receive(timeout_s)
        if not warm["warmup_ok"]:
            raise RuntimeError(f"bad answer during the warm-up: {warm['warmup_error']}")
        cpu_before = process_cpu_seconds(server_pid)
        self._send("go")
        done = self._receive(timeout_s)
        time.sleep(SETTLE_S)
        return done["records"], done["wall_s"], process_cpu_seconds(server_pid) - cpu_before, process_rss_mb(server_pid)

    def close(self) -> None:
        """Close its stdin (it exits at EOF); SIGTERM it if it is still running after 10 s."""
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                stop_process(self.proc, 10)


def _start_system(system: str, mock: ServerProcess, home: Path, cores) -> tuple[ServerProcess | None, dict, str]:
    """(server or None for direct, headers, health path)."""
    if system == "direct":
        return None, {"Authorization": "Bearer unused"}, "/health"
    if system == "litellm":
        return (*start_litellm(mock.url, home / system, cores=cores), "/health/liveliness")
    return (*start_link(mock.url, home / system, lean=system == "link-lean", cores=cores), "/health")


def run_gateway_benchmark(
    concurrencies: Sequence[int] = (1, 8, 32),
    num_requests: int = 200,
    num_warmup: int = 20,
    systems: Sequence[str] = GATEWAY_SYSTEMS,
    modes: Sequence[str] = MODES,
    max_tokens: int = 16,
    pin: bool = True,
    progress: Callable[[str], None] = lambda message: None,
) -> dict:
    """Measure every (system, mode, concurrency) cell; `direct` always runs (added latency needs it).

    Returns a JSON-ready dict: the settings, `machine` (CPU count, load average before and after),
    `pinning` ({"loadgen", "mock", "server"} core lists, or None without taskset or two cores),
    `cells` (one `summarize_cell` dict each, every request's record included, with `added_*` latency),
    `ratios` (`compute_gateway_ratios`: ours against LiteLLM's proxy), `skipped` and `errors` ({system: reason}).
    Raises:
        ValueError: an unknown system or mode, or non-positive sizes.
    """
    unknown = [s for s in systems if s not in GATEWAY_SYSTEMS]
    if unknown:
        raise ValueError(f"unknown systems {unknown}; choose from {', '.join(GATEWAY_SYSTEMS)}")
    workload = GatewayWorkload(tuple(sorted(set(concurrencies))), num_requests, num_warmup, tuple(modes), max_tokens)
    systems = ["direct", *(s for s in GATEWAY_SYSTEMS[1:] if s in systems)]
    is_pinned = pin and can_pin(LOADGEN_CORES + SERVER_CORES)
    loadgen_cores, mock_cores, server_cores = (LOADGEN_CORES, MOCK_CORES, SERVER_CORES) if is_pinned else (None, None, None)
    result = {
        "concurrencies": list(workload.concurrencies), "num_requests": num_requests, "num_warmup": num_warmup, "modes": list(modes),
        "systems": systems, "max_tokens": max_tokens, "request": request_body(False, max_tokens),
        "machine": {"cpu_count": os.cpu_count(), "load_average_before": list(os.getloadavg())},
        "pinning": {"loadgen": list(LOADGEN_CORES), "mock": list(MOCK_CORES), "server": list(SERVER_CORES)} if is_pinned else None,
        "cells": [], "skipped": {}, "errors": {},
    }
    missing = litellm_proxy_missing()
    if "litellm" in systems and missing:
        systems.remove("litellm")
        result["skipped"]["litellm"] = missing
        progress(f"skipping litellm: {missing}")
    mock_port = free_port()
    mock = ServerProcess([sys.executable, "-m", "benchmarks.link_bench.mock_backend", "--port", str(mock_port)], mock_port, cores=mock_cores)
    with tempfile.TemporaryDirectory(prefix="link-bench-gateway-") as home:
        try:
            mock.wait_healthy("/health", timeout_s=60)
            for system in systems:
                progress(f"{system}: starting")
                try:
                    result["cells"] += _measure_system(system, mock, Path(home), server_cores, loadgen_cores, workload, progress)
                except Exception as exc:
                    result["errors"][system] = f"{type(exc).__name__}: {exc}"
                    progress(f"{system} failed: {result['errors'][system]}")
        finally:
            mock.stop()
    add_added_latency(result["cells"])
    result["ratios"] = compute_gateway_ratios(result["cells"])
    result["machine"]["load_average_after"] = list(os.getloadavg())
    return result


def _measure_system(system: str, mock: ServerProcess, home: Path, server_cores: Sequence[int] | None,
                    loadgen_cores: Sequence[int] | None, workload: GatewayWorkload, progress: Callable[[str], None]) -> list[dict]:
    """Start `system`, measure its cells with a fresh load generator, stop both; the `summarize_cell` dicts."""
    server, headers, health = _start_system(system, mock, home, server_cores)
    loadgen, cells = None, []
    try:
        if server is not None:
            server.wait_healthy(health, timeout_s=180)
        target = server or mock
        loadgen = LoadGenerator(loadgen_cores)
        for mode in workload.modes:
            for concurrency in workload.concurrencies:
                records, wall_s, cpu_s, rss_mb = loadgen.measure(workload.spec(target.url, headers, mode, concurrency), target.pid)
                cells.append(summarize_cell(system, mode, concurrency, records, wall_s, cpu_s, rss_mb))
                progress(f"{system} {mode} c={concurrency}: {len(records) / wall_s:.0f} requests/s")
        return cells
    finally:
        if loadgen is not None:
            loadgen.close()
        if server is not None:
            server.stop()
