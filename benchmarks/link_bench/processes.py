"""Processes under benchmark: free ports, servers in subprocesses (optionally pinned to cores), their
CPU time and memory, and spawned workers.

    server = ServerProcess(["python", "-m", "cli", "serve", "--port", str(port)], port, cores=(1,))
    server.wait_healthy("/health")
    cpu_s, rss_mib = process_cpu_seconds(server.pid), process_rss_mb(server.pid)
    server.stop()
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Callable, Sequence

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A loopback TCP port that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def can_pin(cores: Sequence[int]) -> bool:
    """True when `taskset` exists and every core in `cores` is one this process may run on."""
    affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
    return shutil.which("taskset") is not None and set(cores) <= affinity


def pinned(cmd: Sequence[str], cores: Sequence[int] | None) -> list[str]:
    """`cmd` under `taskset -c <cores>` (unchanged when `cores` is None). taskset execs, so the pid stays."""
    return list(cmd) if cores is None else ["taskset", "-c", ",".join(map(str, cores)), *cmd]


def python_env(**extra: str) -> dict[str, str]:
    """This environment with the repository on PYTHONPATH (a checkout runs without installing), plus `extra`."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


def _process_tree(pid: int) -> list:
    import psutil

    process = psutil.Process(pid)
    return [process, *process.children(recursive=True)]


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` and its live children (psutil cpu_times)."""
    total = 0.0
    for p in _process_tree(pid):
        times = p.cpu_times()
        total += times.user + times.system
    return total


def process_rss_mb(pid: int) -> float:
    """Resident memory (MiB) of process `pid` and its live children, now."""
    return sum(p.memory_info().rss for p in _process_tree(pid)) / 2**20


def peak_rss_mb_of(pid: int) -> float:
    """Peak RSS (MiB) of a live process: VmHWM on Linux, else its current RSS through psutil."""
    status = Path(f"/proc/{pid}/status")
    if status.is_file():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    return process_rss_mb(pid)


def self_peak_rss_mb() -> float:
    """Peak RSS (MiB) of this process (getrusage)."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024  # bytes on macOS, kB on Linux


def stop_process(proc: subprocess.Popen, timeout_s: float = 30) -> None:
    """SIGTERM `proc`, then SIGKILL it after `timeout_s` seconds; wait for it (no-op once it has exited)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def in_worker(fn: Callable, *args):
    """Run fn(*args) in a fresh spawned process (its own peak RSS, no state shared with this one)."""
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


class ServerProcess:
    """A server command in a subprocess listening on 127.0.0.1:`port`, its output in a temporary file.

    Args:
        cmd: the command line (without taskset). port: where it listens. cores: CPU cores to pin it to
        (`taskset -c`), None for no pinning. env: its environment (default: `python_env()`). cwd: its folder.
    """

    def __init__(self, cmd: Sequence[str], port: int, *, cores: Sequence[int] | None = None,
                 env: dict[str, str] | None = None, cwd: str | Path | None = None):
        self.url = f"http://127.0.0.1:{port}"
        self.cmd = pinned(cmd, cores)
        self._log = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env or python_env(), cwd=cwd)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self, num_chars: int = 3000) -> str:
        """The last `num_chars` characters the server printed."""
        self._log.flush()
        self._log.seek(0)
        return self._log.read()[-num_chars:]

    def wait_healthy(self, path: str = "/health", timeout_s: float = 600, headers: dict[str, str] | None = None) -> None:
        """Poll GET url+path until it answers 200.

        Raises:
            RuntimeError: with the end of the server's output, if it exits or `timeout_s` passes first.
        """
        import httpx

        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"`{' '.join(self.cmd)}` did not become healthy:\n{self.output()}")
            try:
                if httpx.get(self.url + path, headers=headers, timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)

    def stop(self, timeout_s: float = 30) -> None:
        """SIGTERM, then SIGKILL after `timeout_s` seconds (idempotent)."""
        stop_process(self.proc, timeout_s)
        if not self._log.closed:
            self._log.close()
