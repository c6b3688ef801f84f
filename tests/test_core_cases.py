"""Each case of the two promises that once broke, replayed against the core step by step.

The model-based test (test_core_model.py) searches interleavings; these pin the exact
sequences that broke a live daemon, so a regression names itself. The same cases run
against a real daemon in test_promises_live.py.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from supervisor.cli.render import render_status
from supervisor.config.loading import parse_config
from supervisor.core.actions import Kill, Reply, SampleNow, SendBatch, Spawn, Stop
from supervisor.core.core import Core
from supervisor.core.history import Reading
from supervisor.core.pool import State
from supervisor.core.reasons import Reason
from supervisor.daemon.control import Controller
from supervisor.shared.exitcodes import WorkerExit
from supervisor.shared.protocol import (
    HEARTBEAT,
    READY,
    RESULT,
    Message,
    encode,
    error_message,
    pack_arrays,
    pack_results,
    signed,
)
from tests.test_core_model import frames_for, hostile, secret, valid

BASE = """
supervisor:
  runtime_dir: /tmp/tfs-core-cases
  max_queue: 100
  max_queue_bytes: 4096
  max_message_size: 2048
models:
  a:
    handler: "mod:a"
    workers: 1
    batching: {max_batch_size: 8}
    policy: {warmup_jobs: 0, warmup_seconds: 0, max_attempts: 2}
"""


class World:
    """A core and the processes it believes in, played by hand."""

    def __init__(self, text: str = BASE) -> None:
        self.core = Core(parse_config(text, Path("/tmp/tfs-core-cases/config.yaml")))
        self.now = 100.0
        self.replies: dict[bytes, list[Message]] = {}
        self.batches: dict[str, list[SendBatch]] = {}
        self.killed: list[tuple[str, Reason]] = []
        self.stopped: list[str] = []
        self.memory: dict[str, int] = {}
        self.clients = 0
        self.tick()  # the first tick spawns the configured workers

    def run(self) -> None:
        while actions := self.core.take():
            for action in actions:
                if isinstance(action, Reply):
                    self.replies.setdefault(bytes(action.envelope[0]), []).append(action.msg)
                elif isinstance(action, SendBatch):
                    self.batches.setdefault(action.worker_id, []).append(action)
                elif isinstance(action, Spawn):
                    self.core.spawned(action.worker_id, 1000 + len(self.memory),
                                      secret(action.worker_id))
                    self.memory[action.worker_id] = 100
                elif isinstance(action, Kill):
                    self.killed.append((action.worker_id, action.reason))
                elif isinstance(action, Stop):
                    self.stopped.append(action.worker_id)
                elif isinstance(action, SampleNow):
                    self.core.samples(self.now, {w: Reading(self.memory[w])
                                                 for w in action.worker_ids}, poll=False)

    def request(self, frames: list[Any]) -> bytes:
        key = b"c%d" % self.clients
        self.clients += 1
        self.core.request([key, *frames], self.now)
        self.run()
        return key

    def ready(self, worker_id: str, inputs: list[dict[str, Any]] | None = None) -> None:
        header = {"worker": worker_id, "warmup_seconds": 1.0, "inputs": inputs}
        self.core.worker_message(worker_id.encode(), encode(signed(Message(
            READY, b"", header), secret(worker_id))), self.now)
        self.run()  # the daemon reads its memory here, before any job goes to it
        self.tick()

    def answer(self, worker_id: str, leaving: bool = False, text: str | None = None,
               drop_last: bool = False) -> None:
        batch = self.batches[worker_id].pop(0)
        jobs = batch.jobs[:-1] if drop_last else batch.jobs
        replies = []
        for job in jobs:
            if text is not None:
                replies.append(error_message(str(job.id).encode(), "internal", text))
                continue
            specs, arrays = pack_arrays({"y": np.zeros((job.rows or 1, 1), "float32")})
            replies.append(Message(RESULT, str(job.id).encode(), {"outputs": specs},
                                   list(arrays)))
        self.core.worker_message(worker_id.encode(), encode(signed(
            pack_results(replies, leaving), secret(worker_id))), self.now)
        self.run()

    def exit(self, worker_id: str, code: int) -> None:
        self.core.exited(worker_id, code, self.now)
        self.run()

    def tick(self, seconds: float = 0.0) -> None:
        self.now += seconds
        self.core.tick(self.now)
        self.run()

    def poll(self) -> None:
        self.core.next_poll = 0.0
        targets = self.core.poll_due(self.now) or []
        self.core.samples(self.now, {w: Reading(self.memory[w]) for w, _, _ in targets})
        self.run()

    def heartbeat(self, worker_id: str) -> None:
        header = {"worker": worker_id, "jobs": 0, "tf_memory": None}
        self.core.worker_message(b"hb-socket", encode(signed(Message(HEARTBEAT, b"", header),
                                                             secret(worker_id))), self.now)
        self.run()

    def code(self, key: bytes) -> str:
        [reply] = self.replies[key]
        return "ok" if reply.kind == RESULT else str(reply.header["code"])

    def state(self, worker_id: str) -> State | None:
        worker = self.core.pool.workers.get(worker_id)
        return worker.state if worker else None


def test_non_finite_and_absurd_deadlines_are_bad_requests() -> None:
    world = World()
    for kind in ("nan_timeout", "inf_timeout", "negative_timeout", "string_timeout",
                 "huge_timeout"):
        assert world.code(world.request(hostile(kind))) == "bad_request", kind
    assert world.core.router.pending() == 0


def test_hostile_dtypes_and_fields_are_bad_requests_with_one_reply() -> None:
    world = World()
    for kind in ("list_dtype", "map_dtype", "list_model", "huge_dim", "inputs_not_list",
                 "frames_missing", "header_not_map", "not_msgpack", "short", "wrong_kind"):
        key = world.request(hostile(kind))
        assert len(world.replies[key]) == 1 and world.code(key) == "bad_request", kind


def test_a_huge_handler_error_is_answered_and_frees_the_worker() -> None:
    world = World()
    world.ready("a-1")
    first = world.request(valid("a", 1))
    world.answer("a-1", text="x" * 200_000)
    assert world.code(first) == "internal"
    assert len(world.replies[first][0].header["message"]) <= 4096
    second = world.request(valid("a", 1))
    world.answer("a-1")
    assert world.code(second) == "ok"


def test_a_worker_leaving_after_its_answer_is_sent_nothing_more() -> None:
    world = World(BASE.replace("max_attempts: 2", "max_attempts: 1"))
    world.ready("a-1")
    keys = [world.request(valid("a", 1)) for _ in range(3)]
    world.answer("a-1", leaving=True)  # its handler asked to be replaced
    assert world.state("a-1") is State.STOPPING and not world.batches["a-1"]
    world.exit("a-1", WorkerExit.RECYCLE)
    world.tick()
    world.ready("a-2")
    while world.batches.get("a-2"):
        world.answer("a-2")
    assert [world.code(k) for k in keys] == ["ok"] * 3
    assert world.core.pool.models["a"].recycles == {"requested": 1}


def test_a_stopped_worker_never_turns_ready_again() -> None:
    world = World()
    world.core.shutdown(world.now, "SIGTERM")
    world.tick()
    assert world.stopped == ["a-1"]
    world.ready("a-1")  # a READY that was already on its way
    assert world.state("a-1") is State.STOPPING


def test_kill_memory_counts_each_try_and_answers_the_job() -> None:
    world = World(BASE.replace("max_attempts: 2", "max_attempts: 2, kill_memory: 1000"))
    key = world.request(valid("a", 1))
    for attempt in (1, 2):
        worker = f"a-{attempt}"
        world.tick(2.0)
        world.ready(worker)
        assert world.batches[worker]
        world.memory[worker] = 5000  # the job blows the worker up
        world.poll()
        assert (worker, Reason.KILL_MEMORY) in world.killed
        world.exit(worker, -9)
    assert world.code(key) == "worker_crashed"
    assert "over kill_memory" in world.replies[key][0].header["message"]


def test_a_removed_model_answers_what_it_can_no_longer_serve() -> None:
    world = World(BASE + """
  other:
    handler: "mod:o"
""")
    keys = [world.request(valid("a", 1)) for _ in range(6)]
    removed = BASE.replace('  a:\n    handler: "mod:a"', '  other:\n    handler: "mod:o"')
    world.core.reload(parse_config(removed, Path("/tmp/tfs-core-cases/config.yaml")),
                      world.now)
    world.tick()
    assert {world.code(k) for k in keys} == {"unavailable"}
    shown = render_status(Controller(world.core, dict, lambda: True, lambda: True)
                          .status(world.now))
    assert "a: REMOVING (dropped by a reload" in shown
    assert "other: STARTING: no worker ready yet" in shown  # its worker is not ready yet
    world.exit("a-1", 0)
    world.tick()
    assert "a" not in world.core.pool.models


def test_jobs_whose_arrays_disagree_on_rows_run_alone() -> None:
    world = World()
    odd = hostile("rows_disagree")
    specs = [{"name": "x", "dtype": "float32", "shape": [1, 2]},
             {"name": "y", "dtype": "float32", "shape": [1, 2]}]
    even = frames_for({"model": "a", "inputs": specs}, [bytes(8), bytes(8)])
    keys = [world.request(odd), world.request(even), world.request(odd),
            world.request(even)]
    world.ready("a-1")
    sizes = []
    while world.batches.get("a-1"):
        sizes.append(len(world.batches["a-1"][0].jobs))
        world.answer("a-1")
    assert sizes == [1, 2, 1]  # the two agreeing jobs together, each odd one alone
    assert all(world.code(k) == "ok" for k in keys)


def test_a_lower_heartbeat_after_reload_does_not_kill_older_workers() -> None:
    world = World()
    world.ready("a-1")
    faster = BASE.replace("max_queue: 100", "max_queue: 100\n  heartbeat_interval: 0.1s\n"
                          "  heartbeat_timeout: 0.5s")
    world.core.reload(parse_config(faster, Path("/tmp/tfs-core-cases/config.yaml")),
                      world.now)
    world.tick(2.0)  # beating every 1 s as it was started to: 2 s is not silence
    assert world.state("a-1") is State.READY and not world.killed
    world.tick(9.0)
    assert ("a-1", Reason.HUNG) in world.killed


def test_queue_bounds_count_bytes_and_whole_messages() -> None:
    world = World()
    big = world.request(valid("a", 2048 // 8 + 1))  # one message over max_message_size
    assert world.code(big) == "bad_request"
    keys = [world.request(valid("a", 60)) for _ in range(12)]  # 480 bytes each
    codes = [world.code(k) if k in world.replies else "queued" for k in keys]
    assert codes == ["queued"] * 8 + ["overloaded"] * 4  # 8 x 480 <= 4096 < 9 x 480
    assert world.core.router.pending_bytes["a"] <= 4096


def test_max_memory_holds_even_when_recycles_come_fast() -> None:
    """max_memory is soft: the model's only ready worker serves on over it until its
    replacement is ready (the model never goes dark for it), then goes at once; recycles
    that come fast are alarmed, never paused."""
    world = World(BASE.replace("max_attempts: 2", "max_attempts: 2, max_memory: 1000, "
                               "min_lifetime: 600s"))
    world.tick(2.0)
    world.ready("a-1")
    for n in range(1, 5):
        old, new = f"a-{n}", f"a-{n + 1}"
        world.memory[old] = 5000  # grows past the limit soon after start
        world.poll()
        world.tick()
        assert world.core.pool.workers[old].reason is Reason.MAX_MEMORY
        assert world.state(old) is State.READY, f"{old} left the model with none ready"
        assert world.state(new) is State.STARTING  # its replacement, beside it
        world.tick(2.0)
        world.ready(new)
        assert world.state(old) is not State.READY, f"{old} kept serving once replaced"
        world.tick()
        world.exit(old, 0)
    assert world.core.pool.models["a"].recycles["max_memory"] == 4
    assert world.core.pool.models["a"].churn >= 2  # alarmed, never paused


def test_a_fresh_worker_over_max_memory_makes_the_model_unavailable() -> None:
    world = World(BASE.replace("max_attempts: 2", "max_attempts: 2, max_memory: 50"))
    world.ready("a-1")  # sampled at once: 100 bytes, over 50
    assert world.state("a-1") is not State.READY
    state = world.core.pool.models["a"]
    assert state.unavailable and "max_memory" in (state.last_error or "")
    key = world.request(valid("a", 1))
    assert world.code(key) == "unavailable"


def test_results_that_leave_jobs_unanswered_requeue_them() -> None:
    world = World()
    keys = [world.request(valid("a", 1)) for _ in range(3)]
    world.ready("a-1")
    world.answer("a-1", drop_last=True)
    assert ("a-1", Reason.PROTOCOL_ERROR) in world.killed
    world.exit("a-1", -9)
    world.tick(2.0)
    world.ready("a-2")
    world.answer("a-2")
    assert [world.code(k) for k in keys] == ["ok"] * 3


def test_a_job_bigger_than_the_byte_bound_is_refused_for_good() -> None:
    world = World(BASE.replace("max_queue_bytes: 4096", "max_queue_bytes: 100"))
    key = world.request(valid("a", 20))  # 160 bytes: could never be queued
    assert world.code(key) == "bad_request"
    assert "max_queue_bytes" in world.replies[key][0].header["message"]



def test_limits_hold_while_a_worker_loads() -> None:
    world = World(BASE.replace("max_attempts: 2", "max_attempts: 2, max_memory: 1000, "
                               "kill_memory: 2000"))
    world.memory["a-1"] = 5000  # grows past kill_memory while loading
    world.poll()
    assert ("a-1", Reason.KILL_MEMORY) in world.killed
    state = world.core.pool.models["a"]
    assert state.unavailable and "kill_memory" in (state.last_error or "")
    world.exit("a-1", -9)
    world.tick(0.1)
    assert "a-2" not in world.memory  # backing off, not respawning in a loop
    world.tick(2.0)
    world.memory["a-2"] = 1500  # over max_memory while loading: killed too (it holds no job
    world.poll()  # and may not heed SIGTERM before it is up)
    assert ("a-2", Reason.MAX_MEMORY) in world.killed


def test_a_fresh_worker_over_kill_memory_backs_off_instead_of_looping() -> None:
    world = World(BASE.replace("max_attempts: 2", "max_attempts: 2, kill_memory: 50"))
    world.ready("a-1")  # 100 bytes right after warm-up
    assert ("a-1", Reason.KILL_MEMORY) in world.killed
    assert world.core.pool.models["a"].unavailable
    world.exit("a-1", -9)
    world.tick(0.1)
    assert "a-2" not in world.memory
    key = world.request(valid("a", 1))
    assert world.code(key) == "unavailable"


def test_batch_mates_of_a_memory_bomb_run_alone_and_succeed() -> None:
    world = World(BASE.replace("max_attempts: 2", "max_attempts: 2, kill_memory: 1000"))
    keys = [world.request(valid("a", 1)) for _ in range(4)]
    world.ready("a-1")
    assert [len(b.jobs) for b in world.batches["a-1"]] == [4]  # all four in one batch
    world.memory["a-1"] = 5000  # one of them blew the limit: which one is unknown
    world.poll()
    world.exit("a-1", -9)
    world.tick(2.0)
    world.ready("a-2")
    sizes = []
    while world.batches.get("a-2"):
        sizes.append(len(world.batches["a-2"][0].jobs))
        world.answer("a-2")
    assert set(sizes) == {1}  # every suspect alone from then on
    assert [world.code(k) for k in keys] == ["ok"] * 4


def test_a_job_that_crashed_its_worker_alone_runs_alone_after() -> None:
    world = World()
    world.ready("a-1")
    crash = world.request(valid("a", 1))  # alone on a-1, which then dies
    world.exit("a-1", -11)
    keys = [world.request(valid("a", 1)) for _ in range(3)]
    world.tick(2.0)
    world.ready("a-2")
    first = world.batches["a-2"][0]
    assert [j.id for j in first.jobs] == [1]  # the suspect alone, its mates after
    while world.batches.get("a-2"):
        world.answer("a-2")
    assert all(world.code(k) == "ok" for k in [crash, *keys])


def test_a_trend_with_max_memory_waits_until_the_replacement_needs_the_time_left() -> None:
    # The worker takes 10 s to start; it grows 1 MB/s (3.6 GB/h, over max_growth_per_hour)
    # towards a max_memory 200 MB away. With trend_lead 3 the trend recycles it once under
    # 3 x 10 s + 2 polls are left, not at its first confirmed trend ~170 s before the limit.
    world = World(BASE.replace("max_attempts: 2", "max_attempts: 2, max_growth_per_hour: 1GiB, "
                               "max_growth_per_1k_jobs: null, trend_window: 20, "
                               "trend_confirmations: 2, max_memory: 200000000"))
    world.tick(10.0)
    world.ready("a-1")
    start = world.now
    while not world.core.pool.models["a"].recycles and world.now < start + 300:
        world.tick(1.0)
        world.heartbeat("a-1")
        world.memory["a-1"] = 100 + int(1_000_000 * (world.now - start))
        world.poll()
    assert dict(world.core.pool.models["a"].recycles) == {"growth_per_hour": 1}
    left = (200_000_000 - world.memory["a-1"]) / 1_000_000
    assert 0 < left <= 3 * 10.0 + 2 * 1.0, left
    world.tick()
    assert "a-2" in world.memory  # its replacement is on its way, with the time it needs
    assert world.state("a-1") is State.READY  # and it serves until that one is ready


def test_workers_leaking_in_lockstep_are_each_replaced_before_max_memory() -> None:
    # Three workers started together leak 1 MB/s each towards a max_memory 200 MB away and
    # take 10 s to start; one recycle at a time. The lead waits for the turns ahead, so
    # every recycle is by trend, none by max_memory, and the pool never drops below three.
    world = World(BASE.replace("workers: 1", "workers: 3").replace(
        "max_attempts: 2", "max_attempts: 2, max_growth_per_hour: 1GiB, "
        "max_growth_per_1k_jobs: null, trend_window: 20, trend_confirmations: 2, "
        "max_memory: 200000000"))
    spawned: dict[str, float] = {}
    start = world.now
    fewest = 3
    while world.now < start + 400:
        for worker in world.memory:
            spawned.setdefault(worker, world.now)
            if world.state(worker) is State.STARTING and world.now - spawned[worker] >= 10:
                world.ready(worker)
        world.tick(1.0)
        for worker in list(world.memory):
            if world.state(worker) not in (None, State.STARTING):
                world.heartbeat(worker)
                world.memory[worker] = 100 + int(1e6 * (world.now - spawned[worker] - 10))
        world.poll()
        for worker in list(world.memory):
            if world.state(worker) is State.STOPPING:
                world.exit(worker, 0)
        if world.now - start > 30:
            fewest = min(fewest, sum(world.state(w) is State.READY for w in world.memory))
    recycles = dict(world.core.pool.models["a"].recycles)
    assert set(recycles) == {"growth_per_hour"} and recycles["growth_per_hour"] >= 6, recycles
    assert fewest == 3


PADDED = BASE.replace("    policy:",
                      "    padding: {seq: {inputs: {ids: 1}, sizes: [4, 8]}}\n    policy:")
IDS = [{"name": "ids", "dtype": "int32", "shape": [None, None]}]


def ids(length: int) -> list[Any]:
    specs, arrays = pack_arrays({"ids": np.zeros((1, length), "int32")})
    return frames_for({"model": "a", "inputs": specs}, [bytes(a) for a in arrays])


def test_a_reloaded_padding_reaches_admission_with_its_first_ready_worker() -> None:
    world = World(PADDED)
    world.ready("a-1", IDS)
    path = Path("/tmp/tfs-core-cases/config.yaml")
    # Axis 2 of a 2-dimensional input: the new workers can never load it. Until one is
    # ready admission keeps the padding the serving workers have, and they serve on.
    world.core.reload(parse_config(PADDED.replace("{ids: 1}", "{ids: 2}"), path), world.now)
    world.poll()  # a reload's recycle starts at the next poll, its replacement at a tick
    world.tick()
    assert world.state("a-2") is State.STARTING
    key = world.request(ids(3))
    world.exit("a-2", WorkerExit.LOAD_ERROR)
    while world.batches.get("a-1"):
        world.answer("a-1")
    assert world.code(key) == "ok"
    # Settings a worker can load: from its ready on, admission pads to its sizes.
    world.core.reload(parse_config(PADDED.replace("[4, 8]", "[16]"), path), world.now)
    world.tick(120.0)  # past the failed load's back-off
    world.poll()
    world.tick()
    [new] = [w for w in world.core.pool.workers.values() if w.state is State.STARTING]
    assert world.code(world.request(ids(12))) == "bad_request"  # over 8: not yet
    world.ready(new.id, IDS)
    key = world.request(ids(12))
    assert key not in world.replies  # admitted: answered by a worker, not at admission


def test_a_failing_replacement_is_retried_by_any_reload_and_its_elder_leaves_stopped() -> None:
    world = World()
    world.ready("a-1")
    path = Path("/tmp/tfs-core-cases/config.yaml")
    changed = parse_config(BASE.replace('"mod:a"', '"mod:a2"'), path)
    assert world.core.reload(changed, world.now).replaced == ["a"]
    world.poll()
    world.tick()
    world.exit("a-2", WorkerExit.LOAD_ERROR)  # the new settings cannot load
    state = world.core.pool.models["a"]
    assert state.unavailable and state.backoff_until > world.now
    status = Controller(world.core, dict, lambda: True, lambda: True).status(world.now)
    assert status["models"]["a"]["failing_to_start"] and status["models"]["a"]["available"]
    assert "a: available; NEW WORKERS FAIL TO START: worker a-2 exited before ready" in \
        render_status(status)
    # The same file again (the operator fixed the module it names): tried at once.
    again = world.core.reload(parse_config(BASE.replace('"mod:a"', '"mod:a2"'), path),
                              world.now)
    assert again.replaced == [] and again.retried == ["a"]
    assert state.failures == 0 and state.last_error is None and state.backoff_until == 0.0
    world.tick()
    assert world.state("a-3") is State.STARTING and world.state("a-1") is State.READY
    # A shutdown before any replacement served: a-1 was never replaced, it is stopped.
    world.core.shutdown(world.now, "SIGTERM")
    world.tick()
    world.exit("a-1", 0)
    world.exit("a-3", 0)
    assert {str(cause): n for cause, n in state.exits.items()} == \
        {"boot_failed": 1, "stopped": 2}


def test_requests_read_together_batch_together_on_an_idle_worker() -> None:
    """Jobs already read are one arrival: the idle worker gets them as one batch, not the
    first alone while its mates wait for it to come back (a refusal among them is answered
    and batches nothing)."""
    world = World()
    world.ready("a-1")
    burst = [[b"r%d" % i, *valid("a", 1, 2)] for i in range(5)]
    burst.insert(2, [b"bad", *hostile("list_dtype")])
    world.core.requests(burst, world.now)
    world.run()
    [batch] = world.batches["a-1"]
    assert len(batch.jobs) == 5
    assert world.replies[b"bad"][0].header["code"] == "bad_request"
    world.answer("a-1")
    assert sorted(world.replies) == sorted([b"bad", *(b"r%d" % i for i in range(5))])


def test_a_deadline_just_passed_still_wakes_the_loop_for_housekeeping() -> None:
    """A wake-up landing on a queued job's deadline before housekeeping was due skipped the
    housekeeping; the passed deadline then no longer woke the loop, and the job was answered
    at the next memory poll (seen: 195 ms late, past the client's own wait)."""
    world = World()
    world.ready("a-1")
    busy = world.request(valid("a", 1, 2))
    late = world.request(frames_for({"model": "a", "inputs": [
        {"name": "x", "dtype": "float32", "shape": [1, 2]}], "timeout_ms": 500}, [bytes(8)]))
    assert world.core.queue_wake(world.now, world.now + 0.01) == world.now + 0.5
    housekeeping = world.now + 0.5 + 0.004  # the deadline passed between two housekeepings
    assert world.core.queue_wake(world.now + 0.5001, housekeeping) == housekeeping
    world.tick(0.5 + 0.004)
    assert world.code(late) == "deadline_exceeded"
    assert world.core.queue_wake(world.now, world.now + 0.01) == math.inf
    world.answer("a-1")
    assert world.code(busy) == "ok"


def test_a_job_id_over_the_limit_is_refused_under_its_first_64_bytes() -> None:
    world = World()
    frames = valid("a", 1, 2)
    frames[2] = b"j" * 64 + b"tail" * 1000  # version, kind, job id, header, arrays
    key = world.request(frames)
    [reply] = world.replies[key]
    assert reply.header["code"] == "bad_request" and "job id" in reply.header["message"]
    assert reply.job_id == b"j" * 64


def test_a_start_timeout_backs_off_before_the_next_spawn_and_says_so() -> None:
    """The killed worker's slot is free at once: the next worker waited for nothing, while
    the event announced a back-off; and its exit read 'signal SIGKILL' (the OOM killer's
    usual mark) instead of the start timeout."""
    world = World(BASE.replace("  max_message_size: 2048", "  max_message_size: 2048\n"
                               "  start_timeout: 30s"))
    spawned = len(world.memory)
    world.tick(31.0)
    [(worker, reason)] = world.killed
    assert reason is Reason.START_TIMEOUT
    world.tick(0.5)
    assert len(world.memory) == spawned  # backing off (1 s after a first failure)
    world.exit(worker, -9)
    state = world.core.pool.models["a"]
    assert "start_timeout (30s)" in str(state.last_error) and state.failures == 1
    assert len(world.memory) == spawned
    world.tick(0.6)
    assert len(world.memory) == spawned + 1  # after the back-off, one more try


def test_a_batch_past_job_timeout_answers_one_job_and_requeues_its_mates() -> None:
    """The overdue list was taken before the kill: every batch mate, requeued by the kill,
    was then answered 'timeout' too (a whole burst, now that bursts batch together)."""
    world = World(BASE.replace("max_attempts: 2}", "max_attempts: 2, job_timeout: 5s}"))
    world.ready("a-1")
    keys = [[b"t%d" % i, *valid("a", 1, 2)] for i in range(3)]
    world.core.requests(keys, world.now)
    world.run()
    assert len(world.batches["a-1"][0].jobs) == 3
    world.tick(6.0)
    answered = [k[0] for k in keys if k[0] in world.replies]
    assert len(answered) == 1 and world.code(answered[0]) == "timeout"
    assert [w for w, _ in world.killed] == ["a-1"]
    world.exit("a-1", -9)
    world.tick(0.1)
    [replacement] = [w for w in world.memory if w != "a-1"]
    world.ready(replacement)
    while world.batches.get(replacement):
        world.answer(replacement)
    assert sorted(world.code(k[0]) for k in keys) == ["ok", "ok", "timeout"]


def test_a_short_deadline_behind_a_long_one_wakes_the_loop_in_time() -> None:
    """Only the head's deadline woke the loop: a job queued behind one without a deadline (or
    a longer one) was answered up to MAX_SLEEP late."""
    world = World()
    world.ready("a-1")
    world.request(valid("a", 1, 2))  # runs
    world.request(valid("a", 1, 2))  # queued, no deadline
    spec = [{"name": "x", "dtype": "float32", "shape": [1, 2]}]
    short = world.request(frames_for({"model": "a", "inputs": spec, "timeout_ms": 100},
                                     [bytes(8)]))
    assert world.core.queue_wake(world.now, world.now + 0.01) == world.now + 0.1
    world.tick(0.1)
    assert world.code(short) == "deadline_exceeded"
    assert world.core.queue_wake(world.now, world.now + 0.01) == math.inf


def test_a_worker_of_replaced_settings_failing_late_is_not_the_new_settings_failure() -> None:
    """reload --wait judges the settings now in force: a broken reload's worker still
    loading when the fix is reloaded must not report the fix as failing."""
    world = World()
    world.ready("a-1")
    path = Path("/tmp/tfs-core-cases/config.yaml")
    broken = parse_config(BASE.replace('"mod:a"', '"mod:broken"'), path)
    assert world.core.reload(broken, world.now).replaced == ["a"]
    world.poll()
    world.tick()
    assert world.state("a-2") is State.STARTING  # the broken settings, still loading
    fixed = parse_config(BASE.replace('"mod:a"', '"mod:fixed"'), path)
    assert world.core.reload(fixed, world.now).replaced == ["a"]
    world.poll()
    world.tick()
    world.exit("a-2", WorkerExit.LOAD_ERROR)  # the broken settings fail, late
    state = world.core.pool.models["a"]
    assert state.last_error is None and state.failures == 0 and not state.unavailable
    assert state.backoff_until <= world.now
    world.tick()  # no back-off: the fixed settings are tried at once
    assert world.state("a-3") is State.STARTING
    world.exit("a-3", WorkerExit.LOAD_ERROR)  # a failure of the settings now in force counts
    assert state.unavailable and state.failures == 1 and state.last_error


def test_a_silence_the_supervisor_caused_is_not_a_hung_worker() -> None:
    """A loop that stalled (a blocking call, SIGSTOP, a suspended host) has the workers'
    heartbeats of that time unread in its socket: the daemon tells the core, and nobody
    is killed for it. A real silence after it still is."""
    world = World()
    world.ready("a-1")
    timeout = world.core.pool.workers["a-1"].heartbeat_timeout
    world.now += timeout * 3
    world.core.stalled(timeout * 3, world.now)
    world.tick()
    assert not world.killed and world.state("a-1") is State.READY
    for bad in (float("nan"), float("-inf"), -5.0):  # never moves a clock back, or breaks it
        world.core.stalled(bad, world.now)
        world.tick()
    assert not world.killed
    world.tick(timeout + 0.1)  # silent while the supervisor listened: hung
    assert world.killed == [("a-1", Reason.HUNG)]


def test_a_second_sigterm_lets_the_drain_finish_and_a_second_sigint_forces() -> None:
    """Kubernetes sends SIGTERM after the preStop hook that began the drain: it must not
    turn a clean drain into killed workers and abandoned jobs. Ctrl-C twice still forces."""
    for second, forced in (("SIGTERM", False), ("SIGINT", True)):
        world = World()
        world.ready("a-1")
        key = world.request(valid("a", 1))
        world.core.shutdown(world.now, "SIGTERM")
        world.core.shutdown(world.now, second)
        world.tick()
        if forced:
            assert world.code(key) == "timeout" and ("a-1", Reason.SHUTDOWN) in world.killed
        else:
            assert key not in world.replies and not world.killed
            world.answer("a-1")
            world.tick()
            assert world.code(key) == "ok" and world.stopped == ["a-1"]


def test_a_shutdown_during_a_recycle_keeps_the_leaving_worker_serving_the_queue() -> None:
    """The worker on its way out serves on while its replacement loads; a shutdown then
    must not stop it after its current job and leave the queue waiting for a replacement
    that may never be ready within the budget."""
    world = World()
    world.ready("a-1")
    world.core.recycle("a", None)
    world.poll()
    world.tick()
    assert world.state("a-2") is State.STARTING  # the replacement, loading
    keys = [world.request(valid("a", 1)) for _ in range(3)]
    world.core.shutdown(world.now, "SIGTERM")
    world.tick()
    while not all(k in world.replies for k in keys):  # each batch answered, the next sent
        assert world.batches.get("a-1"), "the leaving worker was sent nothing more"
        world.answer("a-1")
        world.tick(0.1)
    assert all(world.code(k) == "ok" for k in keys)
    assert "a-1" in world.stopped  # and then the shutdown stops it


def test_a_retry_started_before_the_fix_failing_after_it_is_not_the_fix_failing() -> None:
    """An operator fixes the file the config points at (a model, a package) and reloads
    the same config: the model is retried as a new generation. A back-off retry that
    loaded the broken file and fails after that reload must not read as the fix failing
    (reload --wait said so whenever a retry was loading, which for a slow model is most of
    the time)."""
    world = World()
    world.exit("a-1", WorkerExit.LOAD_ERROR)  # broken file
    state = world.core.pool.models["a"]
    world.tick(state.backoff_until - world.now + 0.1)
    (probe,) = [w.id for w in world.core.pool.of_model("a") if w.state is State.STARTING]
    path = Path("/tmp/tfs-core-cases/config.yaml")
    assert world.core.reload(parse_config(BASE, path), world.now).retried == ["a"]
    world.exit(probe, WorkerExit.LOAD_ERROR)  # it had loaded the broken file
    assert state.last_error is None and state.failures == 0 and not state.unavailable


def test_recycle_and_reload_are_refused_while_stopping() -> None:
    """They used to answer success ("recycling ..., replacement first") though no
    replacement can start during a shutdown."""
    world = World()
    world.ready("a-1")
    world.core.shutdown(world.now, "SIGTERM")
    answers: list[dict[str, Any]] = []
    controller = Controller(world.core, lambda answer: answers.append({}), lambda: False,
                            lambda: False)
    for command in ({"command": "recycle", "model": "a"}, {"command": "reload"}):
        result = controller.handle(command, world.now, True, answers.append)
        assert result is not None and not result["ok"] and "stopping" in result["error"]
    assert not answers
    assert controller.handle({"command": "status"}, world.now, True, answers.append)["ok"]


def test_a_repeated_request_is_known_by_its_header_bytes_and_its_frames_still_checked() -> None:
    """Admission keys a description it passed by the header bytes it came in, so the next
    request with those bytes is not parsed nor walked again; its frames are still measured."""
    world = World()
    world.ready("a-1")
    first = valid("a", 1, 2)
    world.request(first)
    assert first[3] in world.core.admission.known["a"].passed
    short = [*first[:4], first[4][:-1]]  # the same header, a frame one byte short
    refused = world.request(short)
    assert world.code(refused) == "bad_request"
    assert "7 bytes" in world.replies[refused][0].header["message"]
    world.answer("a-1")
    again = world.request(valid("a", 1, 2))
    world.answer("a-1")
    assert world.code(again) == "ok"


def test_model_available_is_logged_only_after_model_unavailable() -> None:
    """A reload's new workers that fail while the old ones serve on never made the model
    unavailable: their recovery is no `model_available` (issue 36)."""
    import structlog

    path = Path("/tmp/tfs-core-cases/config.yaml")
    world = World()
    world.ready("a-1")
    with structlog.testing.capture_logs() as logged:
        world.core.reload(parse_config(BASE.replace('"mod:a"', '"mod:a2"'), path), world.now)
        world.poll()
        world.tick()
        world.exit("a-2", WorkerExit.LOAD_ERROR)  # a-1 serves on
        for _ in range(12):  # past the back-off (a-1 alive): tried again, and this loads
            world.heartbeat("a-1")
            world.tick(10.0)
        world.poll()
        world.tick()
        world.ready("a-3")
        world.poll()  # a-3 judged within its limits
    events = [e["event"] for e in logged]
    assert "worker_boot_failed" in events and "model_unavailable" not in events, events
    assert "model_available" not in events, events

    world = World()  # the first worker cannot load: unavailable, then available
    with structlog.testing.capture_logs() as logged:
        world.exit("a-1", WorkerExit.LOAD_ERROR)
        world.tick(120.0)  # past the back-off
        [new] = [w.id for w in world.core.pool.workers.values() if w.state is State.STARTING]
        world.ready(new)
        world.poll()
    events = [e["event"] for e in logged if e["event"].startswith("model_")]
    assert events == ["model_unavailable", "model_available"], events


def test_explain_in_warm_up_says_not_judged_yet_and_what_it_grew() -> None:
    """Not 'not growing beyond noise' for a worker that grew 340 MiB in its warm-up; nor
    its loading (sampled while it started) shown as grown over its first jobs."""
    from supervisor.cli.render import render_explain

    world = World(BASE.replace("warmup_jobs: 0, warmup_seconds: 0", "warmup_jobs: 1000"))
    world.poll()
    world.memory["a-1"] += 490 << 20  # the model loaded
    world.tick(1.0)
    world.ready("a-1")
    world.poll()
    for _ in range(16):
        world.request(valid("a", 1))
        world.answer("a-1")
    world.memory["a-1"] += 340 << 20
    world.tick(1.0)
    world.poll()
    report = Controller(world.core, dict, lambda: True, lambda: True).explain("a")["result"]
    [worker] = report["workers"]
    assert worker["warmed_up"] is False and worker["so_far"]["jobs"] == 16, worker
    text = render_explain(report)
    assert "not judged yet" in text and "+340.0MiB over 16 jobs" in text, text
    assert "beyond noise" not in text


def _serve(world: World, seconds: float, clients: int, gap: float) -> float:
    """Clients each sending a job ``gap`` seconds after their last answer; each batch takes
    0.5 ms + 0.05 ms per row in its worker (the MLP's shape: calls cost more than rows).
    Returns the mean rows per batch sent meanwhile."""
    done_at: dict[str, float] = {}
    sent_before = world.core.router.batches.get("a", (0, 0, 0))
    outstanding, next_send = 0, world.now
    end = world.now + seconds
    while world.now < end:
        for worker, batches in world.batches.items():
            if batches and worker not in done_at:
                done_at[worker] = world.now + 0.0005 + 0.00005 * batches[0].rows
        for worker, at in sorted(done_at.items(), key=lambda kv: kv[1]):
            if at <= world.now:
                outstanding -= len(world.batches[worker][0].jobs)
                del done_at[worker]
                world.answer(worker)
        if outstanding < clients and world.now >= next_send:
            world.request(valid("a", 1))
            outstanding += 1
            next_send = world.now + gap
        world.tick(0.0002)
    count, rows, _ = world.core.router.batches["a"]
    return (rows - sent_before[1]) / (count - sent_before[0])


def test_the_default_batch_wait_adapts_to_the_load() -> None:
    """batch_timeout_ms unset: one client is never held; 32 clients on 2 workers fill their
    batches, more than with a fixed 0, the wait bounded and explained in status."""
    config = BASE.replace("workers: 1", "workers: 2").replace("max_batch_size: 8",
                                                               "max_batch_size: 32")
    fixed = World(config.replace("max_batch_size: 32", "max_batch_size: 32, "
                                 "batch_timeout_ms: 0"))
    adaptive = World(config)
    for world in (fixed, adaptive):
        world.ready("a-1")
        world.ready("a-2")
    one = _serve(adaptive, 0.6, clients=1, gap=0.0002)
    wait = Controller(adaptive.core, dict, lambda: True, lambda: True).status(
        adaptive.now)["models"]["a"]["batches"]["wait"]
    assert one == 1.0 and wait["mode"] == "adaptive" and wait["ms"] == 0.0, wait
    assert "no wait: 0.0 jobs outstanding" in wait["why"]
    loaded = {"fixed": _serve(fixed, 0.6, clients=32, gap=0.0),
              "adaptive": _serve(adaptive, 0.6, clients=32, gap=0.0)}
    assert loaded["adaptive"] > 1.5 * loaded["fixed"], loaded
    status = Controller(adaptive.core, dict, lambda: True, lambda: True).status(adaptive.now)
    wait = status["models"]["a"]["batches"]["wait"]
    assert 0 < wait["ms"] <= 20 and "waiting for ~" in wait["why"], wait
    assert "batch wait" in render_status(status) and "(adaptive: waiting for ~" in \
        render_status(status)
    assert Controller(fixed.core, dict, lambda: True, lambda: True).status(fixed.now)[
        "models"]["a"]["batches"]["wait"] == {"mode": "fixed", "ms": 0.0,
                                               "why": "batch_timeout_ms is set"}


def test_a_recycle_of_a_worker_not_live_names_those_that_are() -> None:
    world = World()
    world.ready("a-1")
    with pytest.raises(KeyError, match=r"no live worker 'a-9' \(live: a-1\)"):
        world.core.recycle("a", "a-9")


def test_a_batch_wait_that_ends_between_housekeepings_is_sent_at_once() -> None:
    """A partial batch whose wait ended between two housekeepings was left, while its
    worker sat idle, to the next job or memory poll: under the adaptive wait, 3 clients on
    one worker fell from ~1,000 to ~50 jobs/s. The wait's end wakes the loop, and that wake
    sends it (waits_over), whatever the housekeeping's turn."""
    world = World(BASE.replace("batching: {max_batch_size: 8}",
                               "batching: {max_batch_size: 8, batch_timeout_ms: 5}"))
    world.ready("a-1")
    start = world.now
    held = world.request(valid("a", 1, 2))
    assert "a-1" not in world.batches  # waiting for batch mates
    assert world.core.queue_wake(start, start + 0.01) == pytest.approx(start + 0.005)
    world.now = start + 0.006  # the wait is over; the next housekeeping is 4 ms away
    assert world.core.queue_wake(world.now, start + 0.01) == world.now  # wake now
    world.core.waits_over(world.now)
    world.run()
    [batch] = world.batches["a-1"]
    assert len(batch.jobs) == 1
    # with the worker busy, an ended wait does not wake the loop (its answer will)
    world.request(valid("a", 1, 2))
    world.now += 0.006
    assert world.core.queue_wake(world.now, world.now + 0.01) == math.inf
    world.answer("a-1")
    assert world.code(held) == "ok"
