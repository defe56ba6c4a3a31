"""Server-sent events as OpenAI streams them: one `data: <json>` event per chunk, `data: [DONE]` last.

    yield frame({"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [...]})
    yield DONE
"""

from __future__ import annotations

import json

DONE = b"data: [DONE]\n\n"


def frame(payload: dict) -> bytes:
    """One server-sent event carrying `payload` as compact JSON."""
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"
