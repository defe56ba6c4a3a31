"""A minimal OpenAI-compatible backend for `link bench gateway`: a fixed short answer, at once.

    python -m benchmarks.link_bench.mock_backend --port 8001          # serves until SIGTERM / Ctrl-C

It measures the proxies in front of it, so it does as little as possible per request: a plain asyncio
HTTP/1.1 server (keep-alive, Content-Length request bodies) whose answers are built once at start.
Routes: POST /v1/chat/completions and /v1/completions (whole, or SSE when the body says `"stream": true`:
one chunk per word, `data: [DONE]`, and the usage chunk when `stream_options.include_usage` is set),
GET /health and GET /v1/models. Every answer is ANSWER_WORDS, PROMPT_TOKENS prompt tokens and one
completion token per word, whatever the request asks; anything else gets 404.
"""

from __future__ import annotations

import argparse
import asyncio
import json

MODEL = "mock-model"
ANSWER_WORDS = ("Hello!", "How", "can", "I", "help", "you", "today?")
PROMPT_TOKENS = 10
USAGE = {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": len(ANSWER_WORDS),
         "total_tokens": PROMPT_TOKENS + len(ANSWER_WORDS)}
ANSWER_TEXT = " ".join(ANSWER_WORDS)


def _http(status: str, body: bytes, content_type: str = "application/json") -> bytes:
    return (f"HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {len(body)}\r\n"
            "connection: keep-alive\r\n\r\n").encode() + body


def _sse(events: list[dict]) -> bytes:
    """An SSE answer in chunked transfer encoding, one HTTP chunk per event."""
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\nconnection: keep-alive\r\n\r\n"
    frames = [f"data: {json.dumps(e)}\n\n".encode() for e in events] + [b"data: [DONE]\n\n"]
    return head + b"".join(b"%x\r\n%s\r\n" % (len(f), f) for f in frames) + b"0\r\n\r\n"


def _whole(endpoint: str) -> bytes:
    common = {"id": "mock-0", "created": 0, "model": MODEL, "usage": USAGE, "system_fingerprint": None}
    if endpoint == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": ANSWER_TEXT}, "logprobs": None, "finish_reason": "stop"}
        return _http("200 OK", json.dumps({**common, "object": "chat.completion", "choices": [choice]}).encode())
    choice = {"index": 0, "text": ANSWER_TEXT, "logprobs": None, "finish_reason": "stop"}
    return _http("200 OK", json.dumps({**common, "object": "text_completion", "choices": [choice]}).encode())


def _stream(endpoint: str, include_usage: bool) -> bytes:
    obj = "chat.completion.chunk" if endpoint == "chat" else "text_completion"
    common = {"id": "mock-0", "created": 0, "model": MODEL, "object": obj}

    def chunk(piece: str | None, finish: str | None = None) -> dict:
        if endpoint == "chat":
            delta = {"role": "assistant", "content": ""} if piece is None else ({"content": piece} if piece else {})
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": piece or "", "logprobs": None, "finish_reason": finish}
        return {**common, "choices": [choice]}

    events = [chunk(None)] if endpoint == "chat" else []
    events += [chunk(w if k == 0 else " " + w) for k, w in enumerate(ANSWER_WORDS)] + [chunk("", "stop")]
    if include_usage:
        events.append({**common, "choices": [], "usage": USAGE})
    return _sse(events)


class MockBackend:
    """The prebuilt answers and the connection handler; `serve(host, port)` runs it until cancelled."""

    def __init__(self) -> None:
        self.answers = {(e, s, u): (_stream(e, u) if s else _whole(e))
                        for e in ("chat", "completion") for s in (False, True) for u in (False, True)}
        models = {"object": "list", "data": [{"id": MODEL, "object": "model", "created": 0, "owned_by": "mock"}]}
        self.gets = {"/health": _http("200 OK", b'{"status":"ok"}'), "/v1/models": _http("200 OK", json.dumps(models).encode())}
        self.not_found = _http("404 Not Found", b'{"error":{"message":"not found","type":"not_found_error","param":null,"code":null}}')
        self.num_requests = 0

    def answer(self, method: str, path: str, body: bytes) -> bytes:
        """The bytes of the whole HTTP response to one request."""
        self.num_requests += 1
        path = path.split("?", 1)[0]
        if method == "GET":
            return self.gets.get(path, self.not_found)
        endpoint = {"/v1/chat/completions": "chat", "/v1/completions": "completion"}.get(path)
        if method != "POST" or endpoint is None:
            return self.not_found
        request = json.loads(body or b"{}")
        include_usage = bool((request.get("stream_options") or {}).get("include_usage"))
        return self.answers[(endpoint, bool(request.get("stream")), include_usage)]

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve one keep-alive connection: request line, headers, a Content-Length body; repeat."""
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
                request_line, *lines = head.split("\r\n")
                method, path, _ = request_line.split(" ", 2)
                length, close = 0, False
                for line in lines:
                    name, _, value = line.partition(":")
                    name = name.strip().lower()
                    if name == "content-length":
                        length = int(value)
                    elif name == "connection":
                        close = value.strip().lower() == "close"
                body = await reader.readexactly(length) if length else b""
                writer.write(self.answer(method, path, body))
                await writer.drain()
                if close:
                    break
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError):
            pass
        finally:
            writer.close()

    async def serve(self, host: str, port: int) -> None:
        server = await asyncio.start_server(self.handle, host, port, backlog=1024)
        async with server:
            await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="A minimal OpenAI-compatible backend answering a fixed text at once.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    args = parser.parse_args(argv)
    try:
        asyncio.run(MockBackend().serve(args.host, args.port))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
