"""A real uvicorn server on loopback for the engine server tests."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import uvicorn


@contextlib.contextmanager
def serve_on_loopback(app, **options):
    """Run `app` in a uvicorn server on a free 127.0.0.1 port in a daemon thread; yield its base URL. `options` go to
    `uvicorn.Config` (lifespan="off": the routes without the model the lifespan would load)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", **options))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not srv.started:
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        thread.join(timeout=30)


def client_port(response) -> int:
    """The local port of the connection an httpx `response` came on: equal ports on one `httpx.Client` mean the
    server kept the connection open between the two requests."""
    return response.extensions["network_stream"].get_extra_info("client_addr")[1]
