"""The cases that once broke the two promises, each replayed against a live daemon: real
supervisor, real worker processes, real ZeroMQ, real signals. Every request gets exactly
one reply; a memory limit holds."""

from __future__ import annotations

import math
import signal
import time
import uuid
from typing import Any

import msgpack
import numpy as np
import pytest
import yaml
import zmq

from supervisor.shared.protocol import INFER, VERSION, Message, decode, pack_arrays, unpack_arrays
from tests.conftest import Supervisor
from tests.test_faults import RawClient, codes, markers


class Raw:
    """A DEALER that sends hand-made requests and waits for exactly one reply to each."""

    def __init__(self, sup: Supervisor) -> None:
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(sup.endpoint)

    def send(self, header: Any, arrays: list[bytes]) -> bytes:
        job_id = uuid.uuid4().bytes
        self.sock.send_multipart([VERSION, INFER, job_id,
                                  msgpack.packb(header, use_bin_type=True), *arrays])
        return job_id

    def send_arrays(self, model: str, arrays: dict[str, np.ndarray],
                    **extra: Any) -> bytes:
        specs, frames = pack_arrays(arrays)
        return self.send({"model": model, "inputs": specs, **extra},
                         [bytes(f) for f in frames])

    def replies(self, ids: list[bytes], wait: float = 60.0) -> dict[bytes, list[Message]]:
        got: dict[bytes, list[Message]] = {}
        deadline = time.monotonic() + wait
        while not all(i in got for i in ids) and time.monotonic() < deadline:
            if self.sock.poll(100):
                msg = decode(self.sock.recv_multipart())
                got.setdefault(msg.job_id, []).append(msg)
        while self.sock.poll(300):  # a second reply to anything would be a bug
            msg = decode(self.sock.recv_multipart())
            got.setdefault(msg.job_id, []).append(msg)
        missing = [i for i in ids if i not in got]
        assert not missing, f"{len(missing)} request(s) never answered"
        assert all(len(v) == 1 for v in got.values()), "a request answered twice"
        return got

    def close(self) -> None:
        self.sock.close()


def code_of(msg: Message) -> str:
    return "ok" if msg.kind == b"result" else str(msg.header["code"])


def x(value: float, rows: int = 1) -> dict[str, np.ndarray]:
    return {"x": np.full((rows, 4), value, np.float32)}


def test_hostile_headers_get_bad_request_and_block_no_one(supervisor_factory: Any) -> None:
    sup = supervisor_factory({"models": {"m": markers(1)}})
    raw = Raw(sup)
    try:
        spec = {"name": "x", "dtype": "float32", "shape": [1, 4]}
        hostile = [raw.send({"model": "m", "inputs": [spec], "timeout_ms": math.nan},
                            [bytes(16)]) for _ in range(300)]
        hostile += [raw.send({"model": "m", "inputs": [dict(spec, dtype=["float32"])]},
                             [bytes(16)]),
                    raw.send({"model": "m", "inputs": [dict(spec, dtype={"a": 1})]},
                             [bytes(16)]),
                    raw.send({"model": "m", "inputs": [spec], "timeout_ms": math.inf},
                             [bytes(16)])]
        fine = [raw.send_arrays("m", x(float(i)), timeout_ms=30_000) for i in range(5)]
        got = raw.replies(hostile + fine)
    finally:
        raw.close()
    assert {code_of(got[i][0]) for i in hostile} == {"bad_request"}
    assert [code_of(got[i][0]) for i in fine] == ["ok"] * 5
    assert "Traceback" not in sup.log()


def test_a_huge_handler_error_is_answered_and_the_worker_serves_on(
        supervisor_factory: Any) -> None:
    sup = supervisor_factory({"models": {"m": {"handler": "tests.live_handlers:big_error",
                                               "workers": 1}}})
    with sup.client(timeout=30) as client:
        with pytest.raises(Exception) as err:
            client.infer("m", x(1.0))
        assert getattr(err.value, "code", None) == "internal"
        assert len(getattr(err.value, "message", "")) <= 4096
        assert client.infer("m", x(2.0))["x"][0, 0] == 2.0


def test_a_handler_asking_for_recycle_never_gets_its_mates_blamed(
        supervisor_factory: Any) -> None:
    model = {"handler": "worker.handlers:echo", "workers": 2,
             "batching": {"max_batch_size": 1},
             "options": {"recycle_after": 3}, "policy": {"max_attempts": 1}}
    sup = supervisor_factory({"models": {"m": model}})
    raw = RawClient(sup)
    try:
        sent = [raw.send(float(i)) for i in range(30)]
        replies = raw.collect(30, wait=120)
    finally:
        raw.close()
    assert set(replies) == set(sent)
    assert codes(replies) == ["ok"] * 30
    assert sup.status()["models"]["m"]["recycles"].get("requested", 0) >= 5


def test_kill_memory_counts_as_a_try_and_the_job_is_answered(
        supervisor_factory: Any) -> None:
    sup = supervisor_factory({"supervisor": {"poll_interval": "0.1s"}, "models": {"m": {
        "handler": "tests.live_handlers:hog", "workers": 1,
        "options": {"hog_bytes": 300 * 1024**2, "hold_seconds": 5.0},
        "policy": {"kill_memory": "250MiB", "max_attempts": 2}}}})
    with sup.client(timeout=120) as client:
        with pytest.raises(Exception) as err:
            client.infer("m", x(1.0))
        assert getattr(err.value, "code", None) == "worker_crashed"
        assert "over kill_memory" in getattr(err.value, "message", "")
    assert sup.status()["models"]["m"]["recycles"].get("kill_memory") == 2


def test_a_reload_removing_a_model_answers_its_queue(supervisor_factory: Any) -> None:
    config: dict[str, Any] = {"models": {"m": markers(1, sleep=3.0), "other": markers(1)}}
    sup = supervisor_factory(config)
    raw = RawClient(sup)
    try:
        sent = [raw.send(-2.0)]  # one busy (alone: jobs read together are batched together)
        sup.wait_for(lambda s: s["models"]["m"]["in_flight"] == 1, 30, "the job running")
        sent += [raw.send(float(i)) for i in range(6)]  # 6 queued
        sup.wait_for(lambda s: s["models"]["m"]["queued"] == 6, 30, "six queued")
        del config["models"]["m"]
        sup.config_path.write_text(yaml.safe_dump({**config, "supervisor": yaml.safe_load(
            sup.config_path.read_text())["supervisor"]}))
        sup.process.send_signal(signal.SIGHUP)
        replies = raw.collect(7, wait=60)
    finally:
        raw.close()
    assert set(replies) == set(sent) and all(len(r) == 1 for r in replies.values())
    sup.wait_for(lambda s: "m" not in s["models"], 60, "model m forgotten")


def test_rows_of_one_client_never_reach_another(supervisor_factory: Any) -> None:
    sup = supervisor_factory({"models": {"m": {"handler": "tests.live_handlers:undeclared",
                                               "workers": 1}}})
    raw = Raw(sup)
    try:
        odd = [raw.send_arrays("m", {"a": np.full((1, 2), 7, np.float32),
                                     "b": np.zeros((0, 2), np.float32)}) for _ in range(20)]
        even = [raw.send_arrays("m", {"a": np.full((1, 2), i, np.float32),
                                      "b": np.full((1, 2), i, np.float32)})
                for i in range(20)]
        got = raw.replies(odd + even)
    finally:
        raw.close()
    for i, job_id in enumerate(even):
        out = unpack_arrays(got[job_id][0].header["outputs"], got[job_id][0].arrays)
        assert out["b"].shape == (1, 2) and out["b"][0, 0] == i
    for job_id in odd:
        msg = got[job_id][0]
        if msg.kind == b"result":
            out = unpack_arrays(msg.header["outputs"], msg.arrays)
            assert out["b"].shape == (0, 2), "another client's rows"


@pytest.mark.parametrize("content", [b"\xff\xfe not utf-8", b"models: {m: {handler: 'a:b',"
                                     b" policy: {max_memory: .inf}}}",
                                     b"models: {m: {handler: 'a:b', workers: " +
                                     b"9" * 400 + b"}}",
                                     b"models: {m: {saved_model: \"a\\0b\"}}"])
def test_a_bad_config_on_sighup_is_rejected_and_nothing_is_lost(
        supervisor_factory: Any, content: bytes) -> None:
    sup = supervisor_factory({"models": {"m": markers(1, sleep=2.0)}})
    raw = RawClient(sup)
    try:
        sent = [raw.send(-2.0), raw.send(1.0)]
        sup.config_path.write_bytes(content)
        sup.process.send_signal(signal.SIGHUP)
        replies = raw.collect(2, wait=30)
    finally:
        raw.close()
    assert codes(replies) == ["ok", "ok"] and set(replies) == set(sent)
    assert sup.process.poll() is None
    assert '"event": "config_rejected"' in sup.log()


def test_a_lower_heartbeat_on_reload_kills_no_worker(supervisor_factory: Any) -> None:
    sup = supervisor_factory({"supervisor": {"heartbeat_interval": "2s",
                                             "heartbeat_timeout": "10s"},
                              "models": {"m": markers(2)}})
    pids = {w["pid"] for w in sup.workers("m")}
    config = yaml.safe_load(sup.config_path.read_text())
    config["supervisor"].update(heartbeat_interval="0.1s", heartbeat_timeout="0.5s")
    sup.config_path.write_text(yaml.safe_dump(config))
    sup.process.send_signal(signal.SIGHUP)
    sup.wait_for(lambda s: '"event": "config_reloaded"' in sup.log(), 30, "reloaded")
    deadline = time.monotonic() + 5  # 10 of the new timeouts, 2.5 of the old intervals
    while time.monotonic() < deadline:
        assert {w["pid"] for w in sup.workers("m")} == pids
        time.sleep(0.2)
    assert '"event": "worker_hung"' not in sup.log()


def test_queues_are_bounded_in_bytes_and_messages_as_a_whole(
        supervisor_factory: Any) -> None:
    sup = supervisor_factory({"supervisor": {"max_queue_bytes": "2MiB",
                                             "max_message_size": "1MiB"},
                              "models": {"m": markers(1, sleep=2.0)}})
    raw = Raw(sup)
    try:
        frames = [np.zeros((230_000 // 16 + 1, 4), np.float32) for _ in range(5)]
        specs, packed = pack_arrays({f"x{i}": f for i, f in enumerate(frames)})
        whole = raw.send({"model": "m", "inputs": specs}, [bytes(p) for p in packed])
        busy = raw.send_arrays("m", x(-2.0))
        big = [raw.send_arrays("m", x(float(i), rows=30_000)) for i in range(6)]  # 480 KB
        got = raw.replies([whole, busy, *big])
    finally:
        raw.close()
    assert code_of(got[whole][0]) == "bad_request"
    assert "max_message_size" in got[whole][0].header["message"]
    outcome = [code_of(got[i][0]) for i in big]
    assert outcome.count("ok") == 4 and outcome.count("overloaded") == 2


def test_shutdown_answers_what_arrives_at_the_end(supervisor_factory: Any) -> None:
    sup = supervisor_factory({"models": {"m": markers(1, sleep=1.0)}})
    raw = RawClient(sup)
    try:
        first = raw.send(-2.0)
        sup.wait_for(lambda s: s["models"]["m"]["in_flight"] == 1, 30, "the job running")
        sup.process.send_signal(signal.SIGTERM)
        late = [raw.send(float(i)) for i in range(20)]
        replies = raw.collect(21, wait=30)
    finally:
        raw.close()
    assert set(replies) == {first, *late}
    assert replies[first][0].kind == b"result"
    assert all(replies[j][0].header["code"] == "shutting_down" for j in late)
    assert sup.process.wait(30) == 0
    assert '"event": "worker_boot_failed"' not in sup.log()

