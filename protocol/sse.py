"""Server-sent events as OpenAI streams them: one `data: <json>` event per chunk, `data: [DONE]` last.

    yield frame({"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [...]})
    yield DONE
"""

from __future__ import annotations

from contextvars import ContextVar

from protocol.fast_json import dumps

DONE = b"data: [DONE]\n\n"
# How many more events of the stream being relayed are already in memory (parsed from the same network read) when
# a chunk is handed on: set by the reader of a backend's SSE (link/backends/openai_http.py) before each chunk, 0
# once it waits for the network or stops. A relay may then hold this chunk's frame and write it with the next ones
# in one send (fewer writes, same bytes, no added wait: the held frames' successors are computed without I/O).
# It lives in the iterating task's context, as generators run in the context of whoever iterates them.
READY_AHEAD: ContextVar[int] = ContextVar("sse_ready_ahead", default=0)


def frame(payload: dict) -> bytes:
    """One server-sent event carrying `payload` as compact JSON."""
    return b"data: " + dumps(payload) + b"\n\n"
