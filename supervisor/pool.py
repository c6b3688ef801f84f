"""The worker pool: one registry of worker handles, one explicit state each, and the
process lifecycle (spawn, ready, drain, stop, reap, back off).

Idle and busy are not kept here: they follow from the router's in-flight table.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from supervisor import logs
from supervisor.config import Config, ModelConfig
from supervisor.exitcodes import WorkerExit, describe_exit
from supervisor.history import History
from supervisor.policy import Assessment
from supervisor.protocol import STOP, Message, TensorSpec, parse_specs

log = logs.get("pool")

# After SIGTERM, how long a stopping worker gets before SIGKILL.
STOP_GRACE = 5.0
# Back-off after a worker fails before becoming ready: 1 s, 2 s, 4 s ... up to this.
MAX_BACKOFF = 60.0


class State(Enum):
    STARTING = "starting"  # process spawned, loading and warming up
    READY = "ready"  # takes jobs
    DRAINING = "draining"  # no new jobs; finishing the ones it holds
    STOPPING = "stopping"  # told to stop; SIGKILL at stop_deadline
    GONE = "gone"  # exited and reaped


@dataclass
class WorkerHandle:
    id: str
    model: str
    process: subprocess.Popen[bytes]
    started_at: float
    jitter: float  # this worker's fraction off max_jobs / max_age, drawn once
    state: State = State.STARTING
    ready_at: float | None = None
    last_heartbeat: float = 0.0
    jobs: int = 0  # jobs answered by this worker
    warmup_seconds: float | None = None
    tf_memory: dict[str, int] | None = None
    recycle_reason: str | None = None  # set when the worker is on its way out
    stop_deadline: float | None = None
    drain_deadline: float | None = None
    killed_by_us: bool = False
    history: History = field(default_factory=History)
    assessment: Assessment = field(default_factory=Assessment)  # the policy's latest numbers
    trend_streak: int = 0  # consecutive evaluations over a trend limit

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def leaving(self) -> bool:
        """On its way out: draining, stopping, or ready but already being replaced."""
        return self.recycle_reason is not None or self.state in (State.DRAINING, State.STOPPING,
                                                                  State.GONE)


@dataclass
class ModelState:
    """What the pool knows about one model beyond its workers."""

    name: str
    config: ModelConfig
    inputs: list[TensorSpec] | None = None
    outputs: list[TensorSpec] | None = None
    failures: int = 0  # consecutive workers that died before becoming ready
    backoff_until: float = 0.0
    last_error: str | None = None
    recycles: dict[str, int] = field(default_factory=dict)
    last_recycle: dict[str, Any] | None = None
    churn: int = 0  # memory recycles in a row of workers younger than policy.min_lifetime
    recycle_backoff_until: float = 0.0  # memory recycles wait until then (policy too tight)
    next_seq: int = 1
    removed: bool = False  # dropped by a reload: drain its workers, spawn none

    @property
    def unavailable(self) -> bool:
        return self.failures > 0 and self.last_error is not None


SendFn = Callable[[str, Message], None]


class Pool:
    def __init__(self, config: Config, send: SendFn, rng: random.Random | None = None) -> None:
        self.config = config
        self.send = send
        self.rng = rng or random.Random()
        self.workers: dict[str, WorkerHandle] = {}
        self.models: dict[str, ModelState] = {n: ModelState(n, m)
                                              for n, m in config.models.items()}
        self.spawning = True  # false during shutdown
        self.log_format = "auto"  # workers log the way the supervisor does

    # --- queries -------------------------------------------------------------------------

    def of_model(self, model: str) -> Iterator[WorkerHandle]:
        return (w for w in self.workers.values() if w.model == model)

    def ready(self, model: str) -> list[WorkerHandle]:
        """Workers that may be given jobs (a surge-replaced worker serves until its
        replacement is ready)."""
        return [w for w in self.of_model(model) if w.state is State.READY]

    def serving_slots(self, model: str) -> int:
        """Workers that count towards the configured number: starting or ready, not leaving."""
        return sum(1 for w in self.of_model(model)
                   if w.state in (State.STARTING, State.READY) and not w.leaving)

    # --- lifecycle -----------------------------------------------------------------------

    def spawn(self, model: str, now: float) -> WorkerHandle:
        state = self.models[model]
        worker_id = f"{model}-{state.next_seq}"
        state.next_seq += 1
        process = subprocess.Popen(
            [sys.executable, "-m", "worker", "--id", worker_id, "--model", model],
            env=self._worker_env(state.config, worker_id, model),
            stdin=subprocess.DEVNULL,
            # Own process group: a Ctrl-C on the terminal reaches the supervisor only,
            # which then drains its workers instead of having them die mid-job.
            process_group=0,
        )
        jitter = self.rng.uniform(0.0, state.config.policy.jitter)
        handle = WorkerHandle(worker_id, model, process, started_at=now, jitter=jitter,
                              last_heartbeat=now,
                              history=History(max(2 * state.config.policy.trend_window, 64)))
        self.workers[worker_id] = handle
        log.info("worker_started", model=model, worker=worker_id, pid=process.pid)
        return handle

    def _worker_env(self, model: ModelConfig, worker_id: str, name: str) -> dict[str, str]:
        kind, location = model.source
        spec = {"source": kind, "location": location, "signature": model.signature,
                "options": model.options, "tf": _tf_dict(model), "backend": self.config.backend,
                "heartbeat": self.config.supervisor.heartbeat_interval,
                "log_level": self.config.supervisor.log_level, "log_format": self.log_format}
        env = dict(os.environ)
        env.update(model.env)
        env["TFSUPERVISOR_WORKER"] = json.dumps(spec)
        if self.config.path is not None:  # handler modules beside config.yaml import as-is
            config_dir = str(self.config.path.parent.resolve())
            env["PYTHONPATH"] = os.pathsep.join(p for p in (config_dir, env.get("PYTHONPATH"))
                                                if p)
        return env

    def mark_ready(self, worker_id: str, header: dict[str, Any], now: float) -> WorkerHandle:
        worker = self.workers[worker_id]
        state = self.models[worker.model]
        worker.state = State.READY
        worker.ready_at = worker.last_heartbeat = now
        worker.warmup_seconds = header.get("warmup_seconds")
        if header.get("inputs") is not None:
            state.inputs = parse_specs(header["inputs"], allow_none=True)
        if header.get("outputs") is not None:
            state.outputs = parse_specs(header["outputs"], allow_none=True)
        if state.unavailable:
            log.info("model_available", model=worker.model)
        state.failures, state.last_error, state.backoff_until = 0, None, 0.0
        return worker

    def heartbeat(self, worker_id: str, header: dict[str, Any], now: float) -> None:
        worker = self.workers.get(worker_id)
        if worker is not None:
            worker.last_heartbeat = now
            tf_memory = header.get("tf_memory")
            worker.tf_memory = tf_memory if isinstance(tf_memory, dict) else None

    def load_failed(self, worker_id: str, message: str) -> None:
        """A worker reported why its model cannot load (it exits right after)."""
        worker = self.workers.get(worker_id)
        if worker is not None:
            self.models[worker.model].last_error = message

    def begin_drain(self, worker: WorkerHandle, reason: str, now: float) -> None:
        worker.state = State.DRAINING
        worker.recycle_reason = worker.recycle_reason or reason
        worker.drain_deadline = now + self.models[worker.model].config.policy.drain_timeout

    def stop(self, worker: WorkerHandle, now: float, reason: str) -> None:
        """Ask a worker with no jobs left to exit: STOP message, SIGTERM, SIGKILL later."""
        if worker.state in (State.STOPPING, State.GONE):
            return
        worker.recycle_reason = worker.recycle_reason or reason
        worker.state = State.STOPPING
        worker.stop_deadline = now + STOP_GRACE
        self.send(worker.id, Message(STOP))
        _signal(worker, signal.SIGTERM)

    def kill(self, worker: WorkerHandle, reason: str) -> None:
        if worker.state is State.GONE:
            return
        worker.killed_by_us = True
        worker.recycle_reason = worker.recycle_reason or reason
        _signal(worker, signal.SIGKILL)

    def reap(self, now: float) -> list[tuple[WorkerHandle, int]]:
        """Collect exited workers; they leave the registry. Returns (handle, returncode)."""
        exited = []
        for worker in list(self.workers.values()):
            code = worker.process.poll()
            if code is None:
                continue
            worker.state = State.GONE
            del self.workers[worker.id]
            self._note_exit(worker, code, now)
            exited.append((worker, code))
        return exited

    def _note_exit(self, worker: WorkerHandle, code: int, now: float) -> None:
        state = self.models[worker.model]
        unexplained_kill = code == -signal.SIGKILL and not worker.killed_by_us
        fields: dict[str, Any] = {"model": worker.model, "worker": worker.id, "pid": worker.pid,
                                  "exit": describe_exit(code), "jobs": worker.jobs,
                                  "age_seconds": round(now - worker.started_at, 1)}
        if unexplained_kill:
            fields["note"] = "possible OOM kill"
        if worker.ready_at is None and not worker.killed_by_us:
            state.failures += 1
            delay = min(MAX_BACKOFF, 2.0 ** (state.failures - 1))
            state.backoff_until = now + delay
            if state.last_error is None or code != WorkerExit.LOAD_ERROR:
                state.last_error = f"worker {worker.id} exited before ready: {describe_exit(code)}"
            log.error("worker_boot_failed", **fields, retry_in_seconds=delay,
                      error=state.last_error)
            if state.failures == 1 and not self.ready(worker.model):
                log.error("model_unavailable", model=worker.model, error=state.last_error)
        elif code == WorkerExit.RECYCLE and worker.recycle_reason is None:
            worker.recycle_reason = "requested"  # the handler asked; its jobs were answered
            self.count_recycle(worker, "requested", now)
            log.info("worker_exited", **fields, reason="requested")
        elif worker.recycle_reason is None and code != WorkerExit.OK:
            log.warning("worker_died", **fields)
        else:
            log.info("worker_exited", **fields, reason=worker.recycle_reason)

    def maintain(self, now: float) -> list[WorkerHandle]:
        """Spawn missing workers (respecting back-off), escalate stuck stops, kill workers
        that never became ready or went silent. Returns workers newly spawned."""
        spawned = []
        for state in self.models.values():
            if not self.spawning or state.removed or now < state.backoff_until:
                continue
            missing = state.config.workers - self.serving_slots(state.name)
            starting = any(w.state is State.STARTING for w in self.of_model(state.name))
            if state.failures and starting:
                continue  # probe a failing model with one worker at a time
            for _ in range(max(0, missing) if not state.failures else min(1, missing)):
                spawned.append(self.spawn(state.name, now))
        for state in self.models.values():
            self._scale_down(state, now)
        sup = self.config.supervisor
        for worker in self.workers.values():
            if worker.state is State.STARTING and now - worker.started_at > sup.start_timeout:
                log.error("worker_start_timeout", model=worker.model, worker=worker.id,
                          pid=worker.pid, seconds=round(now - worker.started_at, 1))
                self.kill(worker, "start_timeout")
            elif worker.state in (State.READY, State.DRAINING) and \
                    now - worker.last_heartbeat > sup.heartbeat_timeout:
                log.error("worker_hung", model=worker.model, worker=worker.id, pid=worker.pid,
                          silent_seconds=round(now - worker.last_heartbeat, 1))
                self.kill(worker, "hung")
            elif worker.state is State.STOPPING and worker.stop_deadline is not None and \
                    now > worker.stop_deadline and not worker.killed_by_us:
                self.kill(worker, worker.recycle_reason or "stop_timeout")
        return spawned

    def _scale_down(self, state: ModelState, now: float) -> None:
        """Fewer workers configured (a reload): stop starting ones first, then let the oldest
        ready ones leave (drained by the monitor, never abruptly)."""
        excess = self.serving_slots(state.name) - state.config.workers
        if excess <= 0 or state.removed:
            return
        live = [w for w in self.of_model(state.name)
                if w.state in (State.STARTING, State.READY) and not w.leaving]
        live.sort(key=lambda w: (w.state is State.READY, w.started_at))
        for worker in live[:excess]:
            if worker.state is State.STARTING:
                self.stop(worker, now, "scale_down")
            else:
                worker.recycle_reason = "scale_down"

    def add_model(self, name: str, config: ModelConfig) -> None:
        self.models[name] = ModelState(name, config)

    def count_recycle(self, worker: WorkerHandle, reason: str, now: float) -> None:
        state = self.models[worker.model]
        state.recycles[reason] = state.recycles.get(reason, 0) + 1
        state.last_recycle = {"reason": reason, "worker": worker.id, "at": now}


def _signal(worker: WorkerHandle, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # already gone; reap() will notice
        worker.process.send_signal(signum)


def _tf_dict(model: ModelConfig) -> dict[str, Any]:
    tf = model.tf
    return {"intra_op_threads": tf.intra_op_threads, "inter_op_threads": tf.inter_op_threads,
            "gpu_memory_growth": tf.gpu_memory_growth, "gpu_memory_limit": tf.gpu_memory_limit}
