"""Fixtures of the engine server tests: a real uvicorn server on loopback (one per test module) and an
official `openai` client for it, over the session's SmolLM2."""

from __future__ import annotations

import socket
import threading
import time

import openai
import pytest
import uvicorn

from serving.api.server import create_engine_app

MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def server(smollm2):
    app = create_engine_app(MODEL, loaded=smollm2.loaded)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not srv.started:
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}", app
    srv.should_exit = True
    thread.join(timeout=30)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="unused", max_retries=0, timeout=120)
