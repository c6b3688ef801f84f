"""Dynamic batching: which jobs combine, padding, splitting, isolation of bad jobs."""

from __future__ import annotations

import math
import uuid
from collections import deque
from typing import Any

import numpy as np
import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.config.keys import BatchPolicy, powers_of_two
from supervisor.config.loading import parse_config
from supervisor.config.settings import ConfigErrors
from supervisor.core.actions import SendBatch
from supervisor.core.batch_wait import MAX_WAIT, BatchWait, Costs
from supervisor.core.batching import take_batch
from supervisor.core.jobs import Job
from supervisor.core.router import LAG, Router
from supervisor.shared.protocol import (
    INFER,
    INTERNAL_HOP,
    JOB,
    MAX_ERROR_TEXT,
    RESULT,
    JobEntry,
    Message,
    TensorSpec,
    decode,
    encode,
    pack_arrays,
    pack_job,
    pack_results,
    unpack_arrays,
    unpack_job,
    unpack_results,
)
from tests.conftest import Supervisor
from worker.batch import run_batch
from worker.runners import Runner


def job(i: int, rows: int = 1, dtype: str = "float32", width: int = 4, t: float = 0.0,
        deadline: float | None = None) -> Job:
    specs, frames = pack_arrays({"x": np.full((rows, width), i, dtype)})
    return Job(i, "m", [], str(i).encode(), specs, frames, received_at=t, deadline=deadline,
               rows=rows)


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
    entries = []
    for i, arrays in enumerate(parts):
        specs, own = pack_arrays(arrays)
        entries.append(JobEntry(str(i).encode(), specs, own))
    msg = pack_job(entries, pad_to)
    return decode(encode(msg), INTERNAL_HOP)  # as the worker receives it


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


class Mirror:
    """Declares no inputs (like a handler that does not say) and returns what it gets."""

    inputs = None

    def __init__(self) -> None:
        self.seen: list[dict[str, tuple[int, ...]]] = []

    def __call__(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.seen.append({name: array.shape for name, array in inputs.items()})
        return {name: np.array(array) for name, array in inputs.items()}


def replies_by_id(replies: list[Message]) -> dict[bytes, Message]:
    by_id = {reply.job_id: reply for reply in replies}
    assert len(by_id) == len(replies)  # one answer each
    return by_id


def test_a_job_without_one_batch_size_is_never_batched() -> None:
    """{a: 1 row, b: 0 rows} batched with another client's job once got that client's row."""
    model = Mirror()
    runner = Runner(model, None, None)
    f32 = np.float32
    parts = [{"a": np.full((1, 2), 1, f32), "b": np.zeros((0, 2), f32)},
             {"a": np.full((1, 2), 2, f32), "b": np.full((1, 2), 2, f32)},
             {"a": np.array(3, f32), "b": np.array(3, f32)},
             {},
             {"a": np.full((2, 2), 4, f32), "b": np.full((2, 2), 4, f32)}]
    got = replies_by_id(run_batch(runner, batch_message(parts, pad_to=4)))
    for job_id, detail in ((b"0", "a has 1 rows, b has 0 rows"), (b"2", "a is 0-d, b is 0-d"),
                           (b"3", "the job has no arrays")):
        assert got[job_id].header["code"] == "bad_request"
        assert got[job_id].header["message"].startswith(
            f"inputs disagree on the batch size ({detail})")
    assert model.seen == [{"a": (4, 2), "b": (4, 2)}]  # jobs 1 and 4, padded from 3 rows
    for job_id, value, rows in ((b"1", 2, 1), (b"4", 4, 2)):
        out = unpack_arrays(got[job_id].header["outputs"], got[job_id].arrays)
        for name in ("a", "b"):
            np.testing.assert_array_equal(out[name], np.full((rows, 2), value))


@pytest.mark.parametrize("arrays", [
    {"a": np.ones((1, 2), np.float32), "b": np.zeros((0, 2), np.float32)},
    {"a": np.array(3.0, np.float32)},
    {},
])
def test_alone_such_a_job_runs_as_it_came(arrays: dict[str, np.ndarray]) -> None:
    model = Mirror()
    (reply,) = run_batch(Runner(model, None, None), batch_message([arrays], pad_to=8))
    if not arrays:  # nothing to return: the model's fault, answered
        assert reply.header["code"] == "internal"
        assert "returned no outputs" in reply.header["message"]
        return
    assert reply.kind == RESULT, reply.header
    assert model.seen == [{n: a.shape for n, a in arrays.items()}]  # not padded, not split
    out = unpack_arrays(reply.header["outputs"], reply.arrays)
    for name, array in arrays.items():
        np.testing.assert_array_equal(out[name], array)


def test_padding_repeats_the_last_row_even_after_an_empty_job() -> None:
    model = Mirror()
    parts = [{"x": np.array([[1.0], [2.0]], np.float32)}, {"x": np.zeros((0, 1), np.float32)}]
    got = replies_by_id(run_batch(Runner(model, None, None), batch_message(parts, pad_to=4)))
    assert model.seen == [{"x": (4, 1)}]
    assert unpack_arrays(got[b"1"].header["outputs"], got[b"1"].arrays)["x"].shape == (0, 1)
    np.testing.assert_array_equal(
        unpack_arrays(got[b"0"].header["outputs"], got[b"0"].arrays)["x"], [[1.0], [2.0]])


def test_jobs_of_different_layouts_run_apart() -> None:
    """The supervisor never batches them; if it did, numpy would upcast float32 silently."""
    model = Mirror()
    parts = [{"x": np.ones((1, 2), np.float32)}, {"x": np.ones((1, 2), np.float64)}]
    got = replies_by_id(run_batch(Runner(model, None, None), batch_message(parts, pad_to=2)))
    assert model.seen == [{"x": (1, 2)}, {"x": (1, 2)}]
    assert unpack_arrays(got[b"0"].header["outputs"], got[b"0"].arrays)["x"].dtype == np.float32
    assert unpack_arrays(got[b"1"].header["outputs"], got[b"1"].arrays)["x"].dtype == np.float64


@pytest.mark.parametrize(("header", "frames", "answered"), [
    ({"jobs": [{"id": "1", "inputs": []}, {"id": "2", "inputs": []}]}, [], [b"1", b"2"]),
    ({"jobs": [{"id": "1", "inputs": []}, {"id": 2, "inputs": []}], "pad_to": 0}, [], [b"1"]),
    ({"jobs": [{"id": "1", "inputs": [{"name": "x"}]}], "pad_to": 0}, [], [b"1"]),
    ({"jobs": [{"id": "1", "inputs": []}], "pad_to": 0}, [b"stray"], [b"1"]),
    ({"jobs": "all of them", "pad_to": 0}, [], []),
    ({}, [b"x"], []),
])
def test_a_malformed_job_message_is_answered_as_far_as_it_can_be_read(
        header: dict[str, Any], frames: list[bytes], answered: list[bytes]) -> None:
    model = Mirror()
    replies = run_batch(Runner(model, None, None), Message(JOB, b"", header, list(frames)))
    assert [r.job_id for r in replies] == answered  # nothing it cannot attribute
    assert all(r.header["code"] == "internal" for r in replies)
    assert all("could not read the job message" in r.header["message"] for r in replies)
    assert model.seen == []  # nothing ran


class Loud:
    inputs = None

    def __init__(self, error: Exception) -> None:
        self.error = error

    def __call__(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        raise self.error


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no")


def test_model_errors_are_bounded_and_never_escape() -> None:
    parts = [{"x": np.ones((1, 2), np.float32)}, {"x": np.ones((1, 2), np.float32)}]
    replies = run_batch(Runner(Loud(ValueError("v" * 1_000_000)), None, None),
                        batch_message(parts, pad_to=2))
    assert [r.header["code"] for r in replies] == ["internal", "internal"]  # each run alone
    text = replies[0].header["message"]
    assert len(text) <= MAX_ERROR_TEXT and text.startswith("model raised ValueError: vvv")
    assert text.endswith("more characters cut]")
    (reply,) = run_batch(Runner(Loud(Unprintable()), None, None), batch_message(parts[:1], 0))
    assert reply.header["message"] == "model raised Unprintable: (its message cannot be read)"


class Returns:
    inputs = None

    def __init__(self, outputs: dict[Any, np.ndarray]) -> None:
        self.outputs = outputs

    def __call__(self, inputs: dict[str, np.ndarray]) -> dict[Any, np.ndarray]:
        return self.outputs


@pytest.mark.parametrize(("outputs", "fragment"), [
    ({f"y{i}": np.ones(1) for i in range(65)}, "65 outputs, more than the 64"),
    ({7: np.ones(1)}, "output name 7 is not a string"),
    ({"": np.ones(1)}, "output name '' is not a string"),
    ({"y" * 257: np.ones(1)}, "is not a string of 1 to 256"),
    ({"y": np.ones((1,) * 9)}, "9 dimensions, more than the 8"),
    ({"y": np.ones(3)}, "first dimension is not the batch size [1]"),
])
def test_outputs_a_client_could_not_read_are_refused(outputs: dict[Any, np.ndarray],
                                                     fragment: str) -> None:
    """The reply must decode at the client: at most 64 arrays, names and ranks it accepts."""
    (reply,) = run_batch(Runner(Returns(outputs), None, None),
                         batch_message([{"x": np.ones((1, 2), np.float32)}], pad_to=1))
    assert reply.header["code"] == "internal"
    assert fragment in reply.header["message"]


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


# --- the uniform fast path answers as the general path does --------------------------------

class Model:
    """A model with the behaviours a batch meets: doubles its input, raises on a poisoned
    row, returns a string output or an output too short for the batch when asked."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.calls = 0

    def __call__(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.calls += 1
        x = next(iter(inputs.values()))
        if x.size and (x.reshape(len(x), -1)[:, 0] == -1).any():
            raise ValueError("poisoned row")
        if self.mode == "strings":
            return {"s": np.array([str(v) for v in x.reshape(len(x), -1)[:, 0]], object),
                    "y": x * 2}
        if self.mode == "short":
            return {"y": x[:1]}
        if self.mode == "in place":  # a handler that scales its input where it lies
            x *= 2
            return {"y": x}
        if self.mode == "empty":  # no detections: a dimension of 0
            return {"boxes": np.zeros((len(x), 0, 4), np.float32), "y": x}
        return {"y": x * 2, "n": np.arange(len(x), dtype=np.int64)}


def _answers(replies: list[Message]) -> list[tuple[bytes, bytes, Any]]:
    """Replies as comparable values: id, kind, and the decoded outputs or the error."""
    out = []
    for reply in replies:
        if reply.kind == RESULT:
            arrays = unpack_arrays(reply.header["outputs"], reply.arrays)
            body: Any = sorted((n, a.dtype.str, a.shape, a.tolist()) for n, a in arrays.items())
        else:
            body = (reply.header["code"], reply.header["message"])
        out.append((reply.job_id, reply.kind, body))
    return out


@st.composite
def batches(draw: st.DrawFn) -> tuple[list[JobEntry], int, str, bool]:
    """Mostly uniform batches (the fast path's case), with the ways a batch stops being
    one: another row count, dtype or width, a frame cut short, a poisoned row."""
    jobs = draw(st.integers(1, 6))
    rows = draw(st.integers(0, 3))
    dtype = draw(st.sampled_from(["float32", "int64", "float16"]))
    base_width = draw(st.sampled_from([3, 3, 0]))
    entries = []
    for i in range(jobs):
        r, d, width, value = rows, dtype, base_width, float(i)
        # One job in eight breaks the batch's uniformity, one way or another.
        change = draw(st.sampled_from(["none"] * 7 + ["rows", "dtype", "width", "poison",
                                                       "short frame"]))
        r = draw(st.sampled_from([1, 2])) if change == "rows" else r
        d = "float64" if change == "dtype" else d
        width = draw(st.sampled_from([2, 0])) if change == "width" else width
        value = -1.0 if change == "poison" else value
        specs, frames = pack_arrays({"x": np.full((r, width), value, d)})
        if change == "short frame":
            frames = [bytes(frames[0])[:-1]]
        entries.append(JobEntry(f"j{i}".encode(), specs, frames))
    pad_to = draw(st.sampled_from([0, jobs * max(rows, 1), 8]))
    mode = draw(st.sampled_from(["double", "double", "strings", "short", "in place",
                                 "empty"]))
    declared = draw(st.booleans())
    return entries, pad_to, mode, declared


@given(batches())
def test_uniform_path_answers_exactly_as_the_general_path(
        batch: tuple[list[JobEntry], int, str, bool]) -> None:
    from worker.batch import _general

    entries, pad_to, mode, declared = batch
    msg = decode(encode(pack_job(entries, pad_to)), INTERNAL_HOP)  # as the worker receives it
    specs = [TensorSpec("x", "float32", (None, 3))] if declared else None
    fast, slow = Model(mode), Model(mode)
    fast_replies = run_batch(Runner(fast, specs, None), msg)
    slow_replies = _general(Runner(slow, specs, None), unpack_job(msg)[0], pad_to)
    assert _answers(fast_replies) == _answers(slow_replies)
    assert sorted(r.job_id for r in fast_replies) == sorted(e.id for e in entries)
    # A failed uniform batch is isolated job by job, never run whole a second time.
    assert fast.calls <= slow.calls


def test_uniform_batch_runs_once_as_one_array() -> None:
    model = Doubler()
    parts = [{"x": np.full((1, 2), float(i), np.float32)} for i in range(5)]
    got = outputs(run_batch(Runner(model, Doubler.inputs, None), batch_message(parts, 8)))
    assert model.seen == [(8, 2)]
    assert {k: v.tolist() for k, v in got.items()} == {
        str(i).encode(): [[2.0 * i, 2.0 * i]] for i in range(5)}


@settings(max_examples=60, deadline=None)
@given(st.lists(batches(), min_size=2, max_size=8), st.booleans())
def test_uniform_batches_answer_as_the_general_path(
        sequence: list[tuple[list[JobEntry], int, str, bool]], declared: bool) -> None:
    """One runner answers a run of batches, each exactly as the general path answers it."""
    from worker.batch import _general

    specs = [TensorSpec("x", "float32", (None, 3))] if declared else None
    runner = Runner(Model("double"), specs, None)
    for entries, pad_to, _, _ in sequence:
        msg = decode(encode(pack_job(entries, pad_to)), INTERNAL_HOP)
        slow = _general(Runner(Model("double"), specs, None), unpack_job(msg)[0], pad_to)
        fast = run_batch(runner, msg)
        assert _answers(fast) == _answers(slow)
        # What the supervisor passes on is the packed header: it must say the same.
        passed, _ = unpack_results(decode(encode(pack_results(fast)), INTERNAL_HOP))
        assert _answers(passed) == _answers(slow)


# --- the adaptive batch wait (batch_timeout_ms not set) ------------------------------------

def measured(per_call: float, per_row: float, rate: float, outstanding: int,
             seconds: float = 2.0) -> tuple[BatchWait, float]:
    """A model whose batches of 1..32 rows cost ``per_call + per_row * rows`` seconds, with
    rows arriving at ``rate`` per second, each finding ``outstanding`` jobs already in."""
    wait, now = BatchWait(), 100.0
    for rows in [1, 2, 4, 8, 16, 32] * 10:
        wait.called(rows, per_call + per_row * rows)
    for _ in range(int(rate * seconds)):
        wait.arrived(1, outstanding, now)
        now += 1.0 / rate
    return wait, now


def test_no_wait_while_each_job_finds_an_idle_worker() -> None:
    """One client waiting on each answer: nothing outstanding when its job arrives."""
    wait, now = measured(500e-6, 50e-6, rate=1500, outstanding=0)
    decision = wait.decide(workers=2, max_batch_size=32, now=now)
    assert decision.seconds == 0.0 and "no wait" in decision.reason
    assert wait.decide(workers=2, max_batch_size=1, now=now).seconds == 0.0


def test_queued_jobs_wait_to_fill_batches_when_calls_cost_more_than_rows() -> None:
    """32 clients on 2 workers, the MLP's costs: a wait gathering about a worker's share."""
    wait, now = measured(500e-6, 50e-6, rate=5000, outstanding=31)
    costs = wait.costs()
    assert costs is not None
    assert costs.per_call == pytest.approx(500e-6, rel=0.01)
    assert costs.per_row == pytest.approx(50e-6, rel=0.01)
    decision = wait.decide(workers=2, max_batch_size=32, now=now)
    assert 0 < decision.seconds <= min(15 / 5000, 2 * (500e-6 + 16 * 50e-6)) + 1e-9
    assert "~16 rows" in decision.reason and "31.0 jobs outstanding" in decision.reason


def test_no_wait_when_rows_cost_more_than_calls() -> None:
    """A text encoder on CPU: each row costs ~1 ms, a call ~0.1 ms more; a wait buys nothing."""
    wait, now = measured(100e-6, 1e-3, rate=400, outstanding=31)
    decision = wait.decide(workers=2, max_batch_size=32, now=now)
    assert decision.seconds == 0.0 and "small beside a row's" in decision.reason


def test_the_wait_is_bounded_by_two_calls_and_twenty_ms() -> None:
    slow_arrivals, now = measured(500e-6, 50e-6, rate=20, outstanding=31, seconds=10)
    assert slow_arrivals.decide(2, 32, now).seconds == pytest.approx(2 * (500e-6 + 16 * 50e-6))
    slow_calls, now = measured(0.5, 1e-3, rate=100, outstanding=100)
    assert slow_calls.decide(2, 32, now).seconds == MAX_WAIT


def test_an_idle_spell_decays_the_arrival_rate() -> None:
    wait, now = measured(500e-6, 50e-6, rate=5000, outstanding=31)
    assert wait.rate == pytest.approx(5000, rel=0.1)
    wait.arrived(1, 0, now + 10.0)
    assert wait.rate < 5.0


def test_batches_of_one_size_count_their_whole_time_per_call() -> None:
    wait = BatchWait()
    assert wait.costs() is None
    for _ in range(5):
        wait.called(1, 0.002)
    wait.called(3, float("nan"))  # ignored, as is a negative time
    wait.called(3, -1.0)
    assert wait.costs() == Costs(pytest.approx(0.002), 0.0)


def closed_loop(wait: BatchWait, clients: int, rate: float, now: float,
                seconds: float = 1.0) -> float:
    """``clients`` closed-loop clients: between answers, the outstanding count climbs from
    a few to all of them; the mean stays well under the peak."""
    for i in range(int(rate * seconds)):
        wait.arrived(1, 4 + i % (clients - 4), now)
        now += 1.0 / rate
    return now


def test_contended_cores_wait_for_the_most_outstanding_not_a_workers_share() -> None:
    """32 clients sharing the cores with the server: jobs outstanding average ~17, peak 32.
    Uncontended, a worker's share of the mean (~9 rows); contended, the peak (31 outstanding
    when the 32nd arrived: 32 rows), less the jobs in a busy worker, as long as they take
    to arrive and never past two calls of that batch."""
    wait, now = measured(500e-6, 5e-6, rate=6000, outstanding=4)
    now = closed_loop(wait, 32, 6000, now)
    assert wait.peak == 32 and 10 < wait.outstanding < 24
    costs = wait.costs()
    assert costs is not None
    calm = wait.decide(workers=2, max_batch_size=32, now=now)
    busy = wait.decide(workers=2, max_batch_size=32, now=now, contended=True)
    assert f"~{math.ceil(wait.outstanding / 2)} rows" in calm.reason
    assert "~32 rows, the cores being contended" in busy.reason
    assert busy.seconds == pytest.approx(min(31 / wait.rate, 2 * costs.call(32)))
    assert busy.seconds > calm.seconds
    # Jobs in a busy worker cannot join: with 20 of the 32 there, wait for the other 12.
    part = wait.decide(workers=2, max_batch_size=32, now=now, contended=True, in_workers=20)
    assert "~12 rows" in part.reason and "20 in a worker now" in part.reason
    assert part.seconds == pytest.approx(min(11 / wait.rate, 2 * costs.call(12)))
    held = wait.decide(2, 32, now, contended=True, in_workers=40)
    assert held.seconds == 0.0 and "as many or more in a worker now (40)" in held.reason
    small = wait.decide(workers=2, max_batch_size=16, now=now, contended=True)
    assert "~16 rows" in small.reason  # never past max_batch_size


def test_contended_cores_still_never_wait_for_one_client_nor_past_two_calls() -> None:
    one, now = measured(500e-6, 5e-6, rate=1500, outstanding=0)
    assert one.decide(2, 32, now, contended=True).seconds == 0.0
    slow, now = measured(500e-6, 5e-6, rate=20, outstanding=31, seconds=10)
    assert slow.decide(2, 32, now, contended=True).seconds == \
        pytest.approx(2 * (500e-6 + 5e-6 * 32))
    dear_rows, now = measured(100e-6, 1e-3, rate=400, outstanding=31)
    decision = dear_rows.decide(2, 32, now, contended=True)
    assert decision.seconds == 0.0 and "small beside a row's" in decision.reason


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(1e-5, 0.05), st.integers(0, 300)), min_size=1,
                max_size=400),
       st.integers(1, 256), st.integers(0, 64))
def test_a_contended_wait_never_feeds_itself_past_two_calls(
        arrivals: list[tuple[float, int]], max_batch: int, in_workers: int) -> None:
    """Whatever the arrivals (open loop, bursts, the jobs that piled up during a wait
    itself raising the peak), a contended wait stays within two calls of its batch and
    20 ms: jobs arriving during a wait cannot stretch the next one without end."""
    wait, now = measured(500e-6, 5e-6, rate=3000, outstanding=3)
    for gap, outstanding in arrivals:
        now += gap
        wait.arrived(1, outstanding, now)
        decision = wait.decide(2, max_batch, now, contended=True, in_workers=in_workers)
        costs = wait.costs()
        assert costs is not None
        assert 0.0 <= decision.seconds <= min(2 * costs.call(max_batch), MAX_WAIT) + 1e-12


def test_after_a_burst_a_lone_client_waits_for_no_one() -> None:
    """A burst of 32 at once, then one client every 50 ms: once a window has passed, the
    peak is that client alone and the contended wait is none."""
    wait, now = measured(500e-6, 5e-6, rate=6000, outstanding=31)
    for _ in range(12):
        now += 0.05
        wait.arrived(1, 0, now)
    assert wait.peak == 1
    assert wait.decide(2, 32, now, contended=True).seconds == 0.0


def test_an_idle_spell_forgets_the_peak() -> None:
    wait, now = measured(500e-6, 5e-6, rate=6000, outstanding=31)
    assert wait.peak == 32
    wait.arrived(1, 0, now + 10.0)
    assert wait.peak == 0


def test_the_router_asks_the_cpu_pressure() -> None:
    router = Router([], max_queue=5000)
    for i in range(3000):
        router.submit(job(i, t=i / 5000))
    for rows in (1, 8, 1, 8):
        router.sent["w1"] = ("m", rows, 0.0)
        router.batch_done("w1", 0.0005 + rows * 1e-6)
    adaptive = BatchPolicy.from_config(32, None, None)
    router.cpu.read(0, 0.0)
    router.cpu.read(500_000, 1.0)  # some task waited half of the last second
    assert router.cpu.contended
    router.held["w2"] = {-1: job(-1)}  # w2 busy with one job: it cannot join
    router.dispatch("m", [("w1", 0), ("w2", 0)], now=3000 / 5000, policy=adaptive)
    reason = router.wait_decisions["m"].reason
    assert "cores being contended" in reason and "1 in a worker now" in reason


def test_a_fixed_timeout_overrides_the_adaptive_wait() -> None:
    """The router decides a wait only for a model whose batch_timeout_ms is not set."""
    adaptive = BatchPolicy.from_config(32, None, None)
    fixed = BatchPolicy.from_config(32, 3.0, None)
    assert adaptive.adaptive and not fixed.adaptive and fixed.timeout == 0.003
    router = Router([], max_queue=5000)
    for i in range(3000):
        router.submit(job(i, t=i / 5000))  # queued faster than they are served
    router.sent["w1"] = ("m", 8, 0.0)
    router.batch_done("w1", 0.0009)
    router.sent["w1"] = ("m", 1, 0.0)
    router.batch_done("w1", 0.00055)
    assert router.batch_policy("m", fixed) is fixed
    assert router.batch_policy("m", adaptive).timeout == 0.0  # nothing decided yet
    router.dispatch("m", [("w1", 0), ("w2", 0)], now=3000 / 5000, policy=adaptive)
    decision = router.wait_decisions["m"]
    assert decision.seconds > 0 and router.batch_policy("m", adaptive).timeout == \
        decision.seconds


def test_the_worker_that_answered_last_takes_the_next_batch() -> None:
    """Its caches are warm: batches go to the idle worker that answered last, not in turn;
    workers that never answered go least used first, and a busy one is passed over."""
    router = Router([], max_queue=100)
    done = {"w1": 10, "w2": 9, "w3": 8}
    assert _dispatched(router, done, 1.0, 1) == "w3"  # none answered yet: the least used
    assert _dispatched(router, done, 1.1, 2) == "w2"  # w3 busy: the next least used
    _answered(router, "w3", 1.2)
    _answered(router, "w2", 1.3)
    assert _dispatched(router, done, 1.4, 3) == "w2"  # answered last
    assert _dispatched(router, done, 1.5, 4) == "w3"  # w2 busy: the one answered before it
    _answered(router, "w3", 1.6)
    assert _dispatched(router, done, 1.7, 5) == "w3"
    _answered(router, "w2", 1.8)
    _answered(router, "w3", 1.9)
    assert _dispatched(router, done, 2.0, 6) == "w3"


def test_a_worker_left_far_behind_takes_batches_until_it_catches_up() -> None:
    """One client waiting on each answer would keep the warm worker and leave the other
    idle for ever: a worker under 1/LAG of the busiest one's jobs goes first, so every
    worker is warmed up, judged, and seen if it fails."""
    router = Router([], max_queue=100)
    done = {"a": 0, "b": 0}
    for i in range(2000):  # one job at a time: each finds both workers idle
        worker = _dispatched(router, done, i * 0.001, i)
        _answered(router, worker, i * 0.001 + 0.0005)
        done[worker] += 1
    assert min(done.values()) * LAG >= max(done.values()) - LAG, done
    assert max(done.values()) > 2 * min(done.values()), done  # the warm one still leads
    assert _dispatched(router, dict(done, c=0), 3.0, 9999) == "c"  # a replacement first


def _dispatched(router: Router, ready: dict[str, int], now: float, i: int) -> str:
    """The worker one new job is sent to."""
    router.submit(job(i, t=now))
    router.outbox.clear()
    router.dispatch("m", list(ready.items()), now, BatchPolicy.from_config(1, 0.0, None))
    [batch] = [a for a in router.outbox if isinstance(a, SendBatch)]
    return batch.worker_id


def _answered(router: Router, worker_id: str, now: float, served: bool = True) -> None:
    for held in router.held_by(worker_id):
        router.answer(held, Message(RESULT, held.client_job_id, {}, []))
    router.batch_done(worker_id, now, served)


def test_workers_far_behind_go_least_used_first_and_busy_ones_are_passed_over() -> None:
    router = Router([], max_queue=100)
    ready = {"warm": 100, "b": 10, "c": 5}
    assert _dispatched(router, ready, 1.0, 1) == "c"  # both behind: the less used
    assert _dispatched(router, ready, 1.1, 2) == "b"  # c busy: the other one behind
    assert _dispatched(router, ready, 1.2, 3) == "warm"  # both busy: the warm one
    _answered(router, "c", 1.3)
    ready["c"] = 30  # caught up past a quarter of the busiest: back to the warm order
    _answered(router, "warm", 1.4)
    assert _dispatched(router, ready, 1.5, 4) == "warm"


def test_a_worker_that_served_no_job_does_not_become_the_warm_one() -> None:
    """One that fails every job fast would otherwise answer first and take every batch."""
    router = Router([], max_queue=100)
    ready = {"good": 50, "bad": 50}
    assert _dispatched(router, ready, 1.0, 1) == "bad"  # neither answered yet: by name
    _answered(router, "bad", 1.1, served=False)
    assert _dispatched(router, ready, 1.2, 2) == "bad"  # still never answered: a tie
    _answered(router, "bad", 1.3, served=False)
    ready["good"] = 51
    assert _dispatched(router, ready, 1.4, 3) == "bad"  # the less used of two cold ones
    _answered(router, "bad", 1.5, served=False)
    router.sent["good"] = ("m", 1, 1.5)
    _answered(router, "good", 1.6)
    _answered(router, "bad", 1.7, served=False)
    assert _dispatched(router, ready, 1.8, 4) == "good"  # served last, though answered before


def test_answer_times_of_gone_workers_are_dropped_and_forget_clears_a_model() -> None:
    router = Router([], max_queue=100)
    for i in range(100):  # workers come and go
        router.sent[f"old-{i}"] = ("m", 1, 0.0)
        router.batch_done(f"old-{i}", 0.5)
    assert _dispatched(router, {"live": 3}, 1.0, 1) == "live"
    assert set(router.freed["m"]) <= {"live"}  # pruned past ready + 64
    _answered(router, "live", 1.1)
    assert router.freed["m"] == {"live": 1.1}
    router.forget("m")
    assert "m" not in router.freed and "m" not in router.waits and \
        "m" not in router.wait_decisions
