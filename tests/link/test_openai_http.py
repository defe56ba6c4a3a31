"""link/backends/openai_http.py: SSE framing (hand-checked against the WHATWG rules), what a stream's reader says is
already in memory (`READY_AHEAD`), and the relay that writes such frames together (`GatewayStream.stream_response`),
against a raw HTTP server on loopback that sends a whole stream in one write."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from link.backends.base import BackendUnavailable
from link.backends.openai_http import OpenAIHTTP, SSEParser
from link.config import ModelDeployment
from link.routes.openai import GatewayStream
from protocol.sse import DONE, READY_AHEAD, frame


def test_sse_events_end_at_a_blank_line_whatever_the_line_ends():
    parser = SSEParser()
    assert parser.feed(b'data: {"a":1}\n\ndata: {"b"') == [b'{"a":1}']  # the second event waits for its end
    assert parser.feed(b':2}\r\n\r\n: a comment\n\nevent: x\nid: 3\ndata:[DONE]\r\r') == [b'{"b":2}', b"[DONE]"]
    assert parser.feed(b"data: one\ndata:  two\n\n") == [b"one\n two"]  # one leading space is dropped, not two
    assert parser.feed(b"retry: 10\n\n") == []


async def _serve_once(payload: bytes) -> tuple[asyncio.AbstractServer, int]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
        await reader.readexactly(length)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n" + payload)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def _chunk(i: int) -> dict:
    return {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": f"w{i}"}}]}


def test_a_stream_read_at_once_says_how_many_chunks_are_already_in_memory():
    payload = b"".join(frame(_chunk(i)) for i in range(3)) + DONE

    async def go():
        server, port = await _serve_once(payload)
        client = OpenAIHTTP(ModelDeployment(name="m", kind="openai", model="m", api_base=f"http://127.0.0.1:{port}/v1"), None)
        seen = [(chunk["choices"][0]["delta"]["content"], READY_AHEAD.get())
                async for chunk in client.post_sse("/chat/completions", {"stream": True})]
        after = READY_AHEAD.get()
        await client.aclose()
        server.close()
        return seen, after

    seen, after = asyncio.run(go())
    # one network read held 3 chunks and [DONE]: 3, 2 and 1 more events were parsed when each chunk was handed on
    assert seen == [("w0", 3), ("w1", 2), ("w2", 1)] and after == 0


def test_a_stream_cut_mid_event_is_unavailable_after_its_chunks():
    payload = frame(_chunk(0)) + b'data: {"id": "c", "choi'

    async def go():
        server, port = await _serve_once(payload)
        client = OpenAIHTTP(ModelDeployment(name="m", kind="openai", model="m", api_base=f"http://127.0.0.1:{port}/v1"), None)
        got = []
        try:
            async for chunk in client.post_sse("/chat/completions", {"stream": True}):
                got.append(chunk)
        finally:
            await client.aclose()
            server.close()
        return got

    # the body ended without [DONE] and with half an event: the reader stops as the `openai` client did, after 1
    assert len(asyncio.run(go())) == 1


def test_an_error_object_in_the_stream_is_unavailable_after_chunks():
    payload = frame(_chunk(0)) + frame({"error": {"message": "overloaded"}})

    async def go():
        server, port = await _serve_once(payload)
        client = OpenAIHTTP(ModelDeployment(name="m", kind="openai", model="m", api_base=f"http://127.0.0.1:{port}/v1"), None)
        try:
            return [c async for c in client.post_sse("/chat/completions", {"stream": True})]
        finally:
            await client.aclose()
            server.close()

    with pytest.raises(BackendUnavailable, match="failed after 1 chunks \\(overloaded\\)"):
        asyncio.run(go())


def _relay(frames_and_ahead: list[tuple[bytes, int]]) -> list[dict]:
    async def body():
        for data, ahead in frames_and_ahead:
            READY_AHEAD.set(ahead)
            yield data

    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    stream = SimpleNamespace(body_iterator=body(), status_code=200, raw_headers=[])
    asyncio.run(GatewayStream.stream_response(stream, send))
    return sent


def test_the_relay_writes_frames_already_in_memory_together_and_done_with_the_end():
    sent = _relay([(b"a", 2), (b"b", 1), (b"c", 0), (b"d", 0), (DONE, 0)])
    assert sent[0]["type"] == "http.response.start"
    assert [(m["body"], m["more_body"]) for m in sent[1:]] == [(b"abc", True), (b"d", True), (DONE, False)]


def test_a_frame_whose_successor_is_not_in_memory_goes_out_alone():
    sent = _relay([(b"a", 0), (b"b", 0)])
    assert [(m["body"], m["more_body"]) for m in sent[1:]] == [(b"a", True), (b"b", True), (b"", False)]
