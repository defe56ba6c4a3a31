"""Fewer socket writes per HTTP response: uvicorn's protocol with the writes of one event-loop tick sent together.

    uvicorn.Config(app, http=coalescing_protocol())     # what protocol/drain.py's servers use

uvicorn writes a response's status line and headers as soon as the app sends `http.response.start`, then each
`http.response.body` as its own write: two syscalls for a whole JSON answer, where one suffices. Each write on
loopback also wakes the reader, so on the gateway's hot path the writes cost about as much CPU as the Python
that produces them. Here the connection's transport is wrapped: `write` only appends to a buffer and asks the
event loop to flush it once the current step is done (`loop.call_soon`), so everything written in one step (a
head and its body; a stream's head and first frames) leaves in one `write`. Nothing waits longer than the
step that wrote it; `close` flushes first. Flow control is untouched: the real transport still calls the
protocol's `pause_writing`/`resume_writing`, and its write buffer counts what was flushed.
"""

from __future__ import annotations

import asyncio
from typing import Any


class CoalescingTransport:
    """A stand-in for `transport` whose `write`s of one event-loop step go out as one `transport.write`."""

    __slots__ = ("_transport", "_loop", "_pending")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport, self._loop, self._pending = transport, loop, []

    def write(self, data: bytes) -> None:
        if not data:
            return
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(data)

    def writelines(self, chunks) -> None:
        for data in chunks:
            self.write(data)

    def flush(self) -> None:
        """Write what is buffered (nothing when the transport is closing: its peer is gone)."""
        if self._pending:
            data = self._pending[0] if len(self._pending) == 1 else b"".join(self._pending)
            self._pending = []
            if not self._transport.is_closing():
                self._transport.write(data)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(map(len, self._pending))

    def __getattr__(self, name: str) -> Any:  # everything else is the real transport's
        return getattr(self._transport, name)


def _coalescing(base: type) -> type:
    class Coalescing(base):  # type: ignore[misc, valid-type]
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(CoalescingTransport(transport, asyncio.get_running_loop()))

    Coalescing.__name__ = Coalescing.__qualname__ = f"Coalescing{base.__name__}"
    return Coalescing


def coalescing_protocol() -> type:
    """uvicorn's HTTP/1.1 protocol class with coalesced writes: the httptools one when httptools is installed (C
    parser), else the h11 one; pass it as `uvicorn.Config(http=...)`."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
        return _coalescing(HttpToolsProtocol)
    except ImportError:  # pragma: no cover - httptools is a dependency
        from uvicorn.protocols.http.h11_impl import H11Protocol
        return _coalescing(H11Protocol)

