"""A worker's way out, in one place: replace, drain, stop, kill, exit, and its jobs.

    STARTING ──ready──▶ READY ──drain──▶ DRAINING ──(nothing held)──▶ STOPPING ──exit──▶ GONE
        │                 │ (replaced: serves on until its replacement is ready)  ▲
        └──stop/kill──────┴──────────────kill / leaving flag──────────────────────┘

Only READY workers are sent jobs. A killed worker's jobs are taken back at once (its late
answers are dropped), every try counting against ``max_attempts``; a worker that exits
holding jobs gives them back the same way. Nothing here touches a process: ``Stop`` and
``Kill`` actions go to the daemon.
"""

from __future__ import annotations

from typing import Any

from supervisor.core.actions import Action, Kill, Stop
from supervisor.core.budget import Budget
from supervisor.core.pool import Pool, State, WorkerHandle
from supervisor.core.reasons import ExitCause, Reason, exit_cause
from supervisor.core.router import Router
from supervisor.shared import logs
from supervisor.shared.exitcodes import WorkerExit, describe_exit
from supervisor.shared.protocol import UNAVAILABLE

log = logs.get(__name__)

# After STOP and SIGTERM, how long a stopping worker gets before SIGKILL.
STOP_GRACE = 5.0
# What a worker's death by a SIGKILL the supervisor did not send is logged with.
EXTERNAL_KILL_NOTE = ("a SIGKILL the supervisor did not send, with no kernel OOM kill counted "
                      "in its memory cgroup: another process, or the OOM killer of a cgroup "
                      "it cannot read")
OOM_KILL_NOTE = "killed by the kernel's OOM killer: the container reached its memory limit"


class Lifecycle:
    def __init__(self, pool: Pool, router: Router, outbox: list[Action],
                 budget: Budget | None = None) -> None:
        self.pool, self.router, self.outbox = pool, router, outbox
        self.budget = budget or Budget()  # the container's memory: its OOM kills

    # --- the way out ---------------------------------------------------------------------

    def replace(self, worker: WorkerHandle, reason: Reason, now: float) -> None:
        """Surge: the worker serves on; its slot is free, so a replacement is spawned, and
        ``progress`` drains it once the replacement is ready."""
        if worker.reason is None:
            worker.reason = reason

    def drain(self, worker: WorkerHandle, reason: Reason, now: float) -> None:
        """Out of rotation now; stopped once it holds nothing."""
        if worker.state not in (State.STARTING, State.READY):
            return
        if worker.state is State.STARTING:  # STARTING -> STOPPING: nothing to drain
            self.stop(worker, reason, now)
            return
        _leave(worker, reason)
        worker.state = State.DRAINING  # READY -> DRAINING
        worker.out_at = now
        worker.drain_deadline = now + self.pool.models[worker.model].config.policy.drain_timeout

    def stop(self, worker: WorkerHandle, reason: Reason, now: float) -> None:
        """Ask a worker to exit: STOP message and SIGTERM, SIGKILL after STOP_GRACE."""
        if worker.state in (State.STOPPING, State.GONE):
            return
        self._lose_jobs(worker, f"worker {worker.id} was stopped ({reason})", reason)
        _leave(worker, reason)
        if worker.out_at is None and worker.ready_at is not None:
            worker.out_at = now
        worker.state = State.STOPPING  # STARTING | READY | DRAINING -> STOPPING
        worker.stop_deadline = now + STOP_GRACE
        self.outbox.append(Stop(worker.id))

    def kill(self, worker: WorkerHandle, reason: Reason, now: float) -> None:
        """SIGKILL; its jobs are taken back at once (a dying worker's answers are dropped)."""
        if worker.state is State.GONE or worker.killed:
            return
        worker.kill_reason = reason
        _leave(worker, reason)
        worker.state = State.STOPPING  # any live state -> STOPPING (SIGKILL sent)
        worker.stop_deadline = None
        self._lose_jobs(worker, f"worker {worker.id} was killed ({reason})", reason)
        self.outbox.append(Kill(worker.id, reason))

    def leaving_by_itself(self, worker: WorkerHandle, now: float) -> None:
        """The worker said its last answer was its last (its handler asked to be replaced):
        nothing more is sent; it is killed if it does not exit within STOP_GRACE."""
        if worker.state in (State.STOPPING, State.GONE):
            return
        if worker.reason is None:
            worker.reason = Reason.REQUESTED
            self.pool.count_recycle(worker, Reason.REQUESTED, now)
            log.info("worker_recycling", model=worker.model, worker=worker.id, pid=worker.pid,
                     reason=str(Reason.REQUESTED), detail="the handler asked to be replaced",
                     jobs=worker.jobs, age_seconds=round(now - worker.started_at, 1))
        worker.state = State.STOPPING  # READY | DRAINING -> STOPPING (leaving flag)
        worker.stop_deadline = now + STOP_GRACE

    def exited(self, worker: WorkerHandle, code: int, now: float) -> None:
        """The process is gone (reaped, or never started): it leaves the registry and
        whatever it still held goes back to the queue."""
        if self.pool.workers.get(worker.id) is not worker:
            return
        del self.pool.workers[worker.id]
        told = worker.state is State.STOPPING  # told to exit, killed, or said it would
        if told and worker.out_at is not None and not worker.killed:
            # What a recycle takes to free memory, once a worker leaves rotation (the
            # container's pressure line is drawn that far ahead: budget.Budget.lead).
            self.budget.way_out(now - worker.out_at)
        worker.state = State.GONE  # any state -> GONE (reaped, or never started)
        # A worker that never came up in time failed to boot, even though we killed it.
        asked = worker.reason is not None and worker.reason is not Reason.START_TIMEOUT
        if not asked and code == WorkerExit.RECYCLE and worker.ready_at is not None:
            worker.reason = Reason.REQUESTED  # an older worker without the leaving flag
            self.pool.count_recycle(worker, Reason.REQUESTED, now)
        why = f"worker {worker.id} (pid {worker.pid}) exited " \
              f"({describe_exit(code, worker.ready_at is not None)}) " \
              "with jobs in hand"
        self._lose_jobs(worker, why, worker.reason if asked and worker.reason else Reason.DIED)
        cause = exit_cause(worker.reason, worker.kill_reason, told, worker.ready_at is not None,
                           code)
        if cause is ExitCause.KILLED_EXTERNALLY and self.budget.oom.claim():
            cause = ExitCause.OOM_KILLED  # the cgroup's OOM-kill counter rose meanwhile
        self.pool.count_exit(worker, cause, code, now)
        self._log_exit(worker, code, now, asked, cause)

    def _start_timed_out(self, worker: WorkerHandle, limit: float, now: float) -> None:
        """STARTING -> STOPPING (killed): a boot failure, counted now, not when the kill is
        reaped: the model backs off at once, so no replacement is spawned before the back-off
        the event announces (its slot is free as soon as this worker is killed)."""
        state = self.pool.models[worker.model]
        error = _start_timeout_error(worker, limit)
        was_available = not state.unavailable
        delay = self.pool.failed_to_serve(worker, now, error)
        log.error("worker_start_timeout", model=worker.model, worker=worker.id, pid=worker.pid,
                  seconds=round(now - worker.started_at, 1), start_timeout=limit,
                  retry_in_seconds=delay)
        if was_available and not self.pool.ready(worker.model):
            log.error("model_unavailable", model=worker.model, error=error)
            state.told_unavailable = True
        self.kill(worker, Reason.START_TIMEOUT, now)

    def _lose_jobs(self, worker: WorkerHandle, why: str, cause: Reason) -> None:
        if not self.router.held_by(worker.id):
            return
        policy = self.pool.models[worker.model].config.policy
        requeued, failed = self.router.requeue(worker.id, policy.max_attempts, why,
                                               cause.suspects_jobs,
                                               cause.loss_note(policy.max_attempts))
        log.warning("jobs_requeued", model=worker.model, worker=worker.id, pid=worker.pid,
                    why=why, requeued=requeued, failed=failed,
                    max_attempts=policy.max_attempts)

    def _log_exit(self, worker: WorkerHandle, code: int, now: float, asked: bool,
                  cause: ExitCause) -> None:
        state = self.pool.models[worker.model]
        fields: dict[str, Any] = {"model": worker.model, "worker": worker.id, "pid": worker.pid,
                                  "slot": worker.slot,
                                  "exit": describe_exit(code, worker.ready_at is not None),
                                  "cause": cause.value, "jobs": worker.jobs,
                                  "age_seconds": round(now - worker.started_at, 1)}
        if cause is ExitCause.KILLED_EXTERNALLY:
            fields["note"] = EXTERNAL_KILL_NOTE
        elif cause is ExitCause.OOM_KILLED:
            fields["note"] = OOM_KILL_NOTE
            fields.update(self.budget.at_last_poll())
        if worker.ready_at is None and not asked:
            was_available = not state.unavailable
            told = code in (WorkerExit.LOAD_ERROR, WorkerExit.SPAWN_FAILED)
            if worker.reason is Reason.START_TIMEOUT:
                # Counted when it was killed (_start_timed_out): the kill, not SIGKILL's
                # usual meaning (the OOM killer), is why it exited.
                error = _start_timeout_error(worker, self.pool.config.supervisor.start_timeout)
                delay = max(0.0, state.backoff_until - now)
            else:
                # What this worker said (a load error's message), never what an earlier
                # one said: a worker that exits 3 without a word is named itself.
                error = state.last_error if told and state.last_error and \
                    state.last_error_of == worker.id \
                    else f"worker {worker.id} exited before ready: {describe_exit(code)}"
                delay = self.pool.failed_to_serve(worker, now, error)
            log.error("worker_boot_failed", **fields, retry_in_seconds=delay, error=error)
            if was_available and not self.pool.ready(worker.model):
                log.error("model_unavailable", model=worker.model, error=error)
                state.told_unavailable = True
        elif not asked:  # even with status 0: nobody asked it to go
            log.warning("worker_died", **fields)
        elif cause in (ExitCause.KILLED_EXTERNALLY, ExitCause.OOM_KILLED):
            # On its way out (drained under memory pressure, say), but killed before it got
            # there by someone else: that death is the news, not the recycle.
            log.warning("worker_died", **fields, reason=str(worker.reason))
        else:
            log.info("worker_exited", **fields, reason=str(worker.reason))

    # --- every tick ----------------------------------------------------------------------

    def progress(self, now: float) -> None:
        """Drains that finished or ran out of time, stops that ran out of time, workers
        that never became ready or went silent, surge replacements that are ready, removed
        models."""
        sup = self.pool.config.supervisor
        for worker in list(self.pool.workers.values()):
            if worker.state is State.STARTING and now - worker.started_at > sup.start_timeout:
                self._start_timed_out(worker, sup.start_timeout, now)
            elif worker.state in (State.READY, State.DRAINING) and \
                    now - worker.last_heartbeat > worker.heartbeat_timeout:
                log.error("worker_hung", model=worker.model, worker=worker.id, pid=worker.pid,
                          silent_seconds=round(now - worker.last_heartbeat, 1))
                self.kill(worker, Reason.HUNG, now)
            elif worker.state is State.DRAINING:
                self._drain_progress(worker, now)
            elif worker.state is State.STOPPING and not worker.killed and \
                    worker.stop_deadline is not None and now > worker.stop_deadline:
                self.kill(worker, Reason.STOP_TIMEOUT, now)
        for state in list(self.pool.models.values()):
            if state.removed:
                self._retire_removed(state.name, now)
            else:
                self._scale_down(state.name, now)
                self._advance(state.name, now)

    def _scale_down(self, model: str, now: float) -> None:
        """Fewer workers configured (a reload): starting ones stop first, then the oldest
        ready ones are replaced by nobody and drained by ``_advance``; the workers that stay
        keep (or move to) slots below the new count."""
        state = self.pool.models[model]
        live = self.pool.current(model)
        excess = len(live) - state.config.workers
        if excess > 0:
            live.sort(key=lambda w: (w.state is State.READY, w.started_at))
            for worker in live[:excess]:
                if worker.state is State.STARTING:
                    self.stop(worker, Reason.SCALE_DOWN, now)
                else:
                    self.replace(worker, Reason.SCALE_DOWN, now)
        self.pool.settle_slots(model)

    def _drain_progress(self, worker: WorkerHandle, now: float) -> None:
        held = self.router.held_by(worker.id)
        reason = worker.reason or Reason.DRAIN_TIMEOUT
        if not held:
            self.stop(worker, reason, now)
        elif worker.drain_deadline is not None and now > worker.drain_deadline:
            policy = self.pool.models[worker.model].config.policy
            log.warning("drain_timeout", model=worker.model, worker=worker.id, pid=worker.pid,
                        held=len(held), drain_timeout=policy.drain_timeout)
            self.kill(worker, Reason.DRAIN_TIMEOUT, now)

    def _advance(self, model: str, now: float) -> None:
        """Surge: drain a replaced worker once a fresh one has taken its place. Not during a
        shutdown: then every ready worker, leaving or not, serves the queue until the budget
        ends (a replacement may still be loading), and the shutdown stops them all."""
        if not self.pool.spawning:
            return
        ready = self.pool.ready(model)
        replaced = [w for w in ready if w.leaving]
        if not replaced:
            return
        surplus = max(0, len(ready) - self.pool.models[model].config.workers)
        for worker in replaced[:surplus]:  # a fresh worker has taken each one's place
            self.drain(worker, worker.reason or Reason.MANUAL, now)

    def _retire_removed(self, model: str, now: float) -> None:
        """A model dropped by a reload: its ready workers finish its queue; with none left to
        do so, the queue is answered; then its workers drain, and the model is forgotten."""
        if self.router.queued(model):
            if self.pool.ready(model):
                return
            self.router.fail_queued(model, UNAVAILABLE, f"model '{model}' was removed by a "
                                    "reload before this job could run")
        workers = list(self.pool.of_model(model))
        for worker in workers:
            self.drain(worker, Reason.REMOVED, now)
        if not workers and not self.router.pending_jobs.get(model):
            del self.pool.models[model]
            self.router.forget(model)
            log.info("model_removed", model=model)


def _leave(worker: WorkerHandle, reason: Reason) -> None:
    """The reason of a worker's way out: the first one it was given. One exception: a worker
    still serving until its replacement is ready that a shutdown stops first was never
    replaced, so it leaves stopped (its exit cause), not recycled."""
    if reason is Reason.SHUTDOWN and worker.state is State.READY:
        worker.reason = reason
    else:
        worker.reason = worker.reason or reason


def _start_timeout_error(worker: WorkerHandle, limit: float) -> str:
    return f"worker {worker.id} was not ready within start_timeout ({limit:g}s): killed"
