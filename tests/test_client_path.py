"""The clients' per-call path against a scripted server: replies the caller's own, a Client
shared by threads, and the AsyncClient's outbox (the next sends of calls resumed together go
together, never one of a call that ended before it went)."""

from __future__ import annotations

import asyncio
import random
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import msgpack
import numpy as np
import pytest
import zmq

from supervisor.aclient import AsyncClient
from supervisor.client import Client, NoReply
from supervisor.shared.protocol import (
    INFER,
    MODELS,
    RESULT,
    Message,
    decode,
    encode,
)
from supervisor.testing import short_tmpdir

MODELS_HEADER = {"models": {"m": {"inputs": [{"name": "x", "dtype": "float32",
                                                "shape": [None, 4]}], "ready": 1}}}


class Scripted:
    """A ROUTER in a thread answering like a supervisor: an echo of each job's arrays as its
    RESULT (header {"outputs": the request's inputs}), the same MODELS reply every time. It
    counts the jobs it got. ``together``: replies held until that many are due (or nothing
    came for 20 ms), then sent at once, as a supervisor answers a batch."""

    def __init__(self, together: int = 1) -> None:
        self.together = together
        self.dir = short_tmpdir()
        self.endpoint = f"ipc://{self.dir}/scripted.sock"
        self.jobs: list[bytes] = []
        self.headers: list[bytes] = []  # each job's header, as it came
        self._sock = zmq.Context.instance().socket(zmq.ROUTER)
        self._sock.bind(self.endpoint)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        due: list[list[Any]] = []
        while not self._stop.is_set():
            if not self._sock.poll(20):
                self._send(due)
                continue
            peer, *frames = self._sock.recv_multipart()
            msg = decode(frames)
            if msg.kind == INFER:
                self.jobs.append(msg.job_id)
                self.headers.append(frames[3])
                reply = Message(RESULT, msg.job_id, {"outputs": msg.header["inputs"]},
                                msg.arrays)
            else:
                reply = Message(MODELS, msg.job_id, MODELS_HEADER)
            due.append([peer, *encode(reply)])
            if len(due) >= self.together:
                self._send(due)

    def _send(self, due: list[list[Any]]) -> None:
        for frames in due:
            self._sock.send_multipart(frames)
        due.clear()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._sock.close(linger=0)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def scripted() -> Iterator[Scripted]:
    server = Scripted()
    try:
        yield server
    finally:
        server.close()


def shapes() -> list[tuple[int, ...]]:
    """Shapes repeated in a random order: replies whose headers repeat, and new ones."""
    rng = random.Random(7)
    return [rng.choice([(1, 4), (2, 4), (3,), (2, 2, 2), (0, 4)]) for _ in range(60)]


@pytest.mark.parametrize("kind", ["Client", "AsyncClient"])
def test_models_replies_are_the_callers_own(scripted: Scripted, kind: str) -> None:
    """The same MODELS reply twice: what the first call returned, changed by its caller,
    changes nothing the second returns."""
    async def both() -> list[dict[str, Any]]:
        async with AsyncClient(scripted.endpoint, timeout=10) as client:
            return [await client.models(), await client.models()]

    if kind == "Client":
        with Client(scripted.endpoint, timeout=10) as sync:
            first = sync.models()
            first["m"]["inputs"].clear()
            first["m"]["ready"] = 0
            second = sync.models()
    else:
        first, second = asyncio.run(both())
        first["m"]["inputs"].clear()
        first["m"]["ready"] = 0
        async def again() -> dict[str, Any]:
            async with AsyncClient(scripted.endpoint, timeout=10) as client:
                return await client.models()
        second = asyncio.run(again())
    assert second == MODELS_HEADER["models"]


def test_calls_resumed_together_send_together_and_each_get_their_own_answer() -> None:
    """Replies that come in batches resume their calls together, whose next sends wait for
    one flush: every job is sent once and each call answered with its own arrays."""
    server = Scripted(together=10)
    flushes: list[int] = []

    async def go() -> list[float]:
        async with AsyncClient(server.endpoint, timeout=10) as client:
            link = client._link(server.endpoint)
            flush = link._flush
            link._flush = lambda: (flushes.append(len(link.outbox)), flush())[1]  # type: ignore[method-assign]

            async def calls(task: int) -> list[float]:
                got = []
                for i in range(task * 100, task * 100 + 20):
                    out = await client.infer("m", {"x": np.full((1, 4), float(i), np.float32)})
                    got.append(float(out["x"][0, 0]))
                return got
            per_task = await asyncio.gather(*(calls(t) for t in range(30)))
            return [v for got in per_task for v in got]

    try:
        got = asyncio.run(go())
    finally:
        server.close()
    assert got == [float(i) for t in range(30) for i in range(t * 100, t * 100 + 20)]
    assert len(server.jobs) == len(set(server.jobs)) == 600
    assert max(flushes) > 1  # some sends did go together


def test_a_call_that_ends_before_its_turn_is_over_is_never_sent(scripted: Scripted) -> None:
    """Cancelled while its message waits in the outbox: the message never leaves (it was not
    sent, as a call cancelled before its send never was); the call after it is served."""
    async def go() -> None:
        async with AsyncClient(scripted.endpoint, timeout=10) as client:
            await client.infer("m", {"x": np.ones((1, 4), np.float32)})  # connected
            link = client._link(scripted.endpoint)
            link.flush_due = True  # a flush due, as after a read of several replies
            doomed = asyncio.ensure_future(client.infer("m", {"x": np.ones((1, 4),
                                                                          np.float32)}))
            await asyncio.sleep(0)  # it runs up to its wait: in the outbox
            assert len(link.outbox) == 1
            doomed.cancel()
            with pytest.raises(asyncio.CancelledError):
                await doomed
            link._flush()  # the flush that was due
            out = await client.infer("m", {"x": np.full((1, 4), 5.0, np.float32)})
            assert float(out["x"][0, 0]) == 5.0

    asyncio.run(go())
    assert len(scripted.jobs) == 2


def test_closing_with_calls_in_the_outbox_ends_them_with_no_reply(scripted: Scripted) -> None:
    async def go() -> None:
        client = AsyncClient(scripted.endpoint, timeout=10)
        await client.infer("m", {"x": np.ones((1, 4), np.float32)})
        link = client._link(scripted.endpoint)
        link.flush_due = True  # a flush due, as after a read of several replies
        calls = [asyncio.ensure_future(client.infer("m", {"x": np.ones((1, 4), np.float32)}))
                 for _ in range(3)]
        await asyncio.sleep(0)  # they run up to their wait: in the outbox
        assert len(link.outbox) == 3
        await client.close()
        for call in calls:
            with pytest.raises(NoReply, match="closed"):
                await call

    asyncio.run(go())
    assert len(scripted.jobs) == 1


def test_a_drop_while_a_call_waits_ends_it_at_once() -> None:
    """The connection drops with the job out: the wait ends when the monitor hears of it
    (not at the timeout), and without retry_unanswered the call says it may have run."""
    workdir = short_tmpdir()
    endpoint = f"ipc://{workdir}/silent.sock"
    server = zmq.Context.instance().socket(zmq.ROUTER)
    server.bind(endpoint)
    try:
        with Client(endpoint, timeout=30, retry_unanswered=False) as client:
            outcome: list[BaseException] = []

            def call() -> None:
                try:
                    client.infer("m", {"x": np.ones((1, 4), np.float32)})
                except NoReply as exc:
                    outcome.append(exc)

            caller = threading.Thread(target=call)
            started = time.monotonic()
            caller.start()
            assert server.poll(10_000)  # the job is out, and will never be answered
            server.close(linger=0)
            caller.join(20)
            assert not caller.is_alive()
            assert time.monotonic() - started < 10
        assert len(outcome) == 1 and "may have run" in str(outcome[0])
    finally:
        server.close(linger=0)
        shutil.rmtree(workdir, ignore_errors=True)


def test_a_first_try_carries_the_timeout_as_given(scripted: Scripted) -> None:
    """The same call twice sends the same header bytes, with the caller's timeout less the
    time its verdict needs to come back: the supervisor knows a header by its bytes (one
    refreshed from the clock varied by 1 ms)."""
    x = {"x": np.ones((1, 4), np.float32)}
    with Client(scripted.endpoint, timeout=7.5) as client:
        for _ in range(20):
            client.infer("m", x)

    async def twice() -> None:
        async with AsyncClient(scripted.endpoint, timeout=7.5) as aclient:
            for _ in range(20):
                await aclient.infer("m", x)

    asyncio.run(twice())
    assert len(set(scripted.headers)) == 1
    assert msgpack.unpackb(scripted.headers[0])["timeout_ms"] == int(7.5 / 1.1 * 1000)


def test_a_call_ends_within_its_timeout_and_says_whether_the_job_may_have_run() -> None:
    """timeout=5 gave up after 5.6 s, and "no supervisor reachable ... within 5.6s" (after
    0.02 s) did not say that the job never left (issue 47)."""
    workdir = short_tmpdir()
    silent = zmq.Context.instance().socket(zmq.ROUTER)  # takes jobs, never answers
    silent.bind(f"ipc://{workdir}/silent.sock")
    x = {"x": np.ones((1, 4), np.float32)}
    try:
        with Client(f"ipc://{workdir}/silent.sock", timeout=3) as client:
            started = time.monotonic()
            with pytest.raises(NoReply) as sent:
                client.infer("m", x)
            waited = time.monotonic() - started
        assert 3 <= waited < 3.3, waited  # its own deadline: not 10 % and 100 ms more
        assert "within 3s: the job was sent, so it may have run" in sent.value.message
        frames = silent.recv_multipart()
        assert decode(frames[1:]).header["timeout_ms"] < 3000  # its verdict has time back
        with Client(f"ipc://{workdir}/nobody.sock", timeout=0.3) as client, \
                pytest.raises(NoReply) as unsent:
            client.infer("m", x)
        message = unsent.value.message
        assert "of the 0.3s timeout): the job was never sent, so it did not run" in message
        assert "within" not in message, message
    finally:
        silent.close(linger=0)
        shutil.rmtree(workdir, ignore_errors=True)


def test_one_client_shared_by_threads_answers_every_call_its_own(scripted: Scripted) -> None:
    """Eight threads share one Client (documented safe to share) and send calls of shapes
    none sent before: each call gets its own arrays back and none fails (a memo of reply
    headers the threads shared, since removed, dropped its oldest entry with a read then a
    delete, and two threads dropping the same one raced: KeyError)."""
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can
    errors: list[BaseException] = []
    try:
        with Client(scripted.endpoint, timeout=30) as client:
            def hammer(thread: int) -> None:
                try:
                    for call in range(600):
                        data = np.full((1, 1 + thread * 1000 + call), float(call), np.float32)
                        np.testing.assert_array_equal(client.infer("m", {"x": data})["x"],
                                                      data)
                except BaseException as exc:  # every failure is reported below
                    errors.append(exc)

            threads = [threading.Thread(target=hammer, args=(n,)) for n in range(8)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
    finally:
        sys.setswitchinterval(switch)
    assert not errors, errors[:3]


@pytest.mark.parametrize("timeout", [float("nan"), float("inf"), -1.0, 0, 1e9, True, "5"])
def test_a_timeout_no_call_can_wait_is_refused_before_anything_is_sent(timeout: Any) -> None:
    """NaN, infinity and 1e9 failed deep in ZeroMQ's poll with a bare OverflowError or
    ValueError; -1 waited "-1s" for nothing."""
    nobody = "ipc:///tmp/tfs-nobody-listens.sock"
    with pytest.raises(ValueError, match="timeout must be a number of seconds"):
        Client(nobody, timeout=timeout)
    with pytest.raises(ValueError, match="timeout must be a number of seconds"):
        AsyncClient(nobody, timeout=timeout)
    with Client(nobody, timeout=0.3) as client:
        with pytest.raises(ValueError, match="timeout must be a number of seconds"):
            client.infer("m", {"x": np.zeros(1)}, timeout=timeout)
        with pytest.raises(ValueError, match="timeout must be a number of seconds"):
            client.models(timeout=timeout)

    async def call() -> None:
        async with AsyncClient(nobody, timeout=0.3) as client:
            with pytest.raises(ValueError, match="timeout must be a number of seconds"):
                await client.infer("m", {"x": np.zeros(1)}, timeout=timeout)

    asyncio.run(call())


def test_inputs_that_are_not_a_mapping_are_refused_by_name() -> None:
    with Client("ipc:///tmp/tfs-nobody-listens.sock", timeout=0.3) as client, \
            pytest.raises(TypeError, match="mapping of input name to array, got ndarray"):
        client.infer("m", np.zeros((1, 4)))  # type: ignore[arg-type]
