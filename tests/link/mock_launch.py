"""Starting and stopping the mock OpenAI server (`mock_openai.py`): in a thread of this process or as a
real subprocess, on a free loopback port, waiting until it answers; and a URL that refuses connections.

    with start_mock_thread(mode="ok") as mock:          # mock.api_base = "http://127.0.0.1:P/v1"
        ...
    server = start_mock_process("ok", port=8001)        # python -m tests.link.mock_openai --port 8001
    server.kill()                                       # SIGKILL: a crash, open connections drop
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import uvicorn

from benchmarks.link_bench.processes import free_port  # noqa: F401  (re-exported for the gateway tests)

ROOT = Path(__file__).resolve().parents[2]


def refused_url() -> str:
    """An api_base where every connection is refused (a free port with no server)."""
    return f"http://127.0.0.1:{free_port()}/v1"


def wait_healthy(url: str, timeout_s: float = 30.0, process: subprocess.Popen | None = None, path: str = "/health",
                 statuses: tuple[int, ...] = (200,)) -> None:
    """Poll `url` + `path` until it answers one of `statuses`. Raises RuntimeError after `timeout_s` or if `process` exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"mock server exited with code {process.returncode}")
        try:
            if httpx.get(url + path, timeout=1.0).status_code in statuses:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"mock server at {url} not healthy within {timeout_s} s")


@dataclass
class MockServer:
    """A running mock server. `url` is the root, `api_base` the OpenAI base URL (root + "/v1")."""

    port: int
    options: MockOptions
    process: subprocess.Popen | None = None
    server: uvicorn.Server | None = None
    thread: threading.Thread | None = None
    host: str = "127.0.0.1"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def api_base(self) -> str:
        return self.url + "/v1"

    def stats(self) -> dict:
        """{"requests", "chat", "completion"} counted by the server."""
        return httpx.get(self.url + "/mock/stats", timeout=5).json()

    def last_body(self) -> dict:
        """The last request body the server received, as JSON."""
        return httpx.get(self.url + "/mock/last", timeout=5).json()

    def set_mode(self, mode: str) -> None:
        httpx.post(self.url + "/mock/mode", json={"mode": mode}, timeout=5).raise_for_status()

    def stop(self) -> None:
        """Stop gracefully (SIGTERM for a process; should_exit for a thread) and wait."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.server is not None:
            self.server.should_exit = True
            self.thread.join(timeout=10)

    def kill(self) -> None:
        """SIGKILL the process (a crash: open connections drop); a thread server just stops."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()
        else:
            self.stop()

    def __enter__(self) -> MockServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_mock_thread(mode: str = "ok", port: int | None = None, *, timeout_s: float = 30.0, **options) -> MockServer:
    """Serve the mock in a daemon thread of this process on `port` (default: a free one); wait until healthy.

    `options` are MockOptions fields: model, hang_s, die_after, chunk_delay_s, reply.
    """
    from tests.link.mock_openai import MockOptions, create_mock_app, uvicorn_config

    opts = MockOptions(mode=mode, **options)
    port = port or free_port()
    server = uvicorn.Server(uvicorn_config(create_mock_app(opts), "127.0.0.1", port))
    thread = threading.Thread(target=server.run, daemon=True, name=f"mock-openai-{port}")
    thread.start()
    mock = MockServer(port, opts, server=server, thread=thread)
    try:
        wait_healthy(mock.url, timeout_s, path="/v1/models")  # /health is 503 in mode 500
    except RuntimeError:
        mock.stop()
        raise
    return mock


def start_mock_process(mode: str = "ok", port: int | None = None, *, timeout_s: float = 60.0, model: str = "mock-model",
                       hang_s: float = 3600.0, die_after: int = 2, chunk_delay_s: float = 0.0) -> MockServer:
    """Run `python -m tests.link.mock_openai` as a subprocess on `port` (default: a free one); wait until it answers."""
    from tests.link.mock_openai import MockOptions

    port = port or free_port()
    cmd = [sys.executable, "-m", "tests.link.mock_openai", "--port", str(port), "--mode", mode, "--model", model,
           "--hang-s", str(hang_s), "--die-after", str(die_after), "--chunk-delay", str(chunk_delay_s)]
    process = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    mock = MockServer(port, MockOptions(mode, model, hang_s, die_after, chunk_delay_s), process=process)
    try:
        wait_healthy(mock.url, timeout_s, process, path="/v1/models")
    except RuntimeError:
        mock.kill()
        raise
    return mock
