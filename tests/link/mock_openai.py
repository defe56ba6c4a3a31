"""A small, real OpenAI-compatible server for gateway tests and `link bench gateway`, with fault modes.

Routes: POST /v1/chat/completions and /v1/completions (whole, or SSE with `data: [DONE]` and, when
`stream_options.include_usage` is set, a final chunk with empty `choices` and the usage), GET /health,
GET /v1/models, GET /mock/stats ({"requests": n, "chat": n, "completion": n}), GET /mock/last (the last
request body as received) and POST /mock/mode ({"mode": M} switches the server's mode at run time).
A chat request with `tools` (tool_choice not "none") is answered with one call of the chosen tool
(else the first), arguments {"text": <the reply>}, finish_reason "tool_calls".

The answer is deterministic: the text is "You said: " + the last message's content (chat) or the
prompt (completion), or the server's fixed `reply` when it has one (`start_mock_thread(reply="yes")`: a judge
that approves every answer), one whitespace-separated word per token, cut at `max_tokens` (finish "length") or
at the first `stop` string (finish "stop"); every one of `n` choices gets the same text. Streams send
one word per chunk (chat starts with a role chunk), so whole and streamed answers match, usage too.

Modes, for the whole server (`--mode`) or one request (header `X-Mock-Mode`, or
`metadata.mock_mode` in the body, which passes through a gateway unchanged):
    ok      answer normally
    hang    sleep `--hang-s` seconds (default 3600) before the first byte
    die     kill the connection: after `--die-after` chunks (default 2) of a stream, or midway
            through the body of a whole answer (the client sees an incomplete body)
    500     answer 500 with an OpenAI error object (and /health answers 503)
    400     answer 400 with an OpenAI error object (param "messages", code "mock_bad_request")
    401     answer 401 echoing the bearer key received, as OpenAI does ("Incorrect API key provided: KEY", code
            "invalid_api_key"), whole or streamed: a provider error that carries a secret
    error-event  a stream sends `--die-after` chunks, then an SSE error event echoing the bearer key; a whole
            answer is a 500 echoing it
A refused connection is simply a port with no server: `refused_url()`.

A provider that reports garbage usage: `metadata.mock_usage` (a string holding a JSON object, as OpenAI's
metadata values are strings) is merged over the usage the mock computed, in the whole answer and in the
usage chunk; e.g. `{"prompt_tokens": 1e30}`, `{"completion_tokens": -5}`, `{"prompt_tokens": NaN}` (Python's
json reads and writes NaN and Infinity, as a careless provider would send them).

CLI (from the repository root):
    python -m tests.link.mock_openai --port 8001 [--mode ok|hang|die|500|400] [--model mock-model]
        [--hang-s 3600] [--die-after 2] [--chunk-delay 0.0] [--host 127.0.0.1]

In tests (helpers in mock_launch.py, re-exported here):
    from tests.link.mock_openai import refused_url, start_mock_process, start_mock_thread
    with start_mock_thread(mode="ok") as mock:          # or start_mock_process(...) for a real process
        client = openai.OpenAI(base_url=mock.api_base, api_key="x")
        mock.set_mode("hang"); mock.stats()             # switch the fault mode; count requests served
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time
from dataclasses import dataclass, field

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

MODES = ("ok", "hang", "die", "500", "400", "401", "error-event")


class _Killed(Exception):
    """Raised inside a response to make uvicorn drop the connection."""


class _QuietKills(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], _Killed))


@dataclass
class MockOptions:
    mode: str = "ok"
    model: str = "mock-model"
    hang_s: float = 3600.0
    die_after: int = 2
    chunk_delay_s: float = 0.0
    stats: dict = field(default_factory=lambda: {"requests": 0, "chat": 0, "completion": 0})
    last_body: dict | None = None  # the last request body as received (GET /mock/last)
    reply: str | None = None       # a fixed answer text instead of the echo


def _words(content) -> list[str]:
    if isinstance(content, list):  # content parts
        content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content or "").split()


def _answer(body: dict, endpoint: str, reply: str | None = None) -> tuple[list[str], int, str]:
    """(reply words, prompt tokens, finish reason) for a request."""
    if endpoint == "chat":
        messages = body.get("messages") or [{}]
        prompt_tokens = sum(len(_words(m.get("content"))) for m in messages)
        source = _words(messages[-1].get("content"))
    else:
        prompt = body.get("prompt", "")
        prompt = prompt if isinstance(prompt, str) else " ".join(map(str, prompt))
        source = _words(prompt)
        prompt_tokens = len(source)
    words, finish = (reply.split() if reply is not None else ["You", "said:", *source]), "stop"
    stops = body.get("stop") or []
    text = " ".join(words)
    for stop in [stops] if isinstance(stops, str) else stops:
        if stop and stop in text:
            text = text[: text.index(stop)]
    words = text.split(" ") if text else []
    limit = body.get("max_completion_tokens") or body.get("max_tokens")
    if limit is not None and len(words) > limit:
        words, finish = words[:limit], "length"
    return words, prompt_tokens, finish


def _error(status: int, message: str, type_: str, param: str | None, code: str | None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": type_, "param": param, "code": code}}, status_code=status)


def create_mock_app(options: MockOptions | None = None) -> FastAPI:
    """The mock server's app; `options` is shared with the caller (stats, run-time mode)."""
    opts = options or MockOptions()
    app = FastAPI(title="mock OpenAI server")
    app.state.options = opts

    @app.get("/health")
    async def health():
        if opts.mode == "500":
            return JSONResponse({"status": "error"}, status_code=503)
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": opts.model, "object": "model", "created": 0, "owned_by": "mock"}]}

    @app.get("/mock/stats")
    async def stats():
        return opts.stats

    @app.get("/mock/last")
    async def last():
        return opts.last_body or {}

    @app.post("/mock/mode")
    async def set_mode(request: Request):
        mode = (await request.json()).get("mode")
        if mode not in MODES:
            return _error(400, f"mode must be one of {MODES}", "invalid_request_error", "mode", None)
        opts.mode = mode
        return {"mode": mode}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await _respond(request, "chat", opts)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await _respond(request, "completion", opts)

    return app


async def _respond(request: Request, endpoint: str, opts: MockOptions) -> Response:
    body = await request.json()
    opts.last_body = body
    opts.stats["requests"] += 1
    opts.stats[endpoint] += 1
    meta = body.get("metadata") or {}
    mode = request.headers.get("x-mock-mode") or meta.get("mock_mode") or opts.mode
    die_after = int(request.headers.get("x-mock-die-after") or meta.get("mock_die_after") or opts.die_after)
    if mode == "hang":  # until hang_s passes or the client gives up
        deadline = time.monotonic() + opts.hang_s
        while time.monotonic() < deadline and not await request.is_disconnected():
            await asyncio.sleep(0.05)
        if time.monotonic() < deadline:
            return Response(status_code=499)
    if mode == "500":
        return _error(500, "mock internal error", "server_error", None, None)
    if mode == "400":
        return _error(400, "mock bad request: the messages are not acceptable", "invalid_request_error", "messages", "mock_bad_request")
    key = request.headers.get("authorization", "").removeprefix("Bearer ")
    if mode == "401":
        return _error(401, f"Incorrect API key provided: {key}. You can find your API key at "
                      "https://platform.openai.com/account/api-keys.", "invalid_request_error", None, "invalid_api_key")
    if mode == "error-event" and not body.get("stream"):
        return _error(500, f"upstream failure serving key {key}", "server_error", None, None)
    words, prompt_tokens, finish = _answer(body, endpoint, opts.reply)
    n = int(body.get("n") or 1)
    rid = f"mock-{time.monotonic_ns()}"
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n * len(words), "total_tokens": prompt_tokens + n * len(words)}
    if meta.get("mock_usage"):
        usage.update(json.loads(meta["mock_usage"]))
    common = {"id": rid, "created": int(time.time()), "model": body.get("model", opts.model)}
    if endpoint == "chat" and body.get("tools") and body.get("tool_choice") != "none":
        return _tool_call_response(body, common, words, usage)
    if not body.get("stream"):
        text = " ".join(words)
        if endpoint == "chat":
            choices = [{"index": i, "message": {"role": "assistant", "content": text}, "logprobs": None, "finish_reason": finish} for i in range(n)]
        else:
            choices = [{"index": i, "text": text, "logprobs": None, "finish_reason": finish} for i in range(n)]
        payload = json.dumps({**common, "object": "chat.completion" if endpoint == "chat" else "text_completion",
                              "choices": choices, "usage": usage}).encode()
        if mode == "die":
            return _DyingResponse(payload)
        return Response(payload, media_type="application/json")
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    events = _events(endpoint, common, words, finish, n, usage if include_usage else None,
                     die_after if mode == "die" else None, opts.chunk_delay_s)
    if mode == "error-event":
        events = _failing_events(events, die_after, key)
    return StreamingResponse(events, media_type="text/event-stream")


async def _failing_events(events, num_sent: int, key: str):
    """The first `num_sent` events, then an OpenAI error event whose message echoes the bearer `key`."""
    for _ in range(num_sent):
        yield await anext(events)
    await events.aclose()
    error = {"message": f"upstream failure serving key {key}", "type": "server_error", "param": None, "code": None}
    yield f"data: {json.dumps({'error': error})}\n\n"


async def _events(endpoint, common, words, finish, n, usage, die_after, delay):
    obj = "chat.completion.chunk" if endpoint == "chat" else "text_completion"
    extra = {"usage": None} if usage else {}

    def chunk(i, piece, finish_reason=None, role=False):
        if endpoint == "chat":
            delta = {"role": "assistant", "content": ""} if role else ({"content": piece} if piece else {})
            choice = {"index": i, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        else:
            choice = {"index": i, "text": piece, "logprobs": None, "finish_reason": finish_reason}
        return f"data: {json.dumps({**common, 'object': obj, 'choices': [choice], **extra})}\n\n"

    pieces = [chunk(i, "", role=True) for i in range(n)] if endpoint == "chat" else []
    for k, word in enumerate(words):
        pieces += [chunk(i, word if k == 0 else " " + word) for i in range(n)]
    pieces += [chunk(i, "", finish) for i in range(n)]
    if usage:
        pieces.append(f"data: {json.dumps({**common, 'object': obj, 'choices': [], 'usage': usage})}\n\n")
    pieces.append("data: [DONE]\n\n")
    for k, piece in enumerate(pieces):
        if die_after is not None and k >= die_after:
            raise _Killed("mock: dying mid-stream")
        if delay:
            await asyncio.sleep(delay)
        yield piece


def _tool_call_response(body: dict, common: dict, words: list[str], usage: dict) -> Response:
    """With `tools` (and tool_choice not "none"): call the chosen (else the first) tool with {"text": reply}."""
    choice = body.get("tool_choice")
    name = choice["function"]["name"] if isinstance(choice, dict) else body["tools"][0]["function"]["name"]
    call = {"id": "call_mock_0", "type": "function", "function": {"name": name, "arguments": json.dumps({"text": " ".join(words)})}}
    if not body.get("stream"):
        message = {"role": "assistant", "content": None, "tool_calls": [call]}
        return JSONResponse({**common, "object": "chat.completion", "usage": usage,
                             "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": "tool_calls"}]})
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    deltas = [({"role": "assistant", "content": None}, None), ({"tool_calls": [{"index": 0, **call}]}, None), ({}, "tool_calls")]
    events = [{**common, "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": d, "logprobs": None, "finish_reason": f}]}
              for d, f in deltas]
    if include_usage:
        events.append({**common, "object": "chat.completion.chunk", "choices": [], "usage": usage})
    text = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    return Response(text, media_type="text/event-stream")


class _DyingResponse(Response):
    """Announces the full length, sends half the body, then drops the connection."""

    def __init__(self, payload: bytes):
        super().__init__(payload, media_type="application/json")

    async def __call__(self, scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        await send({"type": "http.response.body", "body": self.body[: len(self.body) // 2], "more_body": True})
        raise _Killed("mock: dying mid-body")


def uvicorn_config(app: FastAPI, host: str, port: int) -> uvicorn.Config:
    logging.getLogger("uvicorn.error").addFilter(_QuietKills())
    return uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False, timeout_graceful_shutdown=1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="A mock OpenAI-compatible server with fault modes.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--mode", choices=MODES, default="ok")
    parser.add_argument("--model", default="mock-model", help="the id listed by /v1/models")
    parser.add_argument("--hang-s", type=float, default=3600.0, help="mode hang: seconds before the first byte")
    parser.add_argument("--die-after", type=int, default=2, help="mode die: SSE events sent before the connection drops")
    parser.add_argument("--chunk-delay", type=float, default=0.0, help="seconds between streamed chunks")
    args = parser.parse_args(argv)
    opts = MockOptions(args.mode, args.model, args.hang_s, args.die_after, args.chunk_delay)
    uvicorn.Server(uvicorn_config(create_mock_app(opts), args.host, args.port)).run()


# The helpers that start and stop servers live in mock_launch.py; re-exported for one import line.
from tests.link.mock_launch import (  # noqa: E402, F401
    MockServer, free_port, refused_url, start_mock_process, start_mock_thread, wait_healthy,
)

if __name__ == "__main__":
    main()
