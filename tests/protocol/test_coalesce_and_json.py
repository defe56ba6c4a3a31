"""protocol/coalesce.py (the writes of one event-loop step leave as one) and protocol/fast_json.py (the same JSON
values as the standard library), against a recording transport and json itself."""

from __future__ import annotations

import asyncio
import json
import math

import pytest

from protocol.coalesce import CoalescingTransport, coalescing_protocol
from protocol.fast_json import JSONBytesResponse, dumps, loads, loads_lenient


class RecordingTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name, default=None):
        return {"peername": ("127.0.0.1", 5)}.get(name, default)


def test_writes_of_one_step_leave_in_one_write_and_in_order():
    async def go():
        real = RecordingTransport()
        transport = CoalescingTransport(real, asyncio.get_running_loop())
        transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
        transport.write(b"")
        transport.write(b"body")
        assert real.writes == [] and transport.get_write_buffer_size() == len(b"HTTP/1.1 200 OK\r\n\r\nbody")
        await asyncio.sleep(0)  # the step ends: one flush
        transport.write(b"next")
        await asyncio.sleep(0)
        transport.write(b"last")
        transport.close()  # flushes before closing
        return real

    real = asyncio.run(go())
    assert real.writes == [b"HTTP/1.1 200 OK\r\n\r\nbody", b"next", b"last"] and real.closed


def test_nothing_is_written_to_a_closing_transport_and_other_attributes_pass_through():
    async def go():
        real = RecordingTransport()
        transport = CoalescingTransport(real, asyncio.get_running_loop())
        transport.write(b"late")
        real.closed = True  # the peer went away before the flush
        await asyncio.sleep(0)
        return real, transport.get_extra_info("peername")

    real, peer = asyncio.run(go())
    assert real.writes == [] and peer == ("127.0.0.1", 5)


def test_the_protocol_class_wraps_the_connection_transport():
    cls = coalescing_protocol()
    assert cls.__name__.startswith("Coalescing") and "connection_made" in cls.__dict__


@pytest.mark.parametrize("value", [
    {"id": "chatcmpl-1", "choices": [{"delta": {"content": "héllo ✓ \u2028"}}], "usage": None},
    [1, 2.5, -0.0, True, None, "a\"b\\c\n", {"nested": [{}]}],
    {"big": 2**62, "small": 1e-300},
])
def test_dumps_writes_the_standard_librarys_values(value):
    text = dumps(value)
    assert text == json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()  # byte for byte
    assert json.loads(text) == value and loads(text) == value
    assert loads(json.dumps(value)) == value


def test_integers_beyond_64_bits_are_written_exactly():
    value = {"prompt": [[170, 1586640155897144421646336, -(2**70)]]}
    assert dumps(value) == json.dumps(value, separators=(",", ":")).encode()


def test_keys_that_are_numbers_become_strings_as_in_json_dumps():
    assert json.loads(dumps({1: "a", 2.5: "b"})) == json.loads(json.dumps({1: "a", 2.5: "b"}))


def test_lenient_loads_reads_nan_and_infinity_that_strict_loads_refuses():
    with pytest.raises(ValueError):
        loads(b'{"x": NaN}')
    assert math.isnan(loads_lenient(b'{"x": NaN}')["x"]) and loads_lenient(b"[Infinity]") == [math.inf]
    with pytest.raises(ValueError):
        loads_lenient(b"{not json")


def test_json_bytes_response_renders_compact_utf8():
    response = JSONBytesResponse({"a": "é", "b": [1, 2]})
    assert response.body == '{"a":"é","b":[1,2]}'.encode() and response.headers["content-length"] == str(len(response.body))
