"""The worker pool: one registry of worker handles, one explicit state each, and spawning
(how many workers each model needs, with back-off for a model that cannot start).

No process is touched here: spawning appends a ``Spawn`` action that the daemon performs.
How a worker leaves (recycle, drain, stop, kill, death) is ``lifecycle.py``'s. Idle and busy
are not kept here: they follow from the router's in-flight table.
"""

from __future__ import annotations

import itertools
import math
import random
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import Any

from supervisor.config.keys import Config, ModelConfig
from supervisor.core.actions import Action, Spawn
from supervisor.core.diagnosis import Cause, Diagnosis
from supervisor.core.history import History
from supervisor.core.policy import Assessment, WorkerFacts
from supervisor.core.reasons import ExitCause, Reason
from supervisor.core.traffic import PAST_WORKERS, Traffic, WorkerRecord
from supervisor.shared import logs
from supervisor.shared.exitcodes import describe_exit
from supervisor.shared.padding import PadDim
from supervisor.shared.probes import Probes
from supervisor.shared.protocol import TensorSpec

log = logs.get(__name__)

# The cause of a recycle that is not about memory (manual, reload, max_jobs, ...).
NO_CAUSE = "none"

# Back-off after a worker fails before becoming ready: 1 s, 2 s, 4 s ... up to this.
MAX_BACKOFF = 60.0


class State(Enum):
    STARTING = "starting"  # process spawned, loading and warming up
    READY = "ready"  # in rotation: takes jobs
    DRAINING = "draining"  # no new jobs; finishing the ones it holds
    STOPPING = "stopping"  # told to stop, killed, or exiting on its own; nothing is sent
    GONE = "gone"  # exited and reaped


class Role(StrEnum):
    """A worker's place in its slot (metrics label series by model, slot and role)."""

    CURRENT = "current"  # starting or serving, and staying: at most one per slot
    OUTGOING = "outgoing"  # on its way out (serving on until replaced, draining, stopping)


@dataclass(eq=False)
class WorkerHandle:
    id: str
    model: str
    slot: int  # a stable place in the model's pool, 0..workers-1: what metrics are labelled by
    started_at: float
    jitter: float  # this worker's fraction off max_jobs / max_age, drawn once
    heartbeat_timeout: float  # judged against the interval it was started with
    pid: int | None = None  # known once the daemon has started the process
    secret: str | None = None  # its spawn secret: what proves a backend peer is this worker
    state: State = State.STARTING
    ready_at: float | None = None
    last_heartbeat: float = 0.0
    jobs: int = 0  # jobs answered by this worker
    warmup_seconds: float | None = None
    tf_memory: dict[str, int] | None = None
    reason: Reason | None = None  # set once, when its way out begins
    stop_deadline: float | None = None
    drain_deadline: float | None = None
    out_at: float | None = None  # when it left rotation (drained or stopped): its way out
    kill_reason: Reason | None = None  # why the supervisor sent SIGKILL, once it has
    fresh: bool = True  # not yet judged since it became ready
    history: History = field(default_factory=History)
    assessment: Assessment = field(default_factory=Assessment)  # the policy's latest numbers
    trend_streak: int = 0  # consecutive evaluations over a trend limit
    probes: Probes | None = None  # the latest its heartbeats carried
    ready_probes: Probes | None = None  # the first after it became ready: totals over its life
    diagnosis: Diagnosis | None = None  # why it grows, while it is suspect (diagnosis.py)
    # A recycle the policy wants at its last judgement that waits for a free recycle slot
    # (max_concurrent_recycles); None once it starts or is no longer wanted.
    held_back: Reason | None = None
    # Its private memory at the latest reading that had one, and how much of that reading
    # was not private (shared libraries and files, charged to the container once): what a
    # replacement adds to the container is a warm worker less that (budget.replacement_size).
    private: int | None = None
    shared: int | None = None
    # The model's last ready worker, serving on for a planned recycle while its replacement
    # waits for room in the container (Recycler.make_room, at every tick).
    waits_for_room: bool = False
    pad_dims: tuple[PadDim, ...] = ()  # the padding it was started with (its spec's)
    generation: int = 0  # its model's settings generation when it was started
    code: str | None = None  # its model's code fingerprint then (config/fingerprint.py)

    @property
    def leaving(self) -> bool:
        """On its way out. A READY worker that is leaving serves on until its replacement
        is ready (surge); no other leaving worker is sent anything."""
        return self.reason is not None

    def facts(self, recycle_turns: int = 1, shapes: int = 0) -> WorkerFacts:
        """What the policy needs to know about this worker besides its samples (``shapes``:
        its model's ModelConfig.input_shapes)."""
        return WorkerFacts(self.started_at, self.jobs, self.jitter, self.trend_streak,
                           self.ready_at, self.assessment.baseline, recycle_turns,
                           self.assessment.warmup_explained, shapes)

    @property
    def killed(self) -> bool:
        return self.kill_reason is not None

    @property
    def role(self) -> Role:
        """A worker stops being its slot's current one when its way out begins, and never
        becomes it again (``reason`` is set once)."""
        return Role.OUTGOING if self.leaving else Role.CURRENT


@dataclass
class ModelState:
    """What the pool knows about one model beyond its workers."""

    name: str
    config: ModelConfig
    inputs: list[TensorSpec] | None = None
    outputs: list[TensorSpec] | None = None
    # The padding of the workers whose input list admission holds: set with ``inputs`` when
    # a worker turns ready, so a reload's padding reaches admission with its first worker
    # (one that never loads leaves admission as it was, and the old workers serve on).
    serving_dims: tuple[PadDim, ...] | None = None
    failures: int = 0  # consecutive workers that could not serve (boot, or over the limit)
    # The version directory its last ready worker loaded (a TF Serving layout), else None.
    version: int | None = None
    backoff_until: float = 0.0
    last_error: str | None = None
    last_error_of: str | None = None  # the worker it is about: never told as another's
    # Bumped by every reload that replaces its workers' settings: a worker of an earlier
    # generation that fails says nothing of the settings now in force (reload --wait).
    generation: int = 0
    # Fingerprints of its code (config/fingerprint.py): the one new workers are started
    # from (as of the start or the last reload), and the one last found on disk.
    code: str | None = None
    code_on_disk: str | None = None
    recycles: dict[str, int] = field(default_factory=dict)
    # (reason, cause) -> count: bounded, both are closed sets
    recycle_causes: dict[tuple[str, str], int] = field(default_factory=dict)
    last_recycle: dict[str, Any] | None = None
    churn: int = 0  # memory recycles in a row of workers younger than policy.min_lifetime
    next_alarm: float = 0.0  # policy_too_tight is repeated no more often than this
    next_seq: int = 1
    removed: bool = False  # dropped by a reload: finish its queue, drain, spawn none
    told_unavailable: bool = False  # model_unavailable logged: model_available comes next
    exits: dict[ExitCause, int] = field(default_factory=dict)  # bounded: a closed set
    last_unexpected_exit: dict[str, Any] | None = None
    # What `tfsupervisor tune` reads (supervisor/core/traffic.py), in fixed room: the jobs'
    # lengths, and the last workers that served and are gone.
    traffic: Traffic = field(default_factory=Traffic)
    past: deque[WorkerRecord] = field(default_factory=lambda: deque(maxlen=PAST_WORKERS))

    @property
    def unavailable(self) -> bool:
        return self.failures > 0 and self.last_error is not None


class Pool:
    def __init__(self, config: Config, outbox: list[Action],
                 rng: random.Random | None = None) -> None:
        self.config = config
        self.outbox = outbox
        self.rng = rng or random.Random()
        self.workers: dict[str, WorkerHandle] = {}
        self.models: dict[str, ModelState] = {n: ModelState(n, m)
                                              for n, m in config.models.items()}
        self.spawning = True  # false during shutdown

    # --- queries -------------------------------------------------------------------------

    def of_model(self, model: str) -> Iterator[WorkerHandle]:
        return (w for w in self.workers.values() if w.model == model)

    def ready(self, model: str) -> list[WorkerHandle]:
        """Workers that may be given jobs (a surge-replaced worker serves until its
        replacement is ready)."""
        return [w for w in self.of_model(model) if w.state is State.READY]

    def available(self, model: str) -> bool:
        """Whether the model serves now: a ready worker of it. Not while its only workers
        are still starting (`status` said "available" then); a model whose new workers fail
        to start is still available while a ready worker of it serves on."""
        return bool(self.ready(model))

    def serving_slots(self, model: str) -> int:
        """Workers that count towards the configured number: starting or ready, not leaving."""
        return len(self.current(model))

    # --- spawning ------------------------------------------------------------------------

    def current(self, model: str) -> list[WorkerHandle]:
        """Workers that hold their slot: starting or ready, not leaving."""
        return [w for w in self.of_model(model) if w.state in (State.STARTING, State.READY)
                and not w.leaving]

    def free_slot(self, model: str) -> int:
        """The lowest slot no current worker holds: a replacement takes the slot of the
        worker it replaces (the only one freed), a new worker the lowest gap. Slots thus stay
        within 0..workers-1, so metric series do not churn with recycles."""
        taken = {w.slot for w in self.current(model)}
        return next(slot for slot in itertools.count() if slot not in taken)

    def settle_slots(self, model: str) -> None:
        """After a scale-down: a current worker beyond the configured count moves to a free
        slot below it (victims are chosen by age, not slot), so slots stay 0..workers-1."""
        workers = self.models[model].config.workers
        for worker in sorted((w for w in self.current(model) if w.slot >= workers),
                             key=lambda w: w.slot):
            slot = self.free_slot(model)
            if slot < worker.slot:
                worker.slot = slot

    def spawn(self, model: str, now: float) -> WorkerHandle:
        state = self.models[model]
        worker_id = f"{model}-{state.next_seq}"
        state.next_seq += 1
        sup = self.config.supervisor
        handle = WorkerHandle(worker_id, model, self.free_slot(model), started_at=now,
                              jitter=self.rng.uniform(0.0, state.config.policy.jitter),
                              heartbeat_timeout=sup.heartbeat_timeout, last_heartbeat=now,
                              history=History(max(2 * state.config.policy.trend_window, 64)),
                              pad_dims=state.config.pad_dims, generation=state.generation,
                              code=state.code)
        self.workers[worker_id] = handle
        self.outbox.append(Spawn(worker_id, model))
        return handle

    def replenish(self, now: float, room: Callable[[str], bool] | None = None) -> None:
        """Spawn missing workers, respecting back-off; a failing model is probed with one
        worker at a time. A replacement (a worker of the model is on its way out and still
        holds its memory) is spawned only when ``room`` says one more worker of the model
        fits the container's memory; otherwise it waits for the outgoing one to be gone."""
        for state in self.models.values():
            if not self.spawning or state.removed or now < state.backoff_until:
                continue
            missing = state.config.workers - self.serving_slots(state.name)
            starting = any(w.state is State.STARTING for w in self.of_model(state.name))
            if state.failures and starting:
                continue
            for _ in range(max(0, missing) if not state.failures else min(1, missing)):
                if room is not None and self.replacing(state.name) and not room(state.name):
                    break
                self.spawn(state.name, now)

    def replacing(self, model: str) -> bool:
        """A worker of the model is on its way out and not yet gone: a spawn now would be
        its replacement, beside it."""
        return any(w.leaving for w in self.of_model(model))

    def of_current_settings(self, worker: WorkerHandle) -> bool:
        return worker.generation == self.models[worker.model].generation

    def failed_to_serve(self, worker: WorkerHandle, now: float, error: str) -> float:
        """A worker that could not serve (boot failure, or over its limit from the start):
        the model backs off spawning and is reported unavailable with ``error``. Not if the
        worker was started with settings a reload has since replaced: its failure is theirs,
        and counting it would report the new settings as failing (0, no back-off)."""
        state = self.models[worker.model]
        if not self.of_current_settings(worker):
            return 0.0
        state.failures += 1
        delay = min(MAX_BACKOFF, 2.0 ** (state.failures - 1))
        state.backoff_until = now + delay
        state.last_error, state.last_error_of = error, worker.id
        return delay

    def mark_ready(self, worker: WorkerHandle, header: dict[str, Any], now: float) -> None:
        """READY from a starting worker (the core ignores it in any other state)."""
        worker.state = State.READY  # STARTING -> READY
        worker.ready_at = worker.last_heartbeat = now
        warmup = header.get("warmup_seconds")
        worker.warmup_seconds = float(warmup) if isinstance(warmup, int | float) and \
            not isinstance(warmup, bool) and math.isfinite(warmup) else None

    def heartbeat(self, worker: WorkerHandle, header: dict[str, Any], now: float) -> None:
        worker.last_heartbeat = now
        tf_memory = header.get("tf_memory")
        worker.tf_memory = tf_memory if isinstance(tf_memory, dict) and all(
            isinstance(k, str) and isinstance(v, int) for k, v in tf_memory.items()) else None
        probes = Probes.from_wire(header.get("probes"))
        if probes is not None:
            worker.probes = probes
            if worker.ready_probes is None and worker.state is State.READY:
                worker.ready_probes = probes

    def add_model(self, name: str, config: ModelConfig) -> None:
        self.models[name] = ModelState(name, config)

    def count_recycle(self, worker: WorkerHandle, reason: Reason, now: float,
                      diagnosis: Diagnosis | None = None) -> None:
        """A recycle begins: counted by reason, and by reason and cause (the diagnosis of a
        memory recycle; NO_CAUSE for the others)."""
        state = self.models[worker.model]
        state.recycles[reason.value] = state.recycles.get(reason.value, 0) + 1
        cause = diagnosis.cause.value if diagnosis else \
            (Cause.UNKNOWN.value if reason.memory else NO_CAUSE)
        key = (reason.value, cause)
        state.recycle_causes[key] = state.recycle_causes.get(key, 0) + 1
        state.last_recycle = {"reason": reason.value, "worker": worker.id, "at": now,
                              "cause": cause,
                              "summary": diagnosis.summary if diagnosis else None,
                              "remedy": diagnosis.remedy if diagnosis else None}

    def count_exit(self, worker: WorkerHandle, cause: ExitCause, code: int, now: float) -> None:
        state = self.models[worker.model]
        state.exits[cause] = state.exits.get(cause, 0) + 1
        if worker.ready_at is not None:  # it served: its memory says what serving costs
            state.past.append(WorkerRecord.of(
                worker.id, worker.started_at, worker.ready_at, now,
                str(worker.reason) if worker.reason else cause.value, worker.jobs,
                worker.history))
        if not cause.expected:
            served = worker.ready_at is not None
            state.last_unexpected_exit = {"cause": cause.value, "worker": worker.id,
                                          "pid": worker.pid, "slot": worker.slot,
                                          "exit": describe_exit(code, served), "at": now}
