"""The core path with real processes and sockets, using TF-free handler workers."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgpack
import numpy as np
import psutil
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from supervisor.aclient import AsyncClient
from supervisor.client import (
    BadRequest,
    Client,
    JobError,
    NoReply,
    Unavailable,
    UnknownModel,
)
from supervisor.core.lifecycle import EXTERNAL_KILL_NOTE
from supervisor.shared.protocol import INFER, MODELS, VERSION, Message, decode, encode, pack_arrays
from tests.conftest import Supervisor, echo_model, start_supervisor

SLEEP_MARK = -2.0


@pytest.fixture(scope="module")
def echo_sup() -> Iterator[Supervisor]:
    sup = start_supervisor({"models": {
        "echo": echo_model(2, sleep_on=SLEEP_MARK, sleep_seconds=0.5),
        "pair": {"handler": "worker.handlers:echo", "workers": 1, "options": {"inputs": {
            "a": {"dtype": "int32", "shape": [None, 3]},
            "b": {"dtype": "float64", "shape": [None]}}}},
    }})
    try:
        sup.wait_ready()
        yield sup
    finally:
        sup.stop()


def x(rows: int = 2, value: float = 1.0) -> dict[str, np.ndarray]:
    return {"x": np.full((rows, 4), value, dtype=np.float32)}


def test_echo_round_trip(echo_sup: Supervisor) -> None:
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    with echo_sup.client() as client:
        out = client.infer("echo", {"x": data})
    np.testing.assert_array_equal(out["x"], data)
    assert out["x"].dtype == np.float32


def test_large_arrays_travel_intact(echo_sup: Supervisor) -> None:
    data = np.random.default_rng(1).standard_normal((4096, 4)).astype(np.float32)  # 64 KiB
    with echo_sup.client() as client:
        out = client.infer("echo", {"x": data})
    np.testing.assert_array_equal(out["x"], data)


def test_several_inputs_and_dtypes(echo_sup: Supervisor) -> None:
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    b = np.array([0.5, 1.5])
    with echo_sup.client() as client:
        out = client.infer("pair", {"a": a, "b": b})
    np.testing.assert_array_equal(out["a"], a)
    np.testing.assert_array_equal(out["b"], b)


def test_models_lists_specs(echo_sup: Supervisor) -> None:
    with echo_sup.client() as client:
        models = client.models()
    assert models["echo"]["inputs"] == [{"name": "x", "dtype": "float32", "shape": [None, 4]}]
    assert models["echo"]["ready_workers"] == 2
    assert models["pair"]["available"] is True


def test_both_workers_get_jobs_and_concurrent_clients(echo_sup: Supervisor) -> None:
    before = {w["id"]: w["jobs"] for w in echo_sup.workers("echo")}
    client = echo_sup.client()

    def one(i: int) -> bool:
        out = client.infer("echo", x(1, float(i)))
        return bool(out["x"][0, 0] == i)

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(200)))
    client.close()
    assert all(results)
    after = {w["id"]: w["jobs"] for w in echo_sup.workers("echo")}
    assert sum(after.values()) - sum(before.values()) == 200
    assert all(after[w] > before.get(w, 0) for w in after), after


def test_async_client(echo_sup: Supervisor) -> None:
    async def go() -> list[float]:
        async with AsyncClient(echo_sup.endpoint, timeout=10) as client:
            outs = await asyncio.gather(*(client.infer("echo", x(1, float(i)))
                                          for i in range(20)))
            models = await client.models()
            assert "echo" in models
            return [float(o["x"][0, 0]) for o in outs]

    assert asyncio.run(go()) == [float(i) for i in range(20)]


def test_async_client_under_many_calls_times_out_and_goes_on(echo_sup: Supervisor) -> None:
    """Hundreds of calls in flight on one socket (replies are read many per wake-up), a call
    whose job outlives its timeout, and the same client serving on afterwards."""
    async def go() -> None:
        async with AsyncClient(echo_sup.endpoint, timeout=10) as client:
            outs = await asyncio.gather(*(client.infer("echo", x(1, float(i)))
                                          for i in range(500)))
            assert [float(o["x"][0, 0]) for o in outs] == [float(i) for i in range(500)]
            start = time.monotonic()
            with pytest.raises(JobError) as err:  # the worker sleeps 0.5 s on this one: no
                # reply within the timeout (or deadline_exceeded if it was still queued)
                await client.infer("echo", x(1, SLEEP_MARK), timeout=0.2)
            assert err.value.code in ("no_reply", "deadline_exceeded"), err.value
            assert time.monotonic() - start < 2.0
            out = await client.infer("echo", x(1, 7.0))  # the late result is not this one
            assert float(out["x"][0, 0]) == 7.0

    asyncio.run(go())


def test_async_client_with_nobody_listening_is_no_reply() -> None:
    async def go() -> None:
        async with AsyncClient("ipc:///tmp/tfs-nobody-listens.sock", timeout=0.3) as client:
            with pytest.raises(NoReply):
                await client.infer("echo", x())

    start = time.monotonic()
    asyncio.run(go())
    assert time.monotonic() - start < 5.0


def test_unknown_model(echo_sup: Supervisor) -> None:
    with echo_sup.client() as client, pytest.raises(UnknownModel) as err:
        client.infer("nope", x())
    assert err.value.code == "unknown_model"
    assert "echo" in err.value.message


@pytest.mark.parametrize(("inputs", "fragment"), [
    ({"x": np.zeros((2, 4), np.float64)}, "float64"),
    ({"x": np.zeros((2, 5), np.float32)}, "does not fit"),
    ({"y": np.zeros((2, 4), np.float32)}, "do not match"),
    ({"x": np.zeros((2, 4), np.float32), "z": np.zeros(2, np.float32)}, "do not match"),
])
def test_wrong_inputs_refused_at_admission(echo_sup: Supervisor, inputs: dict[str, Any],
                                          fragment: str) -> None:
    with echo_sup.client() as client, pytest.raises(BadRequest) as err:
        client.infer("echo", inputs)
    assert fragment in err.value.message
    assert "float32[None, 4]" in err.value.message or "x" in err.value.message


def test_disagreeing_batch_sizes_refused(echo_sup: Supervisor) -> None:
    with echo_sup.client() as client, pytest.raises(BadRequest, match="batch size"):
        client.infer("pair", {"a": np.zeros((2, 3), np.int32), "b": np.zeros(3)})


def _raw(sup: Supervisor, frames: list[bytes], wait: float = 2.0) -> list[bytes] | None:
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(sup.endpoint)
    try:
        sock.send_multipart(frames)
        if sock.poll(wait * 1000):
            return list(sock.recv_multipart())
        return None
    finally:
        sock.close()


@pytest.mark.parametrize("frames", [
    [b"garbage"],
    [b"a", b"", b""],
    [b"TFS9", INFER, b"j", b"\x80"],
    [VERSION, b"launch", b"j", msgpack.packb({})],
    [VERSION, INFER, b"j", b"\xc1\xff not msgpack"],
    [VERSION, INFER, b"j", msgpack.packb([1, 2])],
    [VERSION, INFER, b"j", msgpack.packb({"model": "echo"})],
    [VERSION, INFER, b"j", msgpack.packb({"model": "echo", "inputs": [
        {"name": "x", "dtype": "float32", "shape": [2, 4]}]}), b"short"],
    [VERSION, INFER, b"j", msgpack.packb({"model": "echo", "inputs": [
        {"name": "x", "dtype": "object", "shape": [1]}]}), b"12345678"],
    [VERSION, INFER, b"j" * 100, msgpack.packb({})],
])
def test_garbage_is_answered_and_daemon_serves_on(echo_sup: Supervisor,
                                                  frames: list[bytes]) -> None:
    reply = _raw(echo_sup, frames)
    assert reply is not None
    msg = decode(reply)
    assert msg.kind == b"error"
    assert msg.header["code"] == "bad_request"
    with echo_sup.client() as client:
        assert client.infer("echo", x())["x"].shape == (2, 4)


def test_req_socket_clients_are_served(echo_sup: Supervisor) -> None:
    """A plain REQ socket (what many languages' simplest client is) works too."""
    specs, frames = pack_arrays(x(1, 7.0))
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(echo_sup.endpoint)
    try:
        sock.send_multipart(encode(Message(INFER, b"req-1", {"model": "echo",
                                                             "inputs": specs}, frames)))
        assert sock.poll(10_000)
        msg = decode(sock.recv_multipart())
    finally:
        sock.close()
    assert msg.kind == b"result" and msg.job_id == b"req-1"


def test_client_timeout_is_no_reply() -> None:
    with Client("ipc:///tmp/tfs-nobody-listens.sock", timeout=0.3) as client, \
            pytest.raises(NoReply):
        client.infer("echo", x())


def _valid_frames(value: float = 1.0) -> list[bytes]:
    specs, frames = pack_arrays(x(1, value))
    return [bytes(f) for f in encode(Message(INFER, b"ok", {"model": "echo", "inputs": specs},
                                             frames))]


def test_supervisor_memory_flat_under_100k_hostile_frames(echo_sup: Supervisor) -> None:
    proc = psutil.Process(echo_sup.process.pid)
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(echo_sup.endpoint)
    rng = np.random.default_rng(3)
    valid = _valid_frames()

    def hostile() -> list[bytes]:
        kind = int(rng.integers(0, 3))
        if kind == 0:  # random frames
            return [rng.bytes(int(rng.integers(0, 200))) for _ in range(int(rng.integers(1, 6)))]
        frames = list(valid)
        if kind == 1:  # truncated: frames dropped from the end, or a frame cut short
            cut = int(rng.integers(1, len(frames)))
            frames = [*frames[:cut], frames[cut][:int(rng.integers(0, len(frames[cut]) + 1))]]
        else:  # mutated: random bytes flipped in a random frame
            i = int(rng.integers(0, len(frames)))
            data = bytearray(frames[i] or b"\0")
            data[int(rng.integers(0, len(data)))] ^= 0xFF
            frames[i] = bytes(data)
        return frames

    def burst(frame_count: int) -> tuple[int, int]:
        sent = frames = got = 0
        while frames < frame_count:
            for _ in range(500):  # read in between: ZeroMQ drops replies past the peer's HWM
                message = hostile()
                sock.send_multipart(message)
                sent, frames = sent + 1, frames + len(message)
            while got < sent and sock.poll(5000):
                sock.recv_multipart()
                got += 1
        return sent, got

    burst(20_000)
    before = proc.memory_info().rss
    sent, replies = burst(100_000)
    after = proc.memory_info().rss
    sock.close()
    assert replies == sent  # every message answered, the mutants that stayed valid included
    assert after - before < 5 * 1024 * 1024, (before, after)
    with echo_sup.client() as client:
        assert client.infer("echo", x())["x"].shape == (2, 4)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzzed_messages_get_one_reply_each(echo_sup: Supervisor, data: st.DataObject) -> None:
    frames = data.draw(st.one_of(
        st.lists(st.binary(max_size=100), min_size=1, max_size=6),
        st.builds(lambda v, i, junk: [*v[:i], junk, *v[i + 1:]],
                  st.just(_valid_frames()), st.integers(0, 4), st.binary(max_size=64))))
    if (len(frames) >= 2 and frames[1] == b"") or not frames[0]:
        frames = [b"x", *frames]  # keep the REQ-envelope shape out of this test
    reply = _raw(echo_sup, frames, wait=5.0)
    assert reply is not None
    # A mutant whose kind frame became a valid request kind is a valid request: a `models`
    # request gets the model list, not an error.
    answers = {b"error", b"result"} | ({MODELS} if frames[1:2] == [MODELS] else set())
    assert decode(reply).kind in answers


def test_string_jobs_through_a_handler_and_bad_string_frames_at_admission(
        supervisor_factory: Any) -> None:
    sup = supervisor_factory({"models": {"words": echo_model(
        1, inputs={"s": {"dtype": "string", "shape": [None]}})}})
    words = np.array(["ünïcode", "", "x" * 1000], dtype=object)
    with sup.client() as client:
        assert client.infer("words", {"s": words})["s"].tolist() == \
            [w.encode() for w in words]
        with pytest.raises(BadRequest, match="string"):
            client.infer("words", {"s": np.ones(3, np.float32)})
    spec = {"name": "s", "dtype": "string", "shape": [2]}
    for frame, fragment in ((b"\x01\x00\x00\x00\x09\x00\x00\x00ab", b"add up to 10"),
                            (b"\x01\x00", b"cannot hold")):
        reply = _raw(sup, encode(Message(INFER, b"bad", {"model": "words", "inputs": [spec]},
                                         [frame])))
        assert reply is not None
        msg = decode(reply)
        assert msg.header["code"] == "bad_request" and fragment.decode() in msg.header["message"]


def test_oversized_messages_are_dropped_silently(supervisor_factory: Any) -> None:
    sup = supervisor_factory({"supervisor": {"max_message_size": "1MiB"},
                              "models": {"echo": echo_model(1)}})
    with sup.client(timeout=2) as client:
        with pytest.raises(NoReply):
            client.infer("echo", {"x": np.zeros((100_000, 4), np.float32)})  # 1.6 MB
        assert client.infer("echo", x())["x"].shape == (2, 4)


# --- destructive: each with its own supervisor -------------------------------------------

def test_killed_worker_is_replaced_and_its_job_answered(supervisor_factory: Any) -> None:
    sup = supervisor_factory({"models": {"echo": echo_model(
        2, sleep_on=SLEEP_MARK, sleep_seconds=1.5)}})
    pids = {w["pid"] for w in sup.workers("echo")}
    result: dict[str, Any] = {}

    def slow_job() -> None:
        with sup.client(timeout=30) as client:
            result["out"] = client.infer("echo", x(1, SLEEP_MARK))

    thread = threading.Thread(target=slow_job)
    thread.start()
    status = sup.wait_for(lambda s: any(w["in_flight"] for w in s["models"]["echo"]["workers"]),
                          10, "job in flight")
    victim = next(w for w in status["models"]["echo"]["workers"] if w["in_flight"])
    os.kill(victim["pid"], signal.SIGKILL)
    thread.join(30)
    assert result["out"]["x"][0, 0] == SLEEP_MARK  # requeued to the other worker, answered
    status = sup.wait_ready()
    new_pids = {w["pid"] for w in status["models"]["echo"]["workers"]}
    assert victim["pid"] not in new_pids and len(new_pids) == 2 and new_pids != pids
    assert EXTERNAL_KILL_NOTE in sup.log()


def test_model_that_cannot_load_is_unavailable_with_backoff(supervisor_factory: Any) -> None:
    sup = supervisor_factory({"models": {
        "good": echo_model(1),
        "bad": {"handler": "worker.handlers:broken", "options": {"message": "weights missing"}},
    }}, wait=False)
    sup.wait_for(lambda s: s["models"]["good"]["workers"] and
                 s["models"]["good"]["workers"][0]["state"] == "ready", 60, "good ready")
    sup.wait_for(lambda s: not s["models"]["bad"]["available"], 30, "bad unavailable")
    with sup.client(timeout=10) as client:
        with pytest.raises(Unavailable, match="weights missing"):
            client.infer("bad", x())
        assert client.infer("good", x())["x"].shape == (2, 4)
    time.sleep(4)
    starts = sup.log().count('"worker_boot_failed"')
    # 1 s, 2 s, 4 s back-off: at most 4 failed starts in ~5 s, not a hot loop.
    assert 1 <= starts <= 4, starts
    assert '"exit": "exit 3 (LOAD_ERROR)"' in sup.log()


def test_sigterm_stops_cleanly_and_reaps_workers(supervisor_factory: Any) -> None:
    sup = supervisor_factory({"models": {"echo": echo_model(2)}})
    pids = [w["pid"] for w in sup.workers("echo")]
    assert sup.stop() == 0
    time.sleep(0.2)
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"
                   for p in pids)


def test_workers_die_with_a_killed_supervisor(supervisor_factory: Any) -> None:
    sup = supervisor_factory({"models": {"echo": echo_model(2)}})
    pids = [w["pid"] for w in sup.workers("echo")]
    sup.process.kill()
    sup.process.wait()
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline and any(psutil.pid_exists(p) for p in pids):
        time.sleep(0.05)
    alive = [p for p in pids if psutil.pid_exists(p) and
             psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not alive


def test_async_client_closed_at_once_leaves_nothing_behind(echo_sup: Supervisor) -> None:
    """A link's first read and watch are scheduled when it opens: closing the client before
    they run must leave no callback failing on a closed socket, and no reader registered."""
    errors: list[dict[str, Any]] = []

    async def go() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _, context: errors.append(context))
        client = AsyncClient(echo_sup.endpoint, timeout=10)
        link = client._link(echo_sup.endpoint)
        await client.close()
        for _ in range(5):
            await asyncio.sleep(0)
        assert not any(loop.remove_reader(fd) for fd in link.fds)  # none left registered
        async with AsyncClient(echo_sup.endpoint, timeout=10) as again:
            assert float((await again.infer("echo", x(1, 3.0)))["x"][0, 0]) == 3.0

    asyncio.run(go())
    assert errors == []


def test_async_client_with_thousands_of_calls_out_loses_none(echo_sup: Supervisor) -> None:
    """More calls out at once than the supervisor queues replies to one connection (1000):
    the client takes every reply as it comes, so each call gets its own answer (its echo,
    or 'overloaded' past the model's max_queue), and none is lost on the way (no_reply)."""
    async def one(client: AsyncClient, i: int) -> str:
        try:
            out = await client.infer("echo", x(1, float(i)))
        except JobError as exc:
            return exc.code
        return "ok" if float(out["x"][0, 0]) == float(i) else "wrong"

    async def go() -> list[str]:
        async with AsyncClient(echo_sup.endpoint, timeout=20) as client:
            return await asyncio.gather(*(one(client, i) for i in range(6000)))

    outcomes = asyncio.run(go())
    assert set(outcomes) <= {"ok", "overloaded"}, {o: outcomes.count(o) for o in set(outcomes)}
    assert "ok" in outcomes
