"""The HTTP front's framing, without sockets: Triton's binary tensor layout and JSON tensors
(round trips and fuzzing), and the connection's promise that every request gets exactly one
answer, in order, however its bytes are split and pipelined."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httptools
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from supervisor.front import server, tensors
from supervisor.front.errors import HttpError
from supervisor.front.messages import Request, Response, json_response
from supervisor.shared.arrays import WIRE_DTYPES

NUMERIC = [d for d in tensors.OIP_DTYPES.values() if d != "string"]


@given(st.lists(st.binary(max_size=40), max_size=30))
def test_bytes_framing_round_trips(items: list[bytes]) -> None:
    framed = tensors.join_strings(items)
    assert tensors.split_strings("s", memoryview(framed), len(items)) == items
    spec, frame = tensors.from_binary("s", "string", [len(items)], memoryview(framed))
    assert tensors.binary_of(spec, frame) == framed  # and back to Triton's layout
    assert tensors.strings_of(frame, len(items)) == items


@given(st.binary(max_size=200), st.integers(0, 50))
def test_bytes_framing_refuses_garbage_with_a_clear_error(data: bytes, expected: int) -> None:
    try:
        items = tensors.split_strings("s", memoryview(data), expected)
    except HttpError as error:
        assert error.status == 400 and "'s'" in error.message
    else:
        assert len(items) == expected and tensors.join_strings(items) == data


@given(st.sampled_from(NUMERIC), st.lists(st.integers(0, 5), min_size=1, max_size=3),
       st.data())
def test_numeric_binary_and_json_agree(wire: str, shape: list[int], data: Any) -> None:
    dtype = WIRE_DTYPES[wire]
    count = int(np.prod(shape))
    raw = data.draw(st.binary(min_size=count * dtype.itemsize,
                              max_size=count * dtype.itemsize))
    if wire == "bool" and any(byte > 1 for byte in raw):
        with pytest.raises(HttpError, match="BOOL data must be bytes 0 or 1"):
            tensors.from_binary("x", wire, shape, memoryview(raw))
        return
    spec, frame = tensors.from_binary("x", wire, shape, memoryview(raw))
    assert bytes(frame) == raw  # as it came: no copy, no change
    values = tensors.json_values(spec, frame)
    array = np.frombuffer(raw, dtype)
    if dtype.kind == "f" and not np.isfinite(array).all():
        return  # JSON has no NaN: such tensors travel binary
    again = tensors.from_values("x", wire, shape, values)[1]
    assert again == raw
    with pytest.raises(HttpError):
        tensors.from_binary("x", wire, shape, memoryview(raw + b"\0" * dtype.itemsize))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner,
                                                                   max_size=3), max_leaves=20)


@given(st.sampled_from([*NUMERIC, "string"]), json_values,
       st.none() | st.lists(st.integers(0, 4), max_size=3))
def test_any_json_is_a_tensor_or_a_400(wire: str, value: Any, shape: list[int] | None) -> None:
    try:
        spec, frame = tensors.from_values("x", wire, shape, value)
    except HttpError as error:
        assert error.status == 400
    else:
        assert shape is None or spec["shape"] == shape
        if wire != "string":  # the frame is exactly what the spec describes
            assert len(frame) == int(np.prod(spec["shape"])) * WIRE_DTYPES[wire].itemsize


# --- one answer per request, in order ------------------------------------------------------


class FakeTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.out = bytearray()
        self.closed = self.aborted = False

    def write(self, data: Any) -> None:
        self.out += bytes(data)

    def writelines(self, parts: Any) -> None:
        for part in parts:
            self.write(part)

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = self.aborted = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def answers(raw: bytes) -> list[tuple[int, bytes]]:
    got: list[tuple[int, bytes]] = []

    class Collect:
        body = b""

        def on_body(self, body: bytes) -> None:
            self.body += body

        def on_message_complete(self) -> None:
            got.append((parser.get_status_code(), self.body))
            self.body = b""

    parser = httptools.HttpResponseParser(Collect())
    parser.feed_data(raw)
    return got


def run_with(answer: Any, run: Any) -> FakeTransport:
    """``run()`` on a fresh event loop, the connection's handler replaced by ``answer``."""
    original = server.answer
    server.answer = answer
    try:
        transport: FakeTransport = asyncio.run(run())
    finally:
        server.answer = original
    return transport


def request_bytes(i: int, body: bytes, chunked: bool, close: bool) -> bytes:
    head = f"POST /echo/{i} HTTP/1.1\r\nHost: x\r\n"
    if close:
        head += "Connection: close\r\n"
    if chunked:
        payload = b"".join(b"%x\r\n%s\r\n" % (len(part), part)
                           for part in (body[:3], body[3:]) if part) + b"0\r\n\r\n"
        return (head + "Transfer-Encoding: chunked\r\n\r\n").encode() + payload
    return (head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.binary(max_size=30), st.booleans()), min_size=1, max_size=20),
       st.lists(st.integers(1, 50), max_size=40), st.sampled_from(["keep", "close", "garbage"]),
       st.data())
def test_every_request_gets_one_answer_in_order_however_it_is_split(
        bodies: list[tuple[bytes, bool]], cuts: list[int], end: str, data: Any) -> None:
    """Pipelined requests, fixed-length and chunked bodies, the bytes cut at random places
    and handlers finishing out of order: the answers are one per request, in request
    order, each its own; `Connection: close` on the last ends the connection after it, and
    bytes that are no request after the last get one 400, after every other answer."""
    close_last = end == "close"
    delays = data.draw(st.lists(st.integers(0, 3), min_size=len(bodies),
                                max_size=len(bodies)))
    raw = b"".join(request_bytes(i, body, chunked, close_last and i == len(bodies) - 1)
                   for i, (body, chunked) in enumerate(bodies))
    if end == "garbage":
        raw += b"NOT HTTP\0\r\n\r\n"

    async def answer(front: Any, request: Request) -> tuple[str, Response]:
        index = int(request.path.rsplit("/", 1)[1])
        for _ in range(delays[index]):  # some handlers take longer than later ones
            await asyncio.sleep(0)
        return "/echo", json_response({"i": index, "body": request.body.hex()})

    async def run() -> FakeTransport:
        limits = server.Limits(1 << 20, 30.0, 30.0, 100, None)
        conn = server.HttpConnection(None, limits, server.Connections())  # type: ignore
        transport = FakeTransport()
        conn.connection_made(transport)
        at = 0
        for cut in [*cuts, len(raw)]:
            conn.data_received(raw[at:at + cut])
            at += cut
            await asyncio.sleep(0)
            if at >= len(raw):
                break
        if at < len(raw):
            conn.data_received(raw[at:])
        for _ in range(200):
            await asyncio.sleep(0)
        conn.connection_lost(None)
        return transport

    transport = run_with(answer, run)
    got = answers(bytes(transport.out))
    if end == "garbage":
        status, error = got.pop()
        assert status == 400 and b"malformed" in error and transport.closed
    assert [status for status, _ in got] == [200] * len(bodies)
    assert [json.loads(body) for _, body in got] == [
        {"i": i, "body": body.hex()} for i, (body, _) in enumerate(bodies)]
    assert transport.closed or end == "keep"


def test_a_client_that_takes_no_answer_is_cut_off() -> None:
    """Its answers would pile up in the front: once writing has waited request_timeout for
    the client to read, the connection is aborted."""
    async def answer(front: Any, request: Request) -> tuple[str, Response]:
        return "/x", json_response({"big": "x" * 1000})

    async def run() -> FakeTransport:
        conn = server.HttpConnection(None, server.Limits(1 << 20, 0.05, 30.0, 100, None),
                                     server.Connections())  # type: ignore[arg-type]
        transport = FakeTransport()
        conn.connection_made(transport)
        conn.pause_writing()  # the client's window is full
        conn.data_received(request_bytes(0, b"", False, False) * 3)
        for _ in range(200):
            if transport.aborted:
                break
            await asyncio.sleep(0.01)
        return transport

    transport = run_with(answer, run)
    assert transport.aborted and len(answers(bytes(transport.out))) == 1


def test_a_request_after_a_broken_one_is_not_answered() -> None:
    """Bytes the parser cannot read end the connection with one 400: nothing after them is
    taken for a request."""
    async def run() -> FakeTransport:
        conn = server.HttpConnection(None, server.Limits(1 << 20, 30.0, 30.0, 100, None),
                                     server.Connections())  # type: ignore[arg-type]
        transport = FakeTransport()
        conn.connection_made(transport)
        conn.data_received(b"GET / HTTP/1.1\r\nBad Header\r\n\r\nGET /again HTTP/1.1\r\n\r\n")
        await asyncio.sleep(0)
        return transport

    transport = asyncio.run(run())
    got = answers(bytes(transport.out))
    assert [status for status, _ in got] == [400] and transport.closed
