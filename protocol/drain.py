"""Graceful drain: what a server does between SIGTERM and its exit (the gateway and the engine server alike).

    drain = Drain()
    app.add_middleware(DrainGuard, drain=drain)                 # outermost: before the body is read
    serve_draining(app, drain, timeout_s=30.0, host="0.0.0.0", port=8000, log_level="info")

On SIGTERM (a Kubernetes pod's termination, `docker stop`, systemd's stop) the server
1. stops being ready: `/health` answers 503 {"status": "draining", "in_flight": n}, while the liveness probe
   `/health/live` still answers 200, so the orchestrator takes the replica out of rotation and does not restart it;
2. keeps its port open and answers every other new request (but `/metrics`) with a 503 OpenAI error object
   (type "server_error", code "server_draining", `Retry-After: 1`, `Connection: close`): a 503 before any work,
   which the gateway's proxy retries on another replica and a proxy such as nginx may retry too;
3. lets the requests already in flight, streams included, run to their end, for at most `timeout_s` seconds
   (`LINK_DRAIN_TIMEOUT_S`, default 30);
4. then shuts down as uvicorn does on a signal: stops listening, closes idle keep-alive connections, cancels what
   still runs after `GRACE_S` more seconds, runs the app's lifespan shutdown (the gateway flushes its request log),
   and exits with status 0.
A second SIGTERM ends the wait at once (step 4); SIGINT (Ctrl-C) keeps uvicorn's own behaviour.

Why on top of uvicorn's `Server` rather than beside it: uvicorn alone, on SIGTERM, closes its listening socket at
once, so a probe or a new request meets a refused connection rather than a 503 saying why; it waits for open
connections only up to `timeout_graceful_shutdown`; and it re-raises the signal after its shutdown, so the process
ends with status 143 rather than 0. Only `handle_exit` (which signal starts what) and `on_tick` (when the drain is
over) are overridden; the rest is uvicorn's.
"""

from __future__ import annotations

import logging
import signal
import sys
import time
from dataclasses import dataclass
from types import FrameType

import uvicorn
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from protocol.coalesce import coalescing_protocol
from protocol.errors import error_body

log = logging.getLogger(__name__)

READINESS_PATH = "/health"
LIVENESS_PATH = "/health/live"
# Paths that neither count as in flight nor are refused while draining: the probes and the Prometheus scrape.
PROBE_PATHS = frozenset({READINESS_PATH, LIVENESS_PATH, "/metrics"})
# Seconds uvicorn waits, once the drain is over, for connections to close before it cancels what still runs.
GRACE_S = 1.0
DEFAULT_DRAIN_TIMEOUT_S = 30.0


@dataclass
class Drain:
    """A server's drain state, shared by its `DrainGuard` and its `DrainingServer` (one event loop, no locks).

    Attributes:
        num_in_flight: HTTP requests being served now (probes and /metrics left out); a stream counts until its
            last byte is handed to the server.
        started_at: `time.monotonic()` when the drain began; None while the server is serving normally.
    """

    num_in_flight: int = 0
    started_at: float | None = None

    @property
    def is_draining(self) -> bool:
        return self.started_at is not None

    def begin(self) -> None:
        """Start draining (idempotent: a second call keeps the first start time)."""
        if self.started_at is None:
            self.started_at = time.monotonic()

    def is_over(self, timeout_s: float) -> bool:
        """True once draining and nothing is in flight, or `timeout_s` seconds after the drain began."""
        if self.started_at is None:
            return False
        return self.num_in_flight == 0 or time.monotonic() - self.started_at >= timeout_s


class DrainGuard:
    """ASGI middleware: counts the requests in flight and, while draining, answers `/health` and new requests with 503
    (see the module docstring). Outermost, so a refused request's body is never read."""

    def __init__(self, app: ASGIApp, drain: Drain) -> None:
        self.app, self.drain = app, drain

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        if path in PROBE_PATHS:
            if path == READINESS_PATH and self.drain.is_draining:
                body = {"status": "draining", "in_flight": self.drain.num_in_flight,
                        "detail": "shutting down: finishing the requests in flight, taking no new ones"}
                await JSONResponse(body, status_code=503)(scope, receive, send)
                return
            await self.app(scope, receive, send)
            return
        if self.drain.is_draining:
            message = "This server is shutting down and takes no new requests; retry on another replica."
            await JSONResponse(error_body(message, "server_error", code="server_draining"), status_code=503,
                               headers={"Retry-After": "1", "Connection": "close"})(scope, receive, send)
            return
        self.drain.num_in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.drain.num_in_flight -= 1


class DrainingServer(uvicorn.Server):
    """uvicorn's server with a drain on SIGTERM before its own shutdown (see the module docstring).

    Args:
        config: uvicorn's config (its `timeout_graceful_shutdown` is the grace after the drain).
        drain: the state the app's `DrainGuard` shares.
        timeout_s: the longest drain, in seconds, before in-flight requests are cut (>= 0).
    Raises:
        ValueError: a negative `timeout_s`.
    """

    def __init__(self, config: uvicorn.Config, drain: Drain, timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S) -> None:
        if timeout_s < 0:
            raise ValueError(f"the drain timeout must be >= 0 seconds, got {timeout_s}")
        super().__init__(config)
        self.drain, self.drain_timeout_s = drain, timeout_s
        self._announced = False

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig != signal.SIGTERM:
            super().handle_exit(sig, frame)
        elif self.drain.is_draining:
            self.should_exit = True  # a second SIGTERM: stop waiting
        else:
            self.drain.begin()  # not re-raised after shutdown (uvicorn's `_captured_signals`): the exit status is 0

    async def on_tick(self, counter: int) -> bool:
        if self.drain.is_draining and not self._announced:
            self._announced = True
            log.info("SIGTERM: draining %d request(s) in flight for at most %.0f s", self.drain.num_in_flight,
                     self.drain_timeout_s)
        if not self.should_exit and self.drain.is_over(self.drain_timeout_s):
            if self.drain.num_in_flight:
                log.warning("drain timeout (%.0f s) reached: cutting %d request(s) still in flight",
                            self.drain_timeout_s, self.drain.num_in_flight)
            self.should_exit = True
        return await super().on_tick(counter)


def serve_draining(app: ASGIApp, drain: Drain, *, timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S, **config) -> None:
    """Run `app` with uvicorn until a signal, draining on SIGTERM; returns after a clean shutdown (exit status 0).

    Args:
        drain: the state `app`'s `DrainGuard` shares.
        timeout_s: the longest drain, in seconds.
        config: `uvicorn.Config` keywords (host, port, log_level, ...); `timeout_graceful_shutdown` defaults to
            `GRACE_S`, `http` to protocol/coalesce.py's protocol (a response's writes of one event-loop step in one).
    Raises:
        SystemExit(3): the server did not start (uvicorn's `STARTUP_FAILURE`, as `uvicorn.run` exits).
    """
    config.setdefault("timeout_graceful_shutdown", GRACE_S)
    config.setdefault("http", coalescing_protocol())
    server = DrainingServer(uvicorn.Config(app, **config), drain, timeout_s)
    server.run()
    if not server.started:
        sys.exit(3)
