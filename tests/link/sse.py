"""Reading server-sent events strictly, for the gateway tests.

    payloads = sse_payloads(text)    # the `data: ` payloads as sent, `[DONE]` checked and dropped
    chunks = sse_events(text)        # the same, parsed as JSON
"""

from __future__ import annotations

import json


def sse_payloads(text: str) -> list[str]:
    """The payloads of an SSE body in which every event is one `data: ` line followed by a blank line and the
    last (and only the last) is `data: [DONE]`; fails the test otherwise."""
    assert text.endswith("\n\n"), text[-200:]
    blocks = text[:-2].split("\n\n")
    assert all(b.startswith("data: ") and "\n" not in b for b in blocks), blocks
    assert blocks[-1] == "data: [DONE]" and blocks.count("data: [DONE]") == 1, blocks[-3:]
    return [b[len("data: "):] for b in blocks[:-1]]


def sse_events(text: str) -> list:
    """`sse_payloads`, each parsed as JSON."""
    return [json.loads(p) for p in sse_payloads(text)]
