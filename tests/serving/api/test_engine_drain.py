"""Graceful drain of a real `link engine serve` process on SmolLM2 (protocol/drain.py): SIGTERM during a stream lets
it finish with the same greedy text as before, while /health answers 503 "draining", /health/live 200 and a new
request a 503 `server_draining`; then the process exits with status 0."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest

from tests.link.mock_launch import ROOT, free_port, wait_healthy

pytestmark = pytest.mark.slow  # loads a real model (tests/test_markers.py)

MODEL = "smollm2-135m-instruct"
MAX_TOKENS = 48


def test_engine_serve_drains_a_stream_on_sigterm_and_exits_0():
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "cli", "engine", "serve", "--port", str(port), "--kv-cache-mb", "32",
                             "--no-auto-tune", "--drain-timeout-s", "60"], cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, 180, proc)
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        kwargs = dict(model=MODEL, prompt="1, 2, 3, 4,", temperature=0, max_tokens=MAX_TOKENS)
        whole = client.completions.create(**kwargs)
        assert whole.usage.completion_tokens == MAX_TOKENS and whole.choices[0].finish_reason == "length"

        first_chunk, result = threading.Event(), {}

        def stream() -> None:
            chunks = []
            for chunk in client.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}):
                chunks.append(chunk)
                first_chunk.set()
            result["text"] = "".join(c.choices[0].text for c in chunks if c.choices)
            result["usage"] = chunks[-1].usage

        thread = threading.Thread(target=stream)
        thread.start()
        assert first_chunk.wait(60)
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while (ready := httpx.get(url + "/health", timeout=2)).status_code != 503:
            assert time.monotonic() < deadline
        assert ready.json()["status"] == "draining"
        assert httpx.get(url + "/health/live", timeout=2).json() == {"status": "ok"}
        refused = httpx.post(url + "/v1/completions", json={**kwargs, "max_tokens": 1}, timeout=5)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "server_draining"
        thread.join(60)
        assert result["text"] == whole.choices[0].text
        assert result["usage"].completion_tokens == MAX_TOKENS
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
