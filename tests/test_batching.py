"""Dynamic batching: which jobs combine, padding, splitting, isolation of bad jobs."""

from __future__ import annotations

import uuid
from collections import deque
from typing import Any

import numpy as np
import pytest
import zmq

from supervisor.batching import BatchPolicy, powers_of_two, take_batch
from supervisor.config import parse_config
from supervisor.protocol import (
    INFER,
    JOB,
    RESULT,
    Message,
    TensorSpec,
    decode,
    encode,
    pack_arrays,
    unpack_arrays,
)
from supervisor.router import Job
from supervisor.settings import ConfigErrors
from tests.conftest import Supervisor
from worker.batch import run_batch
from worker.runners import Runner


def job(i: int, rows: int = 1, dtype: str = "float32", width: int = 4, t: float = 0.0,
        deadline: float | None = None) -> Job:
    specs, frames = pack_arrays({"x": np.full((rows, width), i, dtype)})
    return Job(i, "m", [], str(i).encode(), specs, frames, received_at=t, deadline=deadline)


POLICY = BatchPolicy.from_config(8, 0.0, None)


def test_default_sizes_are_powers_of_two() -> None:
    assert powers_of_two(32) == (1, 2, 4, 8, 16, 32)
    assert powers_of_two(24) == (1, 2, 4, 8, 16, 24)
    assert POLICY.pad_to(3) == 4 and POLICY.pad_to(8) == 8 and POLICY.pad_to(9) == 9
    custom = BatchPolicy.from_config(12, 5.0, (12, 3))
    assert custom.allowed == (3, 12) and custom.pad_to(4) == 12 and custom.timeout == 0.005


def test_compatible_jobs_combine_up_to_max_rows_in_order() -> None:
    queue = deque([job(1, 3), job(2, 2), job(3, 4), job(4, 3)])
    batch = take_batch(queue, POLICY, 0.0)
    assert [j.id for j in batch] == [1, 2, 4]  # 3+2+3 = 8; job 3 (4 rows) would overflow
    assert [j.id for j in queue] == [3]


def test_incompatible_jobs_are_never_mixed() -> None:
    queue = deque([job(1), job(2, dtype="float64"), job(3, width=5), job(4)])
    assert [j.id for j in take_batch(queue, POLICY, 0.0)] == [1, 4]
    assert [j.id for j in take_batch(queue, POLICY, 0.0)] == [2]
    assert [j.id for j in take_batch(queue, POLICY, 0.0)] == [3]


def test_batching_off_and_solo_jobs() -> None:
    off = BatchPolicy.from_config(1, 0.0, None)
    queue = deque([job(1), job(2)])
    assert [j.id for j in take_batch(queue, off, 0.0)] == [1]
    queue = deque([job(1), job(2), job(3)])
    queue[1].solo = True
    assert [j.id for j in take_batch(queue, POLICY, 0.0)] == [1, 3]
    assert [j.id for j in take_batch(queue, POLICY, 0.0)] == [2]


def test_partial_batch_waits_for_the_timeout_unless_full() -> None:
    waiting = BatchPolicy.from_config(4, 50.0, None)
    queue = deque([job(1, t=10.0), job(2, t=10.01)])
    assert take_batch(queue, waiting, 10.02) == []  # 2 of 4 rows, 30 ms left to wait
    assert [j.id for j in take_batch(queue, waiting, 10.06)] == [1, 2]
    full = deque([job(i, t=10.0) for i in range(4)])
    assert len(take_batch(full, waiting, 10.0)) == 4


def test_expired_jobs_are_left_for_the_deadline_pass() -> None:
    queue = deque([job(1, deadline=5.0), job(2), job(3, deadline=5.0), job(4)])
    assert [j.id for j in take_batch(queue, POLICY, 6.0)] == [2, 4]
    assert [j.id for j in queue] == [1, 3]


def test_batching_settings_are_validated() -> None:
    config = parse_config("models: {m: {handler: 'a:b', batching: {max_batch_size: 16, "
                          "batch_timeout_ms: 2}}}")
    assert config.models["m"].batch_policy.allowed == (1, 2, 4, 8, 16)
    with pytest.raises(ConfigErrors, match="largest size must be max_batch_size"):
        parse_config("models: {m: {handler: 'a:b', batching: {max_batch_size: 16, "
                     "allowed_batch_sizes: [4, 8]}}}")


# --- worker side, in process --------------------------------------------------------------

def batch_message(parts: list[dict[str, np.ndarray]], pad_to: int) -> Message:
    jobs, frames = [], []
    for i, arrays in enumerate(parts):
        specs, own = pack_arrays(arrays)
        jobs.append({"id": str(i), "inputs": specs})
        frames.extend(own)
    return Message(JOB, b"", {"jobs": jobs, "pad_to": pad_to}, frames)


class Doubler:
    """Records the batch shapes it sees; fails on a row whose first value is -1."""

    inputs = [TensorSpec("x", "float32", (None, 2))]

    def __init__(self) -> None:
        self.seen: list[tuple[int, ...]] = []

    def __call__(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.seen.append(inputs["x"].shape)
        if (inputs["x"][:, 0] == -1).any():
            raise ValueError("poisoned row")
        return {"y": inputs["x"] * 2}


def outputs(replies: list[Message]) -> dict[bytes, Any]:
    out: dict[bytes, Any] = {}
    for reply in replies:
        if reply.kind == RESULT:
            out[reply.job_id] = unpack_arrays(reply.header["outputs"], reply.arrays)["y"]
        else:
            out[reply.job_id] = reply.header["code"]
    return out


def test_worker_pads_runs_once_and_splits() -> None:
    model = Doubler()
    runner = Runner(model, model.inputs, None)
    parts = [{"x": np.full((rows, 2), i, np.float32)} for i, rows in enumerate([1, 3, 1])]
    got = outputs(run_batch(runner, batch_message(parts, pad_to=8)))
    assert model.seen == [(8, 2)]  # one call, padded from 5 rows to 8
    for i, rows in enumerate([1, 3, 1]):
        np.testing.assert_array_equal(got[str(i).encode()], np.full((rows, 2), 2 * i))


def test_a_bad_job_never_fails_its_batch_mates() -> None:
    model = Doubler()
    runner = Runner(model, model.inputs, None)
    parts = [{"x": np.ones((1, 2), np.float32)}, {"x": np.ones((1, 3), np.float32)},
             {"x": np.full((1, 2), -1, np.float32)}, {"x": np.full((2, 2), 3, np.float32)}]
    got = outputs(run_batch(runner, batch_message(parts, pad_to=4)))
    assert got[b"1"] == "bad_request"  # wrong shape: answered alone, never joined the batch
    assert got[b"2"] == "internal"  # the model failed on it: found by running each alone
    np.testing.assert_array_equal(got[b"0"], np.full((1, 2), 2))
    np.testing.assert_array_equal(got[b"3"], np.full((2, 2), 6))


# --- end to end ---------------------------------------------------------------------------

def send_all(sup: Supervisor, values: list[float]) -> dict[bytes, Message]:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(sup.endpoint)
    ids = {}
    try:
        for value in values:
            specs, frames = pack_arrays({"x": np.full((1, 4), value, np.float32)})
            job_id = uuid.uuid4().bytes
            ids[job_id] = value
            sock.send_multipart(encode(Message(INFER, job_id, {"model": "m", "inputs": specs},
                                               frames)))
        replies: dict[bytes, Message] = {}
        while len(replies) < len(values) and sock.poll(20_000):
            msg = decode(sock.recv_multipart())
            assert msg.job_id not in replies  # exactly one reply each
            replies[msg.job_id] = msg
    finally:
        sock.close()
    return {job_id: replies[job_id] for job_id in ids}


def test_jobs_are_batched_end_to_end(supervisor_factory: Any) -> None:
    sup = supervisor_factory({"models": {"m": {
        "handler": "worker.handlers:echo", "workers": 1, "options": {"delay": 0.05},
        "batching": {"max_batch_size": 8, "batch_timeout_ms": 30}}}})
    values = [float(i) for i in range(40)]
    replies = send_all(sup, values)
    for value, msg in zip(values, replies.values(), strict=True):
        assert msg.kind == b"result"
        np.testing.assert_array_equal(unpack_arrays(msg.header["outputs"], msg.arrays)["x"],
                                      np.full((1, 4), value))
    batches = sup.status()["models"]["m"]["batches"]
    assert batches["mean_rows"] > 2, batches  # 40 jobs in far fewer calls
    assert batches["sent"] < 20


def test_poison_job_in_a_batch_fails_alone(supervisor_factory: Any) -> None:
    sup = supervisor_factory({"models": {"m": {
        "handler": "worker.handlers:echo", "workers": 1, "options": {"crash_on": -1.0},
        "batching": {"max_batch_size": 8, "batch_timeout_ms": 200},
        "policy": {"max_attempts": 2}}}})
    replies = send_all(sup, [1.0, 2.0, -1.0, 3.0])
    kinds = [(m.kind, m.header.get("code")) for m in replies.values()]
    assert kinds == [(b"result", None), (b"result", None), (b"error", "worker_crashed"),
                     (b"result", None)]
    sup.wait_ready(30)
    with sup.client() as client:  # the pool recovered
        assert client.infer("m", {"x": np.ones((1, 4), np.float32)})["x"].shape == (1, 4)


def test_large_batches_of_many_inputs(supervisor_factory: Any) -> None:
    """32 jobs of 3 arrays each: one batch message of 96 arrays to the worker."""
    from concurrent.futures import ThreadPoolExecutor

    inputs = {name: {"dtype": "float32", "shape": [None, 2]} for name in ("a", "b", "c")}
    sup = supervisor_factory({"models": {"m": {
        "handler": "worker.handlers:echo", "workers": 1,
        "options": {"inputs": inputs, "delay": 0.3},
        "batching": {"max_batch_size": 32, "batch_timeout_ms": 100}}}})
    client = sup.client()

    def one(i: int) -> bool:
        arrays = {n: np.full((1, 2), i, np.float32) for n in ("a", "b", "c")}
        out = client.infer("m", arrays)
        return all(float(out[n][0, 0]) == i for n in ("a", "b", "c"))

    with ThreadPoolExecutor(32) as pool:
        assert all(pool.map(one, range(64)))
    client.close()
    assert sup.status()["models"]["m"]["batches"]["mean_rows"] > 4
