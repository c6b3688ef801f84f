"""Frames through real ZeroMQ sockets: small metadata as bytes, array frames uncopied."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import zmq

from supervisor.shared.protocol import INFER, VERSION, ZERO_COPY_MIN, Message, encode, pack_arrays
from supervisor.shared.transport import NOBLOCK, readable, recv, send, waiting


@pytest.fixture
def pair() -> Iterator[tuple[zmq.Socket[bytes], zmq.Socket[bytes]]]:
    context = zmq.Context()
    router, dealer = context.socket(zmq.ROUTER), context.socket(zmq.DEALER)
    router.bind("inproc://transport")
    dealer.connect("inproc://transport")
    yield router, dealer
    context.destroy(linger=0)


def test_metadata_as_bytes_and_arrays_as_frames(pair: tuple[zmq.Socket[bytes], ...]) -> None:
    router, dealer = pair
    big = np.arange(ZERO_COPY_MIN // 4 + 3, dtype=np.float32)
    specs, frames = pack_arrays({"big": big, "small": np.ones(3, np.int8)})
    send(dealer, encode(Message(INFER, b"id-1", {"inputs": specs}, frames)))
    got = recv(router)
    identity, version, kind, job_id, header, *arrays = got
    assert all(isinstance(f, bytes) for f in (identity, version, kind, job_id, header))
    assert (version, kind, job_id) == (VERSION, INFER, b"id-1")
    assert all(isinstance(f, zmq.Frame) for f in arrays)  # received without a copy
    view = np.frombuffer(arrays[0].buffer, np.float32)
    assert not view.flags.owndata
    np.testing.assert_array_equal(view, big)
    assert arrays[1].bytes == b"\x01\x01\x01"


def test_replies_through_an_envelope_arrive_whole(pair: tuple[zmq.Socket[bytes], ...]) -> None:
    router, dealer = pair
    send(dealer, [VERSION, INFER, b"x", b"\x80"])
    identity = recv(router)[0]
    send(router, [identity, VERSION, b"result", b"x", b"\x80", b"abc"])
    reply = recv(dealer)
    assert reply[:4] == [VERSION, b"result", b"x", b"\x80"]
    assert isinstance(reply[4], zmq.Frame) and reply[4].bytes == b"abc"


def test_garbage_without_a_version_frame_is_all_bytes(
        pair: tuple[zmq.Socket[bytes], ...]) -> None:
    router, dealer = pair
    send(dealer, [b"a", b"b" * 100_000, b"c"])
    got = recv(router)
    assert [type(f) for f in got] == [bytes] * 4 and got[2] == b"b" * 100_000


def test_noblock_raises_again_when_nothing_waits(pair: tuple[zmq.Socket[bytes], ...]) -> None:
    router, _ = pair
    with pytest.raises(zmq.Again):
        recv(router, NOBLOCK)


@pytest.mark.parametrize("count", [0, 1, 2, 3, 21])
def test_a_turn_reads_what_waits_up_to_its_limit(pair: tuple[zmq.Socket[bytes], ...],
                                                 count: int) -> None:
    """The daemon's read of a readable socket: one message, a pair (known from the
    socket's events, no failed receive), a burst (read until none is left), never more
    than its limit in one turn, in order."""
    router, dealer = pair
    for n in range(count):
        send(dealer, [str(n).encode()])
    if count:
        assert router.poll(5000)
    got = [frames[1] for frames in waiting(router, 16)]
    assert got == [str(n).encode() for n in range(min(count, 16))]
    assert readable(router) == (count > 16)
