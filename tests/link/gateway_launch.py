"""Running the gateway for tests: in a thread of this process (fast; the app's state is reachable) or as
real `link serve` subprocesses (two gateways sharing a database), on free loopback ports.

    with start_gateway_thread(settings, config) as gw:     # gw.base_url = "http://127.0.0.1:P/v1"
        openai.OpenAI(base_url=gw.base_url, api_key=MASTER_KEY).chat.completions.create(...)
        gw.flush_log()                                       # request-log rows are written asynchronously
    gw = start_gateway_process(config_path, database_url)   # `python -m cli serve --config ...`
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import uvicorn
import yaml

from tests.link.mock_launch import ROOT, free_port, wait_healthy

MASTER_KEY = "sk-gateway-test-master-0123456789"
# The gateway is up once /health answers: 200, or 503 while a model has no replica in rotation (a test's
# deliberately unreachable backend).
UP = (200, 503)


def gateway_settings(database_url: str, home: Path, **overrides):
    """Settings for a test gateway: the given database, the test master key, fast health checks."""
    from link.settings import get_settings

    values = dict(home=home, database_url=database_url, master_key=MASTER_KEY, environment="development",
                  health_interval_s=0.2, eject_cooldown_s=0.5, redis_url=None, config=None)
    return get_settings(**{**values, **overrides})


def mock_deployment(name: str, api_base: str, kind: str = "openai", **fields) -> dict:
    """A config entry for a mock server (model "mock-model"), with prices unless given."""
    entry = {"name": name, "kind": kind, "api_base": api_base, "input_cost_per_million": 1000.0,
             "output_cost_per_million": 2000.0, "timeout_s": 5.0, "first_token_timeout_s": 2.0}
    entry["model"] = "openai/mock-model" if kind == "litellm" else "mock-model"
    return {**entry, **fields}


@dataclass
class GatewayServer:
    port: int
    server: uvicorn.Server | None = None
    thread: threading.Thread | None = None
    process: subprocess.Popen | None = None
    app: object | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    @property
    def state(self):
        """The running app's GatewayState (thread servers only)."""
        return self.app.state.gateway

    def flush_log(self, timeout_s: float = 10.0) -> None:
        assert self.state.log_writer.flush(timeout_s), "request log not flushed in time"

    def stop(self) -> None:
        if self.server is not None:
            self.server.should_exit = True
            self.thread.join(timeout=30)
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> GatewayServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def logged_request(gateway: GatewayServer, request_id: str, *, timeout_s: float = 10.0) -> dict:
    """A request's log row from /api/requests/{id}; a streamed request's row is queued just after its last
    byte, so this flushes the log and polls for up to `timeout_s`."""
    import time

    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        gateway.flush_log()
        row = httpx.get(f"{gateway.url}/api/requests/{request_id}", headers={"Authorization": f"Bearer {MASTER_KEY}"})
        if row.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert row.status_code == 200, row.text
    return row.json()


def start_gateway_thread(settings, config, *, timeout_s: float = 120.0) -> GatewayServer:
    """Serve `create_app(settings, config)` with uvicorn in a daemon thread; wait until /health answers (`UP`)."""
    from link.app import create_app

    app = create_app(settings, config)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           timeout_graceful_shutdown=2))
    thread = threading.Thread(target=server.run, daemon=True, name=f"gateway-{port}")
    thread.start()
    gateway = GatewayServer(port, server=server, thread=thread, app=app)
    try:
        wait_healthy(gateway.url, timeout_s, statuses=UP)
    except RuntimeError:
        gateway.stop()
        raise
    return gateway


def write_config(path: Path, models: list[dict], policies: list[dict] | None = None) -> Path:
    path.write_text(yaml.safe_dump({"models": models, "policies": policies or []}))
    return path


def start_gateway_process(config_path: Path, database_url: str, home: Path, *, timeout_s: float = 60.0,
                          **env: str) -> GatewayServer:
    """Run `python -m cli serve` with the test master key; wait until /health answers."""
    port = free_port()
    environ = {**os.environ, "PYTHONPATH": str(ROOT), "LINK_HOME": str(home), "LINK_DATABASE_URL": database_url,
               "LINK_MASTER_KEY": MASTER_KEY, "LINK_ENVIRONMENT": "development", "LINK_HEALTH_INTERVAL_S": "0.2",
               "LINK_EJECT_COOLDOWN_S": "0.5"}
    environ.pop("LINK_REDIS_URL", None)  # never the machine's shared Redis; a test passes its own in `env`
    environ.update(env)
    cmd = [sys.executable, "-m", "cli", "serve", "--config", str(config_path), "--port", str(port),
           "--log-level", "warning"]
    process = subprocess.Popen(cmd, cwd=ROOT, env=environ)
    gateway = GatewayServer(port, process=process)
    try:
        wait_healthy(gateway.url, timeout_s, process, statuses=UP)
    except RuntimeError:
        gateway.stop()
        raise
    return gateway
