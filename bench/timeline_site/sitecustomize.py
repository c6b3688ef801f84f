"""Per-hop timestamps for bench/timeline.py, in every process of a run.

Python imports ``sitecustomize`` at start-up from the path; bench/timeline.py puts this folder
on PYTHONPATH with TFS_TIMELINE_OUT set, so the client it runs, the supervisor (or bare
broker) and the worker each note, on the monotonic clock shared by all processes of the
machine:

- ``W`` (start, end): a wait that came back with a message: ``zmq_poll`` or a ``Poller.poll``
  with a timeout that found something ready, a blocking ``recv_multipart``;
- ``S`` (start, end): a message sent by the main thread: ``send_multipart`` or the project's
  ``transport.send`` (a worker's heartbeats go from a thread of their own).

About 1 µs an event (two clock reads, a write to mapped memory), a few events a job. Each
process writes TFS_TIMELINE_OUT/PID.json (who it is) and PID.bin (its events, as they
happen). Without TFS_TIMELINE_OUT nothing is patched.
"""

from __future__ import annotations

import json
import mmap
import os
import sys
import threading
import time
from typing import Any

OUT = os.environ.get("TFS_TIMELINE_OUT")
CAPACITY = 1 << 20  # events a process keeps; past this many, the rest are not noted


def _open() -> memoryview:
    """Events go to a file mapped into memory: the kernel keeps what was written even when
    the process is killed (the bare broker's scripts end by SIGKILL, or ignore SIGTERM while
    ZeroMQ's I/O thread takes it). Slot 0 holds the count; then each event's kind (its
    character's code), start and end."""
    base = f"{OUT}/{os.getpid()}"
    with open(base + ".json", "w") as file:
        json.dump({"pid": os.getpid(), "ppid": os.getppid(), "argv": sys.argv[1:]}, file)
    with open(base + ".bin", "w+b") as file:
        file.truncate((1 + 3 * CAPACITY) * 8)
        return memoryview(mmap.mmap(file.fileno(), 0)).cast("q")


def _note(kind: str, start: int, end: int) -> None:
    count = SLOTS[0]
    if count < CAPACITY:
        at = 1 + 3 * count
        SLOTS[at], SLOTS[at + 1], SLOTS[at + 2] = ord(kind), start, end
        SLOTS[0] = count + 1


def _patch() -> None:
    import zmq
    import zmq.backend
    import zmq.sugar.poll

    clock = time.monotonic_ns
    poll = zmq.backend.zmq_poll

    def zmq_poll(items: Any, timeout: int = -1) -> Any:
        start = clock()
        ready = poll(items, timeout)
        if timeout != 0 and ready:
            _note("W", start, clock())
        return ready

    zmq.backend.zmq_poll = zmq_poll  # type: ignore[assignment]  # before anyone imports it
    zmq.sugar.poll.zmq_poll = zmq_poll  # type: ignore[attr-defined,assignment]  # Poller.poll
    send_multipart, recv_multipart = zmq.Socket.send_multipart, zmq.Socket.recv_multipart

    main = threading.main_thread().ident

    def timed_send(self: Any, *args: Any, **kwargs: Any) -> Any:
        start = clock()
        sent = send_multipart(self, *args, **kwargs)
        if threading.get_ident() == main:  # not the worker's heartbeat thread
            _note("S", start, clock())
        return sent

    def timed_recv(self: Any, flags: int = 0, *args: Any, **kwargs: Any) -> Any:
        start = clock()
        frames = recv_multipart(self, flags, *args, **kwargs)
        if not flags:
            _note("W", start, clock())
        return frames

    zmq.Socket.send_multipart = timed_send  # type: ignore[method-assign]
    zmq.Socket.recv_multipart = timed_recv  # type: ignore[method-assign]
    from supervisor.shared import transport
    send = transport.send

    def transport_send(sock: Any, frames: Any, flags: int = 0) -> None:
        start = clock()
        send(sock, frames, flags)
        if threading.get_ident() == main:
            _note("S", start, clock())

    transport.send = transport_send


if OUT:
    SLOTS = _open()
    _patch()
