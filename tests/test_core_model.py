"""The two promises, checked by a model-based test of the socket-free core.

Hypothesis drives ``supervisor.core.core.Core`` with random interleavings of events — client
requests (valid and hostile), workers that become ready, answer, answer in part, speak
garbage, crash, hang, exit after asking to be recycled, memory readings over the limits,
manual recycles, reloads that add, remove and change models and heartbeat settings, clock
steps, spawn failures and shutdown — while a simulated world plays the processes. After
every step:

- no request is ever answered twice, and every reply goes to a request that was made;
- a batch goes only to a worker in rotation that is alive and has not said it is leaving;
- jobs of different clients share a batch only when every array agrees on its rows;
- no job is sent to more than ``max_attempts`` workers, whatever the cause;
- every admitted job is in exactly one place, and a model's queue never holds more than
  ``max_queue`` jobs or ``max_queue_bytes`` bytes;
- after a memory poll, no worker over ``max_memory`` is in rotation, none over
  ``kill_memory`` is left unkilled;
- every worker has a slot below its model's worker count, no two current workers share
  one, and the metrics have at most two per-worker series per slot (however many recycles);
- a SIGKILL the core did not ask for is counted as ``killed_externally``, or ``oom_killed``
  when the container's OOM-kill counter rose with it;
- under a container memory limit, no replacement is spawned beside the worker it replaces
  unless the working set last read, plus a warm worker of its model and the kill buffer,
  fits under the limit;
- the container's pressure line is never above half the limit, and a second pressure drain
  never leaves a model with no ready worker.

At the end the world turns healthy; every request must then be answered exactly once,
without a shutdown to sweep up what was stranded, and shutdown must finish.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from supervisor.config.keys import Config
from supervisor.config.loading import parse_config
from supervisor.core.actions import Kill, Reply, SampleNow, SendBatch, Spawn, Stop
from supervisor.core.budget import (
    LEAD_MARGIN,
    MAX_POLL_LATENESS,
    MAX_WAY_OUT,
    POLL_GAPS_KEPT,
    WAYS_OUT_KEPT,
    CgroupMemory,
)
from supervisor.core.core import Core
from supervisor.core.history import LIFE_POINTS, Reading
from supervisor.core.pool import State
from supervisor.core.reasons import ExitCause, Reason
from supervisor.core.traffic import MAX_AXES, PAST_WORKERS, RECENT_POINTS
from supervisor.core.traffic import buckets as length_buckets
from supervisor.daemon.metrics import slot_rows
from supervisor.shared.exitcodes import WorkerExit
from supervisor.shared.protocol import (
    HEARTBEAT,
    INFER,
    MAX_BATCH_JOBS,
    MODELS,
    READY,
    RESULT,
    VERSION,
    Message,
    encode,
    error_message,
    pack_arrays,
    pack_results,
    signed,
)

MAX_MEMORY = 1000
KILL_MEMORY = 2000
MAX_QUEUE = 6
MAX_QUEUE_BYTES = 160
MAX_MESSAGE = 4096

BASE = """
supervisor:
  runtime_dir: /tmp/tfs-core-model
  poll_interval: 1s
  max_queue: MAX_QUEUE
  max_queue_bytes: MAX_QUEUE_BYTES
  max_message_size: MAX_MESSAGE
  heartbeat_interval: HEARTBEAT_INTERVAL
  heartbeat_timeout: HEARTBEAT_TIMEOUT
  start_timeout: 60s
  shutdown_timeout: 30s
models:
  a:
    handler: "mod:a"
    workers: 2
    batching:
      max_batch_size: 4
    padding:
      width:
        inputs: {x: 1}
        sizes: [2, 4, 8]
    policy:
      max_memory: MAX_MEMORY
      kill_memory: KILL_MEMORY
      max_attempts: 2
      drain_timeout: 20s
      job_timeout: JOB_TIMEOUT
      warmup_jobs: 0
      warmup_seconds: 0
      max_jobs: 40
  MODEL_B
"""
MODEL_B = """b:
    handler: "mod:b"
    workers: 1
    batching:
      max_batch_size: 1
    policy:
      max_memory: MAX_MEMORY
      max_attempts: 1
      surge: false"""
MODEL_C = """c:
    handler: "mod:c"
    workers: 1"""


def variant(heartbeat: str = "1s", timeout: str = "5s", job_timeout: str = "null",
            second: str = MODEL_B) -> dict[str, str]:
    return {"HEARTBEAT_INTERVAL": heartbeat, "HEARTBEAT_TIMEOUT": timeout,
            "JOB_TIMEOUT": job_timeout, "MODEL_B": second}


CONFIGS = {
    "start": variant(),
    "faster_heartbeat": variant(heartbeat="0.1s", timeout="0.5s"),
    "remove_b_add_c": variant(second=MODEL_C),
    "job_timeout": variant(job_timeout="10s"),
}
NUMBERS = {"MAX_QUEUE_BYTES": MAX_QUEUE_BYTES, "MAX_QUEUE": MAX_QUEUE,
           "MAX_MESSAGE": MAX_MESSAGE, "MAX_MEMORY": MAX_MEMORY, "KILL_MEMORY": KILL_MEMORY}
MAX_ATTEMPTS = {"a": 2, "b": 1, "c": 2}
WORKERS = {"a": 2, "b": 1, "c": 1}


def config(name: str) -> Config:
    text = BASE
    for key, value in {**CONFIGS[name], **NUMBERS}.items():  # names that are no prefix of another
        text = text.replace(key, str(value))
    return parse_config(text, Path("/tmp/tfs-core-model/config.yaml"))


def frames_for(header: Any, arrays: list[bytes], kind: bytes = INFER) -> list[Any]:
    return [VERSION, kind, b"j", msgpack.packb(header, use_bin_type=True), *arrays]


def valid(model: str, rows: int, width: int = 2) -> list[Any]:
    specs, arrays = pack_arrays({"x": np.zeros((rows, width), "float32")})
    return frames_for({"model": model, "inputs": specs}, [bytes(a) for a in arrays])


def hostile(kind: str) -> list[Any]:
    spec = {"name": "x", "dtype": "float32", "shape": [1, 2]}
    data = bytes(8)
    headers: dict[str, Any] = {
        "nan_timeout": {"model": "a", "inputs": [spec], "timeout_ms": math.nan},
        "inf_timeout": {"model": "a", "inputs": [spec], "timeout_ms": math.inf},
        "negative_timeout": {"model": "a", "inputs": [spec], "timeout_ms": -1},
        "string_timeout": {"model": "a", "inputs": [spec], "timeout_ms": "10"},
        "huge_timeout": {"model": "a", "inputs": [spec], "timeout_ms": 1e308},
        "list_dtype": {"model": "a", "inputs": [dict(spec, dtype=["float32"])]},
        "map_dtype": {"model": "a", "inputs": [dict(spec, dtype={"a": 1})]},
        "list_model": {"model": ["a"], "inputs": [spec]},
        "unknown_model": {"model": "nope", "inputs": [spec]},
        "huge_dim": {"model": "a", "inputs": [dict(spec, shape=[2**64 - 1, 2])]},
        "inputs_not_list": {"model": "a", "inputs": "x"},
    }
    if kind in headers:
        return frames_for(headers[kind], [data])
    if kind == "rows_disagree":
        specs = [{"name": "x", "dtype": "float32", "shape": [1, 2]},
                 {"name": "y", "dtype": "float32", "shape": [0, 2]}]
        return frames_for({"model": "a", "inputs": specs}, [data, b""])
    if kind == "scalar":
        return frames_for({"model": "a", "inputs": [{"name": "x", "dtype": "float32",
                                                     "shape": []}]}, [bytes(4)])
    if kind == "too_big":
        return valid("a", MAX_MESSAGE // 8 + 1)
    if kind == "frames_missing":
        return frames_for({"model": "a", "inputs": [spec]}, [])
    if kind == "header_not_map":
        return [VERSION, INFER, b"j", msgpack.packb([1, 2])]
    if kind == "not_msgpack":
        return [VERSION, INFER, b"j", b"\xc1\xc1"]
    if kind == "short":
        return [VERSION, INFER]
    if kind == "models":
        return frames_for({}, [], MODELS)
    if kind == "wrong_kind":
        return frames_for({}, [], RESULT)
    raise AssertionError(kind)


HOSTILE = ["nan_timeout", "inf_timeout", "negative_timeout", "string_timeout",
           "huge_timeout", "list_dtype", "map_dtype", "list_model", "unknown_model",
           "huge_dim", "inputs_not_list", "rows_disagree", "scalar", "too_big",
           "frames_missing", "header_not_map", "not_msgpack", "short", "models",
           "wrong_kind"]


def secret(worker_id: str) -> str:
    """Each spawn's secret (the daemon draws a random one; any distinct one will do here)."""
    return f"{worker_id:0>32}"


@dataclass
class SimWorker:
    """What the world knows of one worker process."""

    id: str
    pid: int
    alive: bool = True
    ready_sent: bool = False
    leaving_sent: bool = False
    stop_asked: bool = False
    killed: bool = False
    memory: int = 100
    heartbeat_timeout: float = 0.0  # the supervisor's setting when it was spawned
    last_beat: float = 0.0
    deaf_at_beat: float = 0.0  # the supervisor's stalled seconds so far, at last_beat
    batches: list[SendBatch] = field(default_factory=list)


class CoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 1000.0
        self.core = Core(config("start"))
        self.world: dict[str, SimWorker] = {}
        self.requests: set[bytes] = set()
        self.replies: dict[bytes, int] = {}
        self.next_client = 0
        self.next_pid = 100
        self.spawn_fails = False
        self.config_name = "start"
        self.sent_to: dict[int, int] = {}  # job id -> workers it was sent to, as seen here
        self.limit: int | None = None  # the container's memory limit (None: no cgroup limit)
        self.psi = 0  # the kernel's CPU pressure counter (microseconds some task waited)
        self.oom_kills = 0  # the container's kernel OOM-kill counter
        self.deaf = 0.0  # seconds the supervisor's loop stalled, in all (the stall rule)
        self.container(poll=False)  # the daemon reads its cgroup as it starts
        self.perform()

    # --- the world performing the core's actions -----------------------------------------

    def perform(self) -> None:
        while actions := self.core.take():
            for action in actions:
                self.perform_one(action)

    def perform_one(self, action: Any) -> None:
        if isinstance(action, Reply):
            key = bytes(action.envelope[0])
            assert key in self.requests, f"reply to a request never made: {key!r}"
            assert self.replies.get(key, 0) == 0, f"second reply to {key!r}: {action.msg}"
            self.replies[key] = 1
        elif isinstance(action, SendBatch):
            self.check_batch(action)
            self.world[action.worker_id].batches.append(action)
        elif isinstance(action, Spawn):
            self.check_room(action.model)
            if self.spawn_fails:
                self.core.exited(action.worker_id, WorkerExit.SPAWN_FAILED, self.now)
                return
            self.next_pid += 1
            timeout = self.core.config.supervisor.heartbeat_timeout
            self.world[action.worker_id] = SimWorker(action.worker_id, self.next_pid,
                                                     heartbeat_timeout=timeout,
                                                     last_beat=self.now,
                                                     deaf_at_beat=self.deaf)
            self.core.spawned(action.worker_id, self.next_pid, secret(action.worker_id))
        elif isinstance(action, Stop):
            self.world[action.worker_id].stop_asked = True
        elif isinstance(action, Kill):
            sim = self.world[action.worker_id]
            if action.reason is Reason.HUNG:  # silent for longer than its timeout, counting
                heard = self.now - sim.last_beat - (self.deaf - sim.deaf_at_beat)  # stalls out
                assert heard > sim.heartbeat_timeout, \
                    f"{sim.id} killed as hung {heard:.1f}s after its last heartbeat, of time " \
                    f"the supervisor listened (its timeout: {sim.heartbeat_timeout}s)"
            sim.killed = True
        elif isinstance(action, SampleNow):
            readings = {w: Reading(self.world[w].memory) for w in action.worker_ids
                        if w in self.world and self.world[w].alive}
            self.core.samples(self.now, readings, poll=False)

    def check_room(self, model: str) -> None:
        """A replacement beside the worker it replaces only when it fits: the working set
        last read + a warm worker of the model (its workers' largest baseline, else
        max_memory, else their largest reading) + the kill buffer, under the limit."""
        pool, budget = self.core.pool, self.core.budget
        if self.limit is None or budget.cgroup is None or not pool.replacing(model):
            return
        workers = list(pool.of_model(model))
        policy = pool.models[model].config.policy
        baselines = [w.assessment.baseline for w in workers if w.assessment.baseline]
        readings = [s.memory for w in workers if (s := w.history.last()) is not None]
        warm = max(baselines) if baselines else policy.max_memory or policy.kill_memory or \
            max(readings, default=0)
        need = budget.cgroup.working_set + warm + budget.buffer(None)
        assert need <= self.limit, f"a replacement of {model} spawned needing {need} " \
            f"under a limit of {self.limit}: {[(w.id, w.state, w.reason) for w in workers]}"

    def container(self, poll: bool) -> None:
        """The cgroup as the daemon reads it: the live workers' memory is its working set."""
        used = sum(w.memory for w in self.world.values() if w.alive)
        reading = CgroupMemory(1, "/sys/fs/cgroup/memory/test", self.limit, used + 50, 50,
                               oom_kills=self.oom_kills)
        self.core.memory(reading, None, poll)

    def check_batch(self, action: SendBatch) -> None:
        handle = self.core.pool.workers.get(action.worker_id)
        sim = self.world.get(action.worker_id)
        assert handle is not None and handle.state is State.READY, \
            f"batch sent to {action.worker_id} in state {handle and handle.state}"
        assert sim is not None and sim.alive and not sim.killed and not sim.leaving_sent \
            and not sim.stop_asked, f"batch sent to a leaving or dead worker {sim}"
        assert not sim.batches, "a second batch before the first was answered"
        jobs = action.jobs
        if len(jobs) > 1:
            assert all(j.rows is not None for j in jobs), "a job without rows was batched"
            # model a pads x's axis 1 up to 2, 4 or 8: jobs of shorter widths may ride in a
            # batch, padded up, but only into the rows it is padded with
            widths = [j.inputs[0]["shape"][1] for j in jobs if j.model == "a"]
            shapes = {tuple((s["name"], s["dtype"], tuple(s["shape"][2 if widths else 1:]))
                            for s in j.inputs) for j in jobs}
            assert len(shapes) == 1, f"jobs of different layouts batched: {shapes}"
            if widths:
                top = next(size for size in (2, 4, 8) if size >= widths[0])
                own = sum(j.rows or 0 for j, w in zip(jobs, widths, strict=True)
                          if next(size for size in (2, 4, 8) if size >= w) == top)
                assert max(widths) <= top, f"a longer job rode in a batch of {top}: {widths}"
                padded = next((size for size in (1, 2, 4) if size >= own), own)
                assert sum(j.rows or 0 for j in jobs) <= padded, \
                    f"riders past the rows a batch of {own} is padded with: {widths}"
        for job in jobs:
            self.sent_to[job.id] = self.sent_to.get(job.id, 0) + 1
            assert self.sent_to[job.id] <= MAX_ATTEMPTS[job.model], \
                f"job {job.id} sent to {self.sent_to[job.id]} workers (max_attempts " \
                f"{MAX_ATTEMPTS[job.model]})"

    def event(self, step: Any, *args: Any) -> None:
        pool = self.core.pool
        before = {name: [w.id for w in pool.ready(name)] for name in pool.models}
        leaving = any(w.leaving for w in pool.workers.values())
        step(*args)
        self.perform()
        self.check_last_ready(before)
        self.check_pressure_drains(before, leaving)

    def check_pressure_drains(self, before: dict[str, list[str]], leaving: bool) -> None:
        """The container's pressure may drain a model's last ready worker only as the first
        drain, with nothing else on its way out: a second at once never leaves a model with
        none serving (recycling.py, ``_pressure_eligible``). So in one step at most one model
        loses its last ready worker to a ``container_pressure`` drain, and only when no
        worker was leaving before it."""
        pool = self.core.pool
        if self.core.shutdown_started is not None:
            return
        emptied = [name for name, ids in before.items() if ids and name in pool.models
                   and not pool.models[name].removed and not pool.ready(name) and any(
                       (w := pool.workers.get(i)) is not None and not w.killed and
                       w.reason is Reason.CONTAINER_PRESSURE for i in ids)]
        assert len(emptied) <= 1 and not (emptied and leaving), \
            f"a pressure drain left {emptied} with no ready worker (leaving before: {leaving})"

    def check_last_ready(self, before: dict[str, list[str]]) -> None:
        """A model that had a ready worker never loses its last one to a planned recycle (a
        soft limit, a lifetime limit, an operator's, a reload's) before its replacement is
        ready: only a hard limit (a kill, the container's memory pressure), a death, the
        model's removal, a shutdown, ``surge: false`` or a fresh worker that cannot serve
        within its limit at all (the model is unavailable) may leave it with none."""
        pool, budget = self.core.pool, self.core.budget
        if self.core.shutdown_started is not None:
            return
        floor, headroom = budget.pressure_floor(None), budget.headroom()
        if floor is not None and headroom is not None and headroom < floor:
            return  # the container's hard line
        if budget.pressure is not None and budget.pressure.under:
            return  # the same line, drawn ahead of the workers' growth (budget.Pressure)
        for name, ids in before.items():
            state = pool.models.get(name)
            if not ids or state is None or pool.ready(name) or state.removed or \
                    not state.config.policy.surge or state.unavailable:
                continue
            for worker_id in ids:
                worker = pool.workers.get(worker_id)
                if worker is None or worker.killed:
                    continue  # it died, or a hard limit took it
                assert worker.reason is None or not worker.reason.planned, \
                    f"{name} left with no ready worker by {worker_id}'s planned recycle " \
                    f"({worker.reason}, now {worker.state}): " \
                    f"{[(w.id, w.state, w.reason) for w in pool.of_model(name)]}"

    def send_request(self, frames: list[Any]) -> None:
        key = b"client-%d" % self.next_client
        self.next_client += 1
        self.requests.add(key)
        self.event(self.core.request, [key, *frames], self.now)

    def workers(self, predicate: Any) -> list[SimWorker]:
        return [w for w in self.world.values() if w.alive and predicate(w)]

    # --- clients -------------------------------------------------------------------------

    @rule(model=st.sampled_from(["a", "a", "b", "c"]), rows=st.integers(0, 3),
          width=st.sampled_from([2, 2, 3, 8]), burst=st.integers(1, 4))
    def request(self, model: str, rows: int, width: int, burst: int) -> None:
        for _ in range(burst):  # bursts make batches
            self.send_request(valid(model, rows, width))

    @rule(models=st.lists(st.sampled_from(["a", "a", "b", "c"]), min_size=1, max_size=6),
          rows=st.integers(0, 3), hostile_at=st.integers(0, 8))
    def requests_read_together(self, models: list[str], rows: int, hostile_at: int) -> None:
        """Messages read in one pass over the socket: admitted in order, dispatched once."""
        messages = [valid(model, rows, 2) for model in models]
        if hostile_at < len(messages):
            messages[hostile_at] = hostile(HOSTILE[hostile_at % len(HOSTILE)])
        burst = []
        for frames in messages:
            key = b"client-%d" % self.next_client
            self.next_client += 1
            self.requests.add(key)
            burst.append([key, *frames])
        self.event(self.core.requests, burst, self.now)

    @rule(kind=st.sampled_from(HOSTILE))
    def hostile_request(self, kind: str) -> None:
        self.send_request(hostile(kind))

    @rule(timeout=st.sampled_from([1, 500, 5000]))
    def request_with_deadline(self, timeout: int) -> None:
        specs, arrays = pack_arrays({"x": np.zeros((1, 2), "float32")})
        self.send_request(frames_for({"model": "a", "inputs": specs, "timeout_ms": timeout},
                                     [bytes(a) for a in arrays]))

    # --- workers -------------------------------------------------------------------------

    @rule(data=st.data())
    def worker_ready(self, data: st.DataObject) -> None:
        # Any live worker that has not said it yet, including one told to stop (late).
        candidates = self.workers(lambda w: not w.ready_sent)
        if not candidates:
            return
        sim = data.draw(st.sampled_from(candidates))
        sim.ready_sent = True
        header = {"worker": sim.id, "pid": sim.pid, "warmup_seconds": 1.0,
                  "inputs": None, "outputs": None}
        self.event(self.core.worker_message, sim.id.encode(),
                   encode(signed(Message(READY, b"", header), secret(sim.id))), self.now)

    @rule(data=st.data(), outcome=st.sampled_from(["ok", "error", "huge_error", "partial",
                                                   "leaving"]))
    def worker_answers(self, data: st.DataObject, outcome: str) -> None:
        candidates = self.workers(lambda w: bool(w.batches) and not w.killed)
        if not candidates:
            return
        sim = data.draw(st.sampled_from(candidates))
        batch = sim.batches.pop(0)
        jobs = batch.jobs[:-1] if outcome == "partial" and len(batch.jobs) > 1 else batch.jobs
        replies = []
        for job in jobs:
            if outcome in ("error", "huge_error"):
                text = "x" * (200_000 if outcome == "huge_error" else 10)
                replies.append(error_message(str(job.id).encode(), "internal", text))
            else:
                specs, arrays = pack_arrays({"y": np.zeros((job.rows or 1, 1), "float32")})
                replies.append(Message(RESULT, str(job.id).encode(), {"outputs": specs},
                                       list(arrays)))
        leaving = outcome == "leaving"
        sim.leaving_sent = sim.leaving_sent or leaving
        self.event(self.core.worker_message, sim.id.encode(),
                   encode(signed(pack_results(replies, leaving=leaving), secret(sim.id))),
                   self.now)

    @rule(data=st.data())
    def worker_speaks_garbage(self, data: st.DataObject) -> None:
        candidates = self.workers(lambda w: w.ready_sent)
        if candidates:
            sim = data.draw(st.sampled_from(candidates))
            self.event(self.core.worker_message, sim.id.encode(),
                       [VERSION, b"results", b"", b"\xc1"], self.now)

    @rule(data=st.data(), kind=st.sampled_from([b"results", READY, HEARTBEAT]),
          proof=st.sampled_from(["none", "wrong", "own"]))
    def impostor_on_backend(self, data: st.DataObject, kind: bytes, proof: str) -> None:
        """A peer posing as a live worker (or one already gone, or none ever spawned),
        without that worker's spawn secret; or a gone worker's late message with its own."""
        names = [*sorted(self.world), "stranger"]
        sender = data.draw(st.sampled_from(names))
        if proof == "own" and (sender == "stranger" or self.world[sender].alive):
            return  # a live worker's own secret is the worker itself: other rules
        job_id = str(data.draw(st.integers(1, max(1, self.next_client)))).encode()
        header: dict[str, Any] = {"worker": sender, "jobs": [
            {"id": job_id, "kind": RESULT, "header": {}, "arrays": 0}], "tf_memory": None}
        msg = Message(kind, b"", header)
        if proof != "none":
            signed(msg, secret(sender) if proof == "own" else "f" * 32)
        worker = self.core.pool.workers.get(sender)
        before = worker and (worker.state, worker.last_heartbeat, worker.jobs)
        replies = len(self.replies)
        self.event(self.core.worker_message, sender.encode(), encode(msg), self.now)
        assert len(self.replies) == replies, "an impostor's answer reached a client"
        if worker is not None:
            assert (worker.state, worker.last_heartbeat, worker.jobs) == before, \
                f"an impostor changed {sender}"

    @rule(data=st.data(), code=st.sampled_from([1, -9, -11, int(WorkerExit.RECYCLE),
                                                int(WorkerExit.LOAD_ERROR), 0]))
    def worker_exits(self, data: st.DataObject, code: int) -> None:
        candidates = self.workers(lambda w: True)
        if not candidates:
            return
        sim = data.draw(st.sampled_from(candidates))
        worker = self.core.pool.workers.get(sim.id)
        external = worker is not None and code == -9 and not worker.killed
        state = self.core.pool.models[worker.model] if worker is not None else None
        before = state.exits.get(ExitCause.KILLED_EXTERNALLY, 0) if state else 0
        self.exit(sim, code)
        if external and state is not None:
            assert state.exits.get(ExitCause.KILLED_EXTERNALLY, 0) == before + 1, \
                f"{sim.id} SIGKILLed from outside not counted: {state.exits}"

    @rule(data=st.data())
    def kernel_oom_kill(self, data: st.DataObject) -> None:
        """The kernel kills a worker at the container's limit: named oom_killed."""
        candidates = self.workers(lambda w: not w.killed)
        if not candidates:
            return
        sim = data.draw(st.sampled_from(candidates))
        worker = self.core.pool.workers.get(sim.id)
        state = self.core.pool.models[worker.model] if worker is not None else None
        before = dict(state.exits) if state else {}
        self.oom_kills += 1
        self.container(poll=False)  # the daemon reads the counter when it reaps a SIGKILL
        self.exit(sim, -9)
        if worker is not None and state is not None:
            assert state.exits.get(ExitCause.OOM_KILLED, 0) == \
                before.get(ExitCause.OOM_KILLED, 0) + 1, f"{sim.id}: {state.exits}"
            assert state.exits.get(ExitCause.KILLED_EXTERNALLY, 0) == \
                before.get(ExitCause.KILLED_EXTERNALLY, 0)

    @rule(limit=st.sampled_from([None, 2500, 4000, 8000]))
    def container_limit(self, limit: int | None) -> None:
        """The pod's limit is resized in place (or there is none)."""
        self.limit = limit
        self.poll()

    @rule(share=st.sampled_from([None, 0.0, 0.05, 0.15, 0.5, 1.0]))
    def cpu_pressure(self, share: float | None) -> None:
        """The cores' contention changes (the adaptive batch wait of model a asks it), or
        the kernel's pressure file cannot be read."""
        if share is not None:
            self.psi += int(share * 1e6)
        self.event(self.core.cpu_pressure, None if share is None else self.psi, self.now)

    def exit(self, sim: SimWorker, code: int) -> None:
        sim.alive = False
        sim.batches.clear()
        self.event(self.core.exited, sim.id, code, self.now)

    @rule()
    def reap(self) -> None:
        """Workers that were killed, asked to stop, or said they were leaving, exit."""
        for sim in self.workers(lambda w: w.killed or w.stop_asked or w.leaving_sent):
            code = -9 if sim.killed else (int(WorkerExit.RECYCLE) if sim.leaving_sent else 0)
            self.exit(sim, code)

    @rule()
    def serve(self) -> None:
        """The world goes on as it should: workers come up and answer what they hold."""
        for sim in self.workers(lambda w: not w.ready_sent and not w.killed):
            sim.ready_sent = True
            self.event(self.core.worker_message, sim.id.encode(), encode(signed(Message(
                READY, b"", {"worker": sim.id, "warmup_seconds": 1.0}), secret(sim.id))),
                self.now)
        for sim in self.workers(lambda w: bool(w.batches) and not w.killed):
            batch = sim.batches.pop(0)
            replies = [error_message(str(j.id).encode(), "internal", "fine") for j in batch.jobs]
            self.event(self.core.worker_message, sim.id.encode(),
                       encode(signed(pack_results(replies), secret(sim.id))), self.now)

    @rule()
    def heartbeats(self) -> None:
        for sim in self.workers(lambda w: not w.killed):
            sim.last_beat, sim.deaf_at_beat = self.now, self.deaf
            header = {"worker": sim.id, "jobs": 0, "tf_memory": None}
            self.event(self.core.worker_message, b"hb-socket",
                       encode(signed(Message(HEARTBEAT, b"", header), secret(sim.id))),
                       self.now)

    @rule(data=st.data(), memory=st.sampled_from([100, 500, MAX_MEMORY - 1, MAX_MEMORY,
                                                  MAX_MEMORY + 500, KILL_MEMORY, 5000]))
    def memory_poll(self, data: st.DataObject, memory: int) -> None:
        candidates = self.workers(lambda w: True)
        if candidates:
            data.draw(st.sampled_from(candidates)).memory = memory
        self.poll()

    @rule(model=st.sampled_from(["a", "b"]), memory=st.sampled_from([MAX_MEMORY,
                                                                     MAX_MEMORY + 500]))
    def workers_leak_together(self, model: str, memory: int) -> None:
        """Every worker of a model crosses max_memory in the same poll (a leak they share)."""
        for sim in self.workers(lambda w: w.id.startswith(model + "-")):
            sim.memory = memory
        self.poll()

    @rule(data=st.data(), memory=st.sampled_from([MAX_MEMORY, KILL_MEMORY]))
    def busy_worker_over_a_limit(self, data: st.DataObject, memory: int) -> None:
        candidates = self.workers(lambda w: bool(w.batches) and not w.killed)
        if candidates:
            data.draw(st.sampled_from(candidates)).memory = memory
            self.poll()

    def poll(self) -> None:
        self.core.next_poll = 0.0  # a poll now, whatever the interval
        targets = self.core.poll_due(self.now) or []
        readings = {wid: Reading(self.world[wid].memory) for wid, _, _ in targets
                    if wid in self.world and self.world[wid].alive}
        self.container(poll=True)
        self.event(self.core.samples, self.now, readings, True)
        for worker in self.core.pool.workers.values():
            sim = self.world[worker.id]
            last = worker.history.last()
            if last is None or not sim.alive or last.memory != sim.memory:
                continue
            max_memory = self.core.pool.models[worker.model].config.policy.max_memory
            kill_memory = self.core.pool.models[worker.model].config.policy.kill_memory
            policy = self.core.pool.models[worker.model].config.policy
            if max_memory is not None and last.memory >= max_memory and \
                    worker.state is State.READY:
                # max_memory is soft: only the model's last ready worker serves on over it,
                # on its way out, until its replacement is ready (not with surge: false)
                others = [w for w in self.core.pool.ready(worker.model) if w is not worker]
                assert worker.leaving and not others and policy.surge, \
                    f"{worker.id} at {last.memory} over max_memory {max_memory} in rotation"
            if kill_memory is not None and last.memory >= kill_memory and \
                    worker.state is not State.STARTING:
                assert worker.killed, f"{worker.id} over kill_memory not killed"

    # --- time and the operator -----------------------------------------------------------

    @rule(step=st.sampled_from([0.001, 0.5, 1.0, 3.0, 11.0, 70.0]))
    def tick(self, step: float) -> None:
        self.now += step
        self.event(self.core.tick, self.now)

    @rule(step=st.sampled_from([3.0, 11.0, 70.0]))
    def stall(self, step: float) -> None:
        """The daemon's loop did not run for ``step`` seconds, and says so."""
        self.now += step
        self.deaf += step
        self.event(self.core.stalled, step, self.now)
        self.event(self.core.tick, self.now)

    @rule(data=st.data())
    def manual_recycle(self, data: st.DataObject) -> None:
        model = data.draw(st.sampled_from(["a", "b", "c"]))
        with contextlib.suppress(KeyError):
            self.core.recycle(model, None)
        self.perform()

    @rule(name=st.sampled_from(sorted(CONFIGS)))
    def reload(self, name: str) -> None:
        self.config_name = name
        self.event(self.core.reload, config(name), self.now)

    @rule(fails=st.booleans())
    def spawn_failures(self, fails: bool) -> None:
        self.spawn_fails = fails

    @precondition(lambda self: self.core.shutdown_started is None)
    @rule()
    def shutdown(self) -> None:
        self.event(self.core.shutdown, self.now, "SIGTERM")

    # --- invariants ----------------------------------------------------------------------

    @invariant()
    def every_job_in_exactly_one_place(self) -> None:
        router = self.core.router
        seen: set[int] = set()
        counts: dict[str, int] = {}
        sizes: dict[str, int] = {}
        for queue in router.queues.values():
            for job in queue:
                assert job.id not in seen and job.worker is None
                seen.add(job.id)
                counts[job.model] = counts.get(job.model, 0) + 1
                sizes[job.model] = sizes.get(job.model, 0) + job.nbytes
        for worker_id, held in router.held.items():
            worker = self.core.pool.workers.get(worker_id)
            assert worker is not None and worker.state in (State.READY, State.DRAINING), \
                f"jobs held by {worker_id} in state {worker and worker.state}"
            for job in held.values():
                assert job.id not in seen and job.worker == worker_id
                seen.add(job.id)
                counts[job.model] = counts.get(job.model, 0) + 1
                sizes[job.model] = sizes.get(job.model, 0) + job.nbytes
        for model in set(counts) | set(router.pending_jobs):
            assert router.pending_jobs.get(model, 0) == counts.get(model, 0)
            assert router.pending_bytes.get(model, 0) == sizes.get(model, 0)
            assert counts.get(model, 0) <= MAX_QUEUE
            assert sizes.get(model, 0) <= MAX_QUEUE_BYTES

    @invariant()
    def the_earliest_deadline_is_known_without_a_scan(self) -> None:
        """Expiries names the earliest deadline of any queued job (not just the head's), and
        stays bounded however many jobs pass through (by the queue's own bound)."""
        router = self.core.router
        for model, queue in router.queues.items():
            deadlines = [j.deadline for j in queue if j.deadline is not None]
            assert router.expiries.earliest(model) == (min(deadlines) if deadlines else None)
            assert len(router.expiries.heaps.get(model, [])) <= 2 * router.max_queue + 17

    @invariant()
    def the_pressure_line_is_bounded_and_never_under_the_kill_buffer(self) -> None:
        """The ways out the lead is measured on stay in fixed room; the container's pressure
        line is never below its kill buffer (the static floor is a minimum), nor its lead
        below a poll, nor above the latest a poll is expected plus the longest way out."""
        budget = self.core.budget
        assert len(budget.ways_out) <= WAYS_OUT_KEPT
        assert all(seconds >= 0 for seconds in budget.ways_out)
        assert len(budget.poll_gaps) <= POLL_GAPS_KEPT
        assert 1.0 <= budget.poll_seconds(1.0) <= MAX_POLL_LATENESS
        pressure = budget.pressure
        if pressure is not None:
            assert pressure.rate >= 0
            assert 1.0 <= pressure.lead <= MAX_POLL_LATENESS + LEAD_MARGIN * MAX_WAY_OUT
            assert pressure.line >= pressure.buffer == budget.buffer(None)
            # Never above half the limit (an idle container is never under pressure).
            assert pressure.cap is not None
            assert pressure.line <= max(pressure.buffer, pressure.cap)

    @invariant()
    def told_to_go_means_out_of_rotation(self) -> None:
        for worker in self.core.pool.workers.values():
            sim = self.world[worker.id]
            if sim.killed or sim.stop_asked or sim.leaving_sent or not sim.alive:
                assert worker.state is not State.READY, \
                    f"{worker.id} in rotation though {sim}"

    @invariant()
    def slots_stay_put(self) -> None:
        pool = self.core.pool
        for name in pool.models:
            current = [w.slot for w in pool.current(name)]
            assert len(current) == len(set(current)), f"two current workers share a slot " \
                f"of {name}: {[(w.id, w.slot, w.state) for w in pool.of_model(name)]}"
            assert all(0 <= w.slot < WORKERS[name] for w in pool.of_model(name)), \
                [(w.id, w.slot) for w in pool.of_model(name)]
        rows = slot_rows(pool)
        keys = [(r.model, r.slot, r.role) for r in rows]
        assert len(keys) == len(set(keys))
        for name in pool.models:
            assert sum(1 for r in rows if r.model == name) <= 2 * WORKERS[name]

    @invariant()
    def what_tune_reads_stays_in_fixed_room(self) -> None:
        """The record `tfsupervisor tune` reads (core/traffic.py, history.Life, the router's
        batch sizes) is bounded whatever the traffic, the recycles and the uptime."""
        pool, router = self.core.pool, self.core.router
        for state in pool.models.values():
            assert len(state.past) <= PAST_WORKERS
            assert len(state.traffic.lengths) <= MAX_AXES
            assert all(len(h.counts) <= length_buckets() for h in state.traffic.lengths.values())
            for record in state.past:
                assert len(record.life) <= LIFE_POINTS + 1 and len(record.recent) <= RECENT_POINTS
        for worker in pool.workers.values():
            assert len(worker.history.life.points) <= LIFE_POINTS + 1
        for sizes in router.batch_rows.values():
            assert len(sizes) <= MAX_BATCH_JOBS and all(1 <= k <= MAX_BATCH_JOBS or k == 0
                                                        for k in sizes)
        assert set(router.batch_rows) <= set(router.queues) | set(pool.models)

    # --- the end: a healthy world answers everything -------------------------------------

    def teardown(self) -> None:
        self.spawn_fails = False
        for _ in range(400):
            if self.core.shutdown_started is None and \
                    len(self.replies) == len(self.requests):
                break
            self.healthy_step()
            if self.core.finished:
                break
        missing = self.requests - set(self.replies)
        assert not missing, f"{len(missing)} request(s) never answered: {sorted(missing)[:5]}"
        if self.core.shutdown_started is None:
            self.event(self.core.shutdown, self.now, "SIGTERM")
        for _ in range(400):
            if self.core.finished:
                break
            self.healthy_step()
        assert self.core.finished, "shutdown never finished"

    def healthy_step(self) -> None:
        for sim in self.workers(lambda w: w.memory >= MAX_MEMORY):
            sim.memory = 100
        self.serve()
        self.reap()
        self.heartbeats()
        self.now += 1.0
        self.event(self.core.tick, self.now)
        self.poll()


CoreMachine.TestCase.settings = settings(
    max_examples=300, stateful_step_count=80, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
TestCoreModel = CoreMachine.TestCase

