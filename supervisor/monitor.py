"""Every poll interval: sample each worker's memory, ask the policy, start recycles.

The recycle itself (replacement first, drain, stop) is carried by worker states: a worker
with a ``recycle_reason`` no longer counts towards its model's workers, so the pool spawns
its replacement; once enough fresh workers are ready, ``advance`` moves it to draining; the
daemon stops it when it holds no more jobs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psutil

from supervisor import logs
from supervisor.config import SupervisorSection
from supervisor.gpu import VramReader
from supervisor.history import Sample
from supervisor.policy import Action, Verdict, WorkerFacts, evaluate, pressure_victim
from supervisor.pool import ModelState, Pool, State, WorkerHandle
from supervisor.router import Router
from supervisor.sampling import Descendants, read_memory

log = logs.get("monitor")

# Recycles caused by the worker's own memory: the ones that say a policy may be too tight.
MEMORY_REASONS = frozenset({"max_memory", "growth_per_1k_jobs", "growth_per_hour", "max_vram",
                            "vram_growth_per_1k_jobs", "kill_memory"})
# Most urgent first when several workers of a model want to go and only K may.
URGENCY = ["max_memory", "max_vram", "host_pressure", "growth_per_1k_jobs", "growth_per_hour",
           "vram_growth_per_1k_jobs", "manual", "reload", "max_jobs", "max_age"]
MAX_CHURN_BACKOFF = 3600.0
# Young memory recycles in a row before the policy is called too tight: one can be a fast
# leak caught early; two in a row means recycling is not buying time.
CHURN_LIMIT = 2
# Soft limits already crossed: the worker leaves rotation at once (its replacement starts at
# the same time) rather than serving on, and growing, while a replacement warms up.
OVER_LIMIT = frozenset({"max_memory", "max_vram"})


@dataclass
class Candidate:
    worker: WorkerHandle
    reason: str
    verdict: Verdict


def available_memory() -> int:
    return int(psutil.virtual_memory().available)


class Monitor:
    def __init__(self, pool: Pool, router: Router, settings: SupervisorSection,
                 vram: VramReader | None = None,
                 host_available: Callable[[], int] = available_memory) -> None:
        self.pool, self.router, self.settings = pool, router, settings
        self.vram = vram or VramReader()
        self.host_available = host_available
        self.next_poll = 0.0
        self.requested: dict[str, str] = {}  # worker id -> reason (manual, reload)
        self.descendants = Descendants()

    # --- sampling ------------------------------------------------------------------------

    def on_ready(self, worker: WorkerHandle, now: float) -> None:
        self.sample([worker], now)
        policy = self.pool.models[worker.model].config.policy
        last = worker.history.last()
        if last is not None and policy.max_memory is not None and last.memory >= policy.max_memory:
            state = self.pool.models[worker.model]
            state.churn = max(state.churn + 1, CHURN_LIMIT)  # recycling cannot help at all
            self._too_tight(worker, "max_memory", now,
                            f"a fresh worker already uses {last.memory} bytes after warm-up, "
                            f"over max_memory {policy.max_memory}")

    def sample(self, workers: list[WorkerHandle], now: float) -> None:
        vram = self.vram.read(w.pid for w in workers)
        self.descendants.refresh((w.pid for w in self.pool.workers.values()), now)
        for worker in workers:
            metric = self.pool.models[worker.model].config.policy.memory_metric
            memory = read_memory(worker.pid, metric, self.descendants.of(worker.pid))
            if memory is not None:
                worker.history.add(Sample(now, worker.jobs, memory, vram.get(worker.pid)))

    def tick(self, now: float) -> None:
        self.advance(now)
        if now < self.next_poll:
            return
        self.next_poll = now + self.settings.poll_interval
        live = [w for w in self.pool.workers.values() if w.state is not State.GONE]
        self.sample(live, now)
        self.requested = {k: v for k, v in self.requested.items() if k in self.pool.workers}
        for state in self.pool.models.values():
            self._judge(state, now)
        self._host_pressure(now)

    # --- decisions -----------------------------------------------------------------------

    def _judge(self, state: ModelState, now: float) -> None:
        policy = state.config.policy
        candidates = []
        for worker in self.pool.of_model(state.name):
            if worker.state not in (State.READY, State.DRAINING):
                continue
            facts = WorkerFacts(worker.started_at, worker.jobs, worker.jitter,
                                worker.trend_streak, worker.ready_at)
            verdict = evaluate(list(worker.history), facts, policy, now)
            worker.assessment, worker.trend_streak = verdict.assessment, verdict.trend_streak
            if verdict.action is Action.KILL:  # kill_memory holds for a leaving worker too
                self.kill(worker, verdict, now)
            elif worker.leaving:
                self._over_limit_while_replaced(worker, verdict, now)
            elif verdict.action is Action.RECYCLE:
                candidates.append(Candidate(worker, verdict.reason, verdict))
            elif worker.id in self.requested:
                candidates.append(Candidate(worker, self.requested[worker.id], verdict))
        if now < state.recycle_backoff_until:
            candidates = [c for c in candidates if c.reason not in MEMORY_REASONS]
        candidates.sort(key=lambda c: URGENCY.index(c.reason) if c.reason in URGENCY else 99)
        # A crossed limit acts at once; only the graceful kinds wait for a free slot.
        for candidate in [c for c in candidates if c.reason in OVER_LIMIT]:
            self.start_recycle(candidate.worker, candidate.reason, candidate.verdict, now)
        graceful = [c for c in candidates if c.reason not in OVER_LIMIT]
        for candidate in graceful[:self.free_slots(state)]:
            self.start_recycle(candidate.worker, candidate.reason, candidate.verdict, now)

    def _over_limit_while_replaced(self, worker: WorkerHandle, verdict: Verdict,
                                   now: float) -> None:
        """A worker serving on until its replacement is ready (a trend or lifetime recycle)
        that crosses max_memory or max_vram stops taking jobs now, as it would have had the
        limit been crossed first."""
        if worker.state is not State.READY or verdict.action is not Action.RECYCLE or \
                verdict.reason not in OVER_LIMIT:
            return
        log.info("worker_draining_early", model=worker.model, worker=worker.id, pid=worker.pid,
                 reason=verdict.reason, detail=verdict.detail, recycling_for=worker.recycle_reason)
        self.pool.begin_drain(worker, verdict.reason, now)

    def free_slots(self, state: ModelState) -> int:
        busy = sum(1 for w in self.pool.of_model(state.name)
                   if w.recycle_reason is not None and w.state is not State.GONE)
        return max(0, state.config.policy.max_concurrent_recycles - busy)

    def _host_pressure(self, now: float) -> None:
        floor = self.settings.min_available_memory
        if floor is None or any(w.recycle_reason == "host_pressure"
                                for w in self.pool.workers.values()):
            return  # one at a time
        available = self.host_available()
        if available >= floor:
            return
        eligible = [w for state in self.pool.models.values() for w in self.pool.ready(state.name)
                    if not w.leaving and self.free_slots(state) > 0]
        victim_id = pressure_victim([(w.id, w.assessment) for w in eligible])
        if victim_id is None:
            return
        victim = self.pool.workers[victim_id]
        verdict = Verdict(Action.RECYCLE, "host_pressure",
                          f"host has {available} bytes available, under {floor}",
                          victim.assessment)
        self.start_recycle(victim, "host_pressure", verdict, now)

    # --- acting --------------------------------------------------------------------------

    def start_recycle(self, worker: WorkerHandle, reason: str, verdict: Verdict,
                      now: float) -> None:
        state = self.pool.models[worker.model]
        self.pool.count_recycle(worker, reason, now)
        self.requested.pop(worker.id, None)
        self._note_churn(worker, reason, now)
        policy = state.config.policy
        surge = policy.surge and reason not in OVER_LIMIT
        log.info("worker_recycling", **self._event(worker, reason, verdict, now), surge=surge)
        if surge:
            worker.recycle_reason = reason  # serves on until its replacement is ready
        else:
            self.pool.begin_drain(worker, reason, now)

    def kill(self, worker: WorkerHandle, verdict: Verdict, now: float) -> None:
        if not worker.leaving:  # a leaving worker's recycle was counted when it began
            self.pool.count_recycle(worker, verdict.reason, now)
            self._note_churn(worker, verdict.reason, now)
        log.warning("worker_killed", **self._event(worker, verdict.reason, verdict, now))
        self.pool.kill(worker, verdict.reason)

    def advance(self, now: float) -> None:
        """Surge: drain a leaving worker once a fresh one has taken its place. Removed
        models: once their queue is empty, drain everything, then forget the model."""
        for name, state in list(self.pool.models.items()):
            if state.removed and self._retire_removed(state, now):
                continue
            ready = self.pool.ready(name)
            leaving = [w for w in ready if w.leaving]
            if not leaving:
                continue
            surplus = len(ready) - state.config.workers
            if not self.pool.spawning or state.removed:
                surplus = len(leaving)
            for worker in leaving[:max(0, surplus)]:
                self.pool.begin_drain(worker, worker.recycle_reason or "recycle", now)

    def _retire_removed(self, state: ModelState, now: float) -> bool:
        """True once the removed model is gone altogether."""
        if self.router.queued(state.name):
            return False  # its queued jobs are served first
        workers = list(self.pool.of_model(state.name))
        if not workers:
            del self.pool.models[state.name]
            self.router.queues.pop(state.name, None)
            log.info("model_removed", model=state.name)
            return True
        for worker in workers:
            if worker.state is State.STARTING:
                self.pool.stop(worker, now, "removed")
            elif worker.state is State.READY and not worker.leaving:
                worker.recycle_reason = "removed"
        return False

    def request(self, model: str, worker_id: str | None, reason: str = "manual") -> list[str]:
        """Queue a graceful recycle (manual, or for a reload); returns the worker ids."""
        if model not in self.pool.models or self.pool.models[model].removed:
            raise KeyError(f"no model named '{model}'")
        targets = [w for w in self.pool.of_model(model)
                   if w.state in (State.STARTING, State.READY) and not w.leaving]
        if worker_id is not None:
            targets = [w for w in targets if w.id == worker_id]
            if not targets:
                raise KeyError(f"model '{model}' has no live worker '{worker_id}'")
        self.requested.update((w.id, reason) for w in targets)
        return [w.id for w in targets]

    # --- bookkeeping ---------------------------------------------------------------------

    def _note_churn(self, worker: WorkerHandle, reason: str, now: float) -> None:
        if reason not in MEMORY_REASONS:
            return
        state = self.pool.models[worker.model]
        policy = state.config.policy
        age = now - worker.started_at
        if age >= policy.min_lifetime:
            state.churn = 0
            return
        state.churn += 1
        if state.churn >= CHURN_LIMIT:
            self._too_tight(worker, reason, now, f"{state.churn} workers in a row recycled "
                            f"for memory younger than policy.min_lifetime "
                            f"({policy.min_lifetime:.0f}s); this one after {age:.0f}s")

    def _too_tight(self, worker: WorkerHandle, reason: str, now: float, detail: str) -> None:
        state = self.pool.models[worker.model]
        policy = state.config.policy
        backoff = min(MAX_CHURN_BACKOFF,
                      policy.min_lifetime * 2 ** (state.churn - CHURN_LIMIT))
        state.recycle_backoff_until = now + backoff
        log.error("policy_too_tight", model=worker.model, worker=worker.id, reason=reason,
                  detail=detail, baseline=worker.assessment.baseline or _first(worker),
                  max_memory=policy.max_memory, churn=state.churn,
                  memory_recycles_paused_seconds=round(backoff),
                  hint="raise the limit above the measured baseline, or fix the leak")

    def _event(self, worker: WorkerHandle, reason: str, verdict: Verdict,
               now: float) -> dict[str, Any]:
        return {"model": worker.model, "worker": worker.id, "pid": worker.pid, "reason": reason,
                "detail": verdict.detail, "jobs": worker.jobs,
                "age_seconds": round(now - worker.started_at, 1),
                "in_flight": len(self.router.held_by(worker.id)),
                **verdict.assessment.fields()}


def _first(worker: WorkerHandle) -> int | None:
    first = next(iter(worker.history), None)
    return first.memory if first else None
