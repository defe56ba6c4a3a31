"""Graceful drain of a real `link serve` process (protocol/drain.py): SIGTERM during 8 streams over a slow mock
backend lets all 8 finish in full while /health answers 503 "draining", /health/live 200 and a new request a 503
`server_draining`; then the process exits with status 0 and the 8 request-log rows are written. A stream that
outlives LINK_DRAIN_TIMEOUT_S is cut and the process still exits 0, soon after the timeout.

The engine server's drain (`link engine serve`, SmolLM2) is tests/serving/api/test_engine_drain.py.
"""

from __future__ import annotations

import signal
import sqlite3
import threading
import time

import httpx
import openai

from tests.link.gateway_launch import MASTER_KEY, mock_deployment, start_gateway_process, write_config
from tests.link.mock_launch import start_mock_thread

NUM_STREAMS = 8
WORDS = 30            # the mock echoes "You said: " + the words, one word per chunk
CHUNK_DELAY_S = 0.08  # so a stream lasts about 2.6 s: in flight when SIGTERM comes


def _stream(client: openai.OpenAI, content: str, first_chunk: threading.Event, result: dict) -> None:
    try:
        chunks = list(_chunks(client, content, first_chunk))
        result["text"] = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        result["finish"] = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    except Exception as exc:  # the assertion below names it
        result["error"] = repr(exc)
        first_chunk.set()


def _chunks(client: openai.OpenAI, content: str, first_chunk: threading.Event):
    stream = client.chat.completions.create(model="mock", messages=[{"role": "user", "content": content}], stream=True)
    for chunk in stream:
        first_chunk.set()
        yield chunk


def _wait_status(url: str, status: int, timeout_s: float = 10.0) -> httpx.Response:
    deadline = time.monotonic() + timeout_s
    while True:
        response = httpx.get(url, timeout=2)
        if response.status_code == status or time.monotonic() > deadline:
            return response
        time.sleep(0.02)


def test_sigterm_lets_eight_streams_finish_refuses_new_requests_and_exits_0(tmp_path):
    with start_mock_thread(mode="ok", chunk_delay_s=CHUNK_DELAY_S) as mock:
        config = write_config(tmp_path / "link.yaml", [mock_deployment("mock", mock.api_base, timeout_s=60.0)])
        database = tmp_path / "link.db"
        gateway = start_gateway_process(config, f"sqlite:///{database}", tmp_path, LINK_DRAIN_TIMEOUT_S="30")
        try:
            client = openai.OpenAI(base_url=gateway.base_url, api_key=MASTER_KEY, max_retries=0)
            contents = [" ".join(f"s{i}w{j}" for j in range(WORDS)) for i in range(NUM_STREAMS)]
            started = [threading.Event() for _ in contents]
            results = [{} for _ in contents]
            threads = [threading.Thread(target=_stream, args=(client, c, e, r)) for c, e, r in zip(contents, started, results)]
            for t in threads:
                t.start()
            assert all(e.wait(20) for e in started)
            assert not any("error" in r for r in results), results
            gateway.process.send_signal(signal.SIGTERM)

            ready = _wait_status(gateway.url + "/health", 503)
            assert ready.status_code == 503 and ready.json()["status"] == "draining"
            assert ready.json()["in_flight"] == NUM_STREAMS  # the probe itself is not counted
            assert httpx.get(gateway.url + "/health/live", timeout=2).json() == {"status": "ok"}
            refused = httpx.post(gateway.base_url + "/chat/completions", headers={"Authorization": f"Bearer {MASTER_KEY}"},
                                 json={"model": "mock", "messages": [{"role": "user", "content": "late"}]}, timeout=5)
            assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
            assert refused.json()["error"]["code"] == "server_draining"
            assert refused.json()["error"]["type"] == "server_error"

            for t in threads:
                t.join(30)
            for content, result in zip(contents, results):
                assert result.get("text") == "You said: " + content, result
                assert result["finish"] == ["stop"]
            assert gateway.process.wait(timeout=20) == 0
        finally:
            gateway.stop()
        assert mock.stats()["chat"] == NUM_STREAMS  # the refused request never reached the backend
    with sqlite3.connect(database) as db:  # written by the lifespan's shutdown, after the drain
        rows = db.execute("SELECT status, http_status, stream, completion_tokens FROM request_log").fetchall()
    assert rows == [("ok", 200, 1, WORDS + 2)] * NUM_STREAMS  # "You said:" and the words, one token each


def test_a_stream_past_the_drain_timeout_is_cut_and_the_process_still_exits_0(tmp_path):
    with start_mock_thread(mode="hang", hang_s=60.0) as mock:
        entry = mock_deployment("mock", mock.api_base, timeout_s=60.0, first_token_timeout_s=60.0)
        config = write_config(tmp_path / "link.yaml", [entry])
        gateway = start_gateway_process(config, f"sqlite:///{tmp_path}/link.db", tmp_path, LINK_DRAIN_TIMEOUT_S="1")
        try:
            client = openai.OpenAI(base_url=gateway.base_url, api_key=MASTER_KEY, max_retries=0, timeout=30)
            result: dict = {}
            thread = threading.Thread(target=_stream, args=(client, "never answered", threading.Event(), result))
            thread.start()
            deadline = time.monotonic() + 10
            while mock.stats()["chat"] < 1:  # the gateway is waiting on the backend
                assert time.monotonic() < deadline
                time.sleep(0.02)
            sent = time.monotonic()
            gateway.process.send_signal(signal.SIGTERM)
            assert gateway.process.wait(timeout=15) == 0
            # 1 s of drain, 1 s of uvicorn's grace, the lifespan's shutdown
            assert time.monotonic() - sent < 8
            thread.join(10)
            assert "error" in result or result.get("text") != "You said: never answered"
        finally:
            gateway.stop()
