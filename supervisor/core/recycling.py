"""After each memory poll: ask the pure policy about every worker and start recycles.

A limit is a limit: a crossed ``max_memory`` or ``max_vram`` takes the worker out of
rotation at once, ``kill_memory`` kills it, whatever else is going on. Recycles that keep
coming for young workers are *alarmed* (``policy_too_tight``), never paused. A fresh worker
already over ``max_memory`` after warm-up is a misconfiguration: it is drained like any
other, and the model backs off spawning and reports itself unavailable with the reason, as a
model that cannot load does.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from supervisor.core.budget import (
    MAX_LINE_FRACTION,
    Budget,
    Pressure,
    Room,
    replacement_size,
    serving_growth,
    still_loading,
)
from supervisor.core.diagnosis import Diagnosis, diagnose
from supervisor.core.lifecycle import Lifecycle
from supervisor.core.policy import Ruling, Verdict, evaluate, pressure_victim
from supervisor.core.pool import ModelState, Pool, State, WorkerHandle
from supervisor.core.reasons import Hold, Reason
from supervisor.core.router import Router
from supervisor.shared import logs

log = logs.get(__name__)

# Young memory recycles in a row before the policy is called too tight: one can be a fast
# leak caught early; two in a row means recycling is not buying time.
CHURN_LIMIT = 2
# The alarm repeats, spaced by min_lifetime doubling up to this, so logs do not flood.
MAX_ALARM_SPACING = 3600.0
# Under a container limit, memory pressure recycles only a worker grown at least this much
# over its baseline (what its recycle frees), and says at most this often that none has.
PRESSURE_MIN_GAIN = 16 * 1024**2
PRESSURE_ALARM_SPACING = 300.0


@dataclass
class Candidate:
    worker: WorkerHandle
    reason: Reason
    verdict: Verdict


def held_back(pool: Pool, worker: WorkerHandle) -> tuple[Reason, Hold] | None:
    """The recycle that waits for this worker, and why; None when none does. A limit never
    waits (it takes the worker out of rotation at once), so a held-back worker is within its
    absolute limits."""
    if worker.state is not State.READY:
        return None
    if worker.leaving:
        state = pool.models.get(worker.model)
        if state is not None and state.failures and worker.reason is not None:
            return worker.reason, Hold.BACKOFF
        if worker.reason is not None and worker.waits_for_room:
            return worker.reason, Hold.NO_ROOM
        return None
    if worker.held_back is not None:
        return worker.held_back, Hold.MAX_CONCURRENT_RECYCLES
    return None


class Recycler:
    def __init__(self, pool: Pool, router: Router, lifecycle: Lifecycle,
                 budget: Budget | None = None) -> None:
        self.pool, self.router, self.lifecycle = pool, router, lifecycle
        self.budget = budget or Budget()
        self.next_pressure_alarm = 0.0  # memory_budget_too_small: no victim frees enough
        self.requested: dict[str, Reason] = {}  # worker id -> reason (manual, reload)

    def judge(self, workers: Iterable[WorkerHandle], now: float) -> None:
        """Verdicts for these (just sampled) workers, then recycles per model."""
        candidates: dict[str, list[Candidate]] = {}
        for worker in workers:
            candidate = self._judge_one(worker, now)
            if candidate is not None:
                candidates.setdefault(worker.model, []).append(candidate)
        self.requested = {k: v for k, v in self.requested.items() if k in self.pool.workers}
        for model, found in candidates.items():
            state = self.pool.models[model]
            found.sort(key=lambda c: c.reason.urgency)
            free = self.free_slots(state)
            for candidate in found[:free]:
                self.start(candidate.worker, candidate.reason, candidate.verdict, now)
            for candidate in found[free:]:  # shown by status and metrics until it starts
                candidate.worker.held_back = candidate.reason

    def _judge_one(self, worker: WorkerHandle, now: float) -> Candidate | None:
        worker.held_back = None  # judged afresh: set again by judge if it still waits
        if worker.state is State.GONE or worker.killed or \
                self.pool.workers.get(worker.id) is not worker:
            return None
        config = self.pool.models[worker.model].config
        policy = config.policy
        facts = worker.facts(-(-config.workers // policy.max_concurrent_recycles),
                             config.input_shapes)
        history = list(worker.history)
        verdict = evaluate(history, facts, policy, now)
        worker.assessment, worker.trend_streak = verdict.assessment, verdict.trend_streak
        worker.diagnosis = diagnose(history, facts, policy, verdict.assessment, verdict.reason,
                                    worker.ready_probes)
        if verdict.assessment.warmup_explained and not facts.warmup_explained:
            self._growth_in_warmup(worker, now)
        reason = verdict.reason
        crossed = reason is not None and (verdict.ruling is Ruling.KILL or reason.over_limit)
        starting = worker.state is State.STARTING
        if crossed and (starting or (worker.fresh and worker.state is State.READY)):
            self._over_limit_from_start(worker, verdict, now)
            return None
        if starting:
            return None
        if verdict.ruling is Ruling.KILL:
            self.kill(worker, verdict, now)  # holds for draining and stopping workers too
            return None
        if worker.state is not State.READY:
            return None
        if worker.fresh:
            self._serves_within_limits(worker)
        if crossed and reason is not None:
            self.start(worker, reason, verdict, now)  # at once, whatever else is under way
            return None
        if worker.leaving:
            return None
        if verdict.ruling is Ruling.RECYCLE and reason is not None:
            return Candidate(worker, reason, verdict)
        if worker.id in self.requested:
            return Candidate(worker, self.requested[worker.id], verdict)
        return None

    def _growth_in_warmup(self, worker: WorkerHandle, now: float) -> None:
        """Once per worker: its warm-up's growth is its own tracing (policy.py, Explained
        warm-up). A finding for whoever reads the logs, not only status: no recycle need
        follow (a plateau is not a leak), and the fix is in the model, not the policy."""
        found = worker.diagnosis
        log.warning("worker_growth_in_warmup", model=worker.model, worker=worker.id,
                    pid=worker.pid, age_seconds=round(now - worker.started_at, 1),
                    memory=worker.assessment.memory, baseline=worker.assessment.baseline,
                    detail="grown since ready with graphs traced: the baseline is the level "
                    "at ready, and the trend is judged from ready",
                    **({"cause": found.cause.value, "summary": found.summary,
                        "remedy": found.remedy, "evidence": found.evidence} if found else {}))

    def _serves_within_limits(self, worker: WorkerHandle) -> None:
        """A fresh worker judged under its limits: the model is known to serve."""
        worker.fresh = False
        state = self.pool.models[worker.model]
        if not self.pool.of_current_settings(worker):
            return  # serving on settings a reload replaced says nothing of the new ones
        if state.told_unavailable:  # not when old workers served on all along
            log.info("model_available", model=worker.model)
            state.told_unavailable = False
        state.failures, state.last_error, state.backoff_until = 0, None, 0.0

    def _over_limit_from_start(self, worker: WorkerHandle, verdict: Verdict,
                               now: float) -> None:
        """Over a memory limit while loading, or right after warm-up before its first job:
        no fresh worker can serve within the limit. The limit holds (killed while loading,
        drained without a job after); the model backs off spawning and reports itself unavailable
        with the reason, as a model that cannot load does."""
        reason = verdict.reason or Reason.MAX_MEMORY
        when = "while loading" if worker.state is State.STARTING else "right after warm-up"
        error = (f"a fresh worker uses {verdict.assessment.memory} bytes {when} "
                 f"({verdict.detail}): no worker can serve within this limit; raise "
                 f"policy.{reason.value} above what a fresh worker uses")
        delay = self.pool.failed_to_serve(worker, now, error)
        log.error("policy_misconfigured", model=worker.model, worker=worker.id, pid=worker.pid,
                  reason=reason.value, memory=verdict.assessment.memory,
                  retry_in_seconds=delay, error=error)
        worker.fresh = False
        if verdict.ruling is Ruling.KILL or worker.state is State.STARTING:
            # A loading worker holds no job and may not heed SIGTERM until it is up:
            # killed, so it stops growing now and never overlaps its back-off replacement.
            self.kill(worker, verdict, now)
        else:
            # Not held as the model's last ready worker: none of its replacements can serve
            # within the limit either (the model reports itself unavailable instead).
            self.start(worker, reason, verdict, now, hold_last=False)

    # --- the container's memory budget (budget.py) ----------------------------------------

    def room(self, model: str) -> Room:
        """Whether one more warm worker of this model fits the container's memory now."""
        policy = self.pool.models[model].config.policy
        size, estimate = replacement_size(self.pool.of_model(model), policy)
        return self.budget.room(size, still_loading(self.pool),
                                self.pool.config.supervisor.min_available_memory, estimate)

    def fits(self, model: str) -> bool:
        return self.room(model).fits

    def _making_room(self, model: str) -> bool:
        """A worker of the model is out of rotation on its way out: its memory is about to
        be freed."""
        return any(w.state in (State.DRAINING, State.STOPPING) for w in self.pool.of_model(model))

    def make_room(self, now: float) -> None:
        """A worker serving on until its replacement is ready whose replacement does not fit
        (the budget shrank, or the room went to another model): it drains and stops first,
        one worker of a model at a time, and the replacement follows it (Pool.replenish)."""
        for worker in self.pool.workers.values():
            worker.waits_for_room = False  # found afresh below
        if not self.pool.spawning:
            return
        for state in self.pool.models.values():
            model = state.name
            # After a failed start the model backs off; once that is over, a replacement
            # that does not fit beside the worker waiting for it still needs the room (a
            # waiting worker never drained would hold the model's recycles for good).
            if state.removed or now < state.backoff_until or \
                    not self.pool.replacing(model) or \
                    self.pool.serving_slots(model) >= state.config.workers or \
                    self._making_room(model):
                continue
            waiting = [w for w in self.pool.ready(model) if w.leaving]
            if not waiting:
                continue
            room = self.room(model)
            if room.fits:
                continue
            # A planned recycle never takes the model's last ready worker before its
            # replacement is ready: it serves on, and the replacement waits for room (memory
            # pressure, the container's hard line, may still drain it: memory_pressure).
            last = [w for w in waiting if (w.reason or Reason.MANUAL).planned and
                    self._last_ready(w)]
            for worker in last:
                worker.waits_for_room = True
            waiting = [w for w in waiting if w not in last]
            if not waiting:
                continue
            worker = min(waiting, key=lambda w: w.started_at)
            reason = worker.reason or Reason.MANUAL
            log.warning("worker_draining_first", model=model, worker=worker.id, pid=worker.pid,
                        reason=str(reason), detail=f"no room for its replacement beside it: "
                        f"{room}", **room.fields())
            self.lifecycle.drain(worker, reason, now)

    def free_slots(self, state: ModelState) -> int:
        """Recycles that may begin now: ``max_concurrent_recycles`` less those under way. A
        recycle is under way from its start until its old worker is gone *and* its
        replacement is ready: each slot that holds a leaving worker, or has no ready worker
        that stays, is one (counted by slot, so a surge replacement and the worker it
        replaces are one recycle, and a replacement still loading after its old worker
        exited still counts)."""
        busy = {w.slot for w in self.pool.of_model(state.name) if w.leaving}
        serving = {w.slot for w in self.pool.current(state.name) if w.state is State.READY}
        busy.update(slot for slot in range(state.config.workers) if slot not in serving)
        return max(0, state.config.policy.max_concurrent_recycles - len(busy))

    def _last_ready(self, worker: WorkerHandle) -> bool:
        """No other worker of its model is ready: taking it out of rotation now would leave
        the model with none serving."""
        return not any(w is not worker for w in self.pool.ready(worker.model))

    def memory_pressure(self, now: float) -> None:
        """Headroom (the host's available memory, or the container's under its limit,
        whichever is tighter) below the floor: memory is freed. On the host alone (the floor
        is ``min_available_memory``), the fastest-growing worker is recycled, replacement
        first, one at a time, as before budgets existed. Under a container limit the line is
        drawn by the rate (``_container_pressure``)."""
        floor = self.budget.pressure_floor(self.pool.config.supervisor.min_available_memory)
        available = self.budget.headroom()
        self.budget.pressure = None
        if floor is None or available is None:
            return
        if self.budget.limit is not None:
            self._container_pressure(available, floor, now)
            return
        if available >= floor:
            return
        detail = f"host has {available} bytes available, under {floor}"
        workers = list(self.pool.workers.values())
        if any(w.reason is Reason.HOST_PRESSURE for w in workers):
            return  # memory is on its way to being freed
        eligible = [w for state in self.pool.models.values() for w in self.pool.ready(state.name)
                    if not w.leaving and state.config.policy.max_concurrent_recycles >
                    sum(1 for x in self.pool.of_model(state.name) if x.leaving)]
        victim_id = pressure_victim([(w.id, w.assessment) for w in eligible])
        if victim_id is None:
            return
        victim = self.pool.workers[victim_id]
        verdict = Verdict(Ruling.RECYCLE, Reason.HOST_PRESSURE, detail, victim.assessment)
        self.start(victim, Reason.HOST_PRESSURE, verdict, now)

    def _container_pressure(self, available: int, buffer: int, now: float) -> None:
        """Under a container limit the kernel kills at the limit, so a recycle must begin
        while the workers' growth can still be absorbed: the line is the kill buffer plus
        what the serving workers will grow by before a recycle frees memory (their growth
        rate times the measured lead, ``budget.Pressure``). Under it, memory is freed until
        the projection clears the line: first the workers already on their way out (those
        draining or stopping are counted at what they free; one serving on until its
        replacement is ready drains now: nothing frees memory sooner; one out of rotation
        counts only within the lead of leaving it, ``_freeing_soon``), then the most grown
        workers, drained first (there is no room beside them), no more than cover the
        shortfall, and more than ``max_concurrent_recycles`` at once only when one cannot
        free enough in time (never a model's last ready worker, then). When the workers
        grow and, with what is on its way out, the headroom will not last until the next
        poll at that rate (as late as polls come), a drain is too slow: the most grown
        worker is killed, before the kernel does it. With nothing growing the kernel has no
        reason to kill soon (over cgroup v2's memory.high it throttles): a drain.
        Named ``container_pressure`` when the container's headroom is the tighter, else
        ``host_pressure``."""
        sup = self.pool.config.supervisor
        workers = list(self.pool.workers.values())
        limit = self.budget.limit
        pressure = Pressure(available, buffer, serving_growth(workers, sup.poll_interval),
                            self.budget.lead(sup.poll_interval),
                            None if limit is None else int(limit * MAX_LINE_FRACTION))
        self.budget.pressure = pressure
        if not pressure.under:
            return
        reason = Reason.CONTAINER_PRESSURE if self._container_binds() else Reason.HOST_PRESSURE
        detail = str(pressure) if reason is Reason.CONTAINER_PRESSURE else \
            f"host has {available} bytes available, under {pressure.line}"
        freeing = sum(_grown(w) for w in workers if _freeing_soon(w, pressure.lead, now))
        next_poll = self.budget.poll_seconds(sup.poll_interval)
        if pressure.rate > 0 and available + freeing < pressure.rate * next_poll:
            self._kill_for_room(workers, reason, detail, pressure, now)
            return
        short = pressure.line - available - freeing
        serving_on = sorted((w for w in workers if w.state is State.READY and w.leaving),
                            key=lambda w: -(w.assessment.memory or 0))
        for worker in serving_on:
            if short <= 0 or not self.pool.spawning:
                return
            log.warning("worker_draining_first", model=worker.model, worker=worker.id,
                        pid=worker.pid, reason=str(worker.reason),
                        detail=f"memory pressure: {detail}", **pressure.fields())
            self.lifecycle.drain(worker, worker.reason or reason, now)
            short -= _grown(worker)
        alarm = short == pressure.line - available  # nothing at all on its way out
        while short > 0:
            second = any(w.leaving for w in self.pool.workers.values())
            victim = self._grown_most(self._pressure_eligible(second), available,
                                      pressure.line, now, alarm)
            if victim is None:
                return
            alarm = False
            verdict = Verdict(Ruling.RECYCLE, reason, detail, victim.assessment)
            self.start(victim, reason, verdict, now)
            short -= _grown(victim)

    def _container_binds(self) -> bool:
        """The container's headroom, not the host's, is the tighter."""
        cgroup, limit = self.budget.cgroup, self.budget.limit
        if cgroup is None or limit is None:
            return False
        host = self.budget.host_available
        return host is None or limit - cgroup.working_set <= host

    def _pressure_eligible(self, second: bool) -> list[WorkerHandle]:
        """Ready workers not yet leaving: within ``max_concurrent_recycles`` of their model,
        or beyond it when they are not their model's last ready worker (the container's line
        is a hard one: a replacement still loading holds nothing back). A ``second`` drain,
        beside a worker already on its way out, never takes a model's last ready worker: a
        model left with none serving is an outage, and the first drain is already freeing
        memory (the kill, ``_kill_for_room``, is there if it is too slow)."""
        eligible: list[WorkerHandle] = []
        for state in self.pool.models.values():
            leaving = sum(1 for x in self.pool.of_model(state.name) if x.leaving)
            ready = [w for w in self.pool.ready(state.name) if not w.leaving]
            within = state.config.policy.max_concurrent_recycles > leaving and not second
            eligible.extend(w for w in ready if within or len(ready) > 1)
        return eligible

    def _kill_for_room(self, workers: list[WorkerHandle], reason: Reason, detail: str,
                       pressure: Pressure, now: float) -> None:
        """The headroom will not last a way out: a kill is the only thing fast enough. One
        at a time (a kill already sent frees its memory within moments): the worker on its
        way out that has grown the most (its jobs were about to end anyway), else the most
        grown serving worker."""
        if any(w.killed for w in workers):
            return
        leaving = [w for w in workers if w.state in (State.DRAINING, State.STOPPING)]
        pool = leaving if any(_grown(w) >= PRESSURE_MIN_GAIN for w in leaving) else \
            [w for w in workers if w.state is State.READY]
        victim = max(pool, key=_grown, default=None)
        if victim is None or _grown(victim) < PRESSURE_MIN_GAIN:
            return
        verdict = Verdict(Ruling.KILL, reason, f"{detail}; the headroom lasts "
                          f"{pressure.seconds_to_limit or 0.0:.2f}s, not until the next poll: "
                          "killed before the kernel does", victim.assessment)
        self.kill(victim, verdict, now)

    def _grown_most(self, eligible: list[WorkerHandle], available: int, floor: int,
                    now: float, alarm: bool = True) -> WorkerHandle | None:
        """Under a container limit, the worker whose recycle frees the most: the most grown
        over its baseline (a fresh worker comes back at its baseline, so recycling one that
        has not grown frees nothing and only costs a model load). None, and a warning at
        most every PRESSURE_ALARM_SPACING, when none has grown by PRESSURE_MIN_GAIN: the
        limit is too small for these workers, which no recycle fixes (``alarm`` False: some
        memory is being freed already, none more is found)."""
        best = max(eligible, key=_grown, default=None)
        if best is not None and _grown(best) >= PRESSURE_MIN_GAIN:
            return best
        if alarm and now >= self.next_pressure_alarm:
            self.next_pressure_alarm = now + PRESSURE_ALARM_SPACING
            log.error("memory_budget_too_small", headroom=available, floor=floor,
                      limit=self.budget.limit,
                      problem="the container's headroom is under the pressure line, and no "
                      f"worker has grown {PRESSURE_MIN_GAIN // 2**20}MiB over its baseline "
                      "for a recycle to free: the limit is too small for these workers",
                      hint="raise the container's memory limit, or run fewer workers "
                      "(docs/deployment.md, the memory budget)")
        return None

    def request(self, model: str, worker_id: str | None, reason: Reason) -> list[str]:
        """Queue a graceful recycle (manual, or for a reload); returns the worker ids."""
        state = self.pool.models.get(model)
        if state is None or state.removed:
            raise KeyError(f"no model named '{model}'")
        targets = [w for w in self.pool.of_model(model)
                   if w.state in (State.STARTING, State.READY) and not w.leaving]
        if worker_id is not None:
            live = ", ".join(w.id for w in targets) or "none"
            targets = [w for w in targets if w.id == worker_id]
            if not targets:
                raise KeyError(f"model '{model}' has no live worker '{str(worker_id)[:64]}' "
                               f"(live: {live})")
        self.requested.update((w.id, reason) for w in targets)
        return [w.id for w in targets]

    # --- acting --------------------------------------------------------------------------

    def start(self, worker: WorkerHandle, reason: Reason, verdict: Verdict, now: float,
              hold_last: bool = True) -> None:
        state = self.pool.models[worker.model]
        first = not worker.leaving
        if first:
            self.pool.count_recycle(worker, reason, now, self._diagnosis(worker, reason))
            self._note_churn(worker, reason, now)
        self.requested.pop(worker.id, None)
        # A planned recycle (a soft limit, a lifetime limit, an operator's) never takes the
        # model's last ready worker before its replacement is ready: over max_memory or
        # not, it serves on meanwhile (only kill_memory and the container's memory may leave
        # a model with none ready). Unless the policy says ``surge: false``: the operator's
        # word that a replacement never runs beside the worker it replaces (GPU memory,
        # which the container's budget does not see).
        last = hold_last and reason.planned and state.config.policy.surge and \
            self._last_ready(worker) and self.pool.spawning
        # The container's pressure drains first: a replacement beside the worker would only
        # add to the memory that is running out.
        pressure = reason is Reason.CONTAINER_PRESSURE
        surge = (state.config.policy.surge and not reason.over_limit and not pressure) or last
        room = self.room(worker.model) if surge or pressure else Room(True)  # pressure: shown
        # No room for a replacement beside it: it drains and stops first, then its
        # replacement starts (the model serves a worker short meanwhile). While another
        # worker of the model is already making room, it serves on and waits its turn
        # (make_room): draining both would leave the model with nobody to serve. The
        # model's last ready worker serves on and its replacement waits for room.
        surge = surge and (room.fits or self._making_room(worker.model) or last)
        if not first and last:
            return  # already serving on until its replacement is ready: nothing changes
        # Draining early leaves the model a worker short until the replacement is ready:
        # the policy's lead was too short for this leak (one that sped up, say).
        emit = log.info if first else log.warning
        fields = {**self.event(worker, reason, verdict, now), "surge": surge,
                  "replacement_first": surge and room.fits,
                  **({"last_ready": True} if last else {}),
                  **({"room": str(room), **room.fields()} if room.limit is not None else {}),
                  "recycling_for": None if first else str(worker.reason)}
        emit("worker_recycling" if first else "worker_draining_early", **fields)
        if surge:
            self.lifecycle.replace(worker, reason, now)
        else:
            self.lifecycle.drain(worker, reason, now)

    def kill(self, worker: WorkerHandle, verdict: Verdict, now: float) -> None:
        reason = verdict.reason or Reason.KILL_MEMORY
        if not worker.leaving:  # a leaving worker's recycle was counted when it began
            self.pool.count_recycle(worker, reason, now, self._diagnosis(worker, reason))
            self._note_churn(worker, reason, now)
        log.warning("worker_killed", **self.event(worker, reason, verdict, now))
        self.lifecycle.kill(worker, reason, now)

    def _note_churn(self, worker: WorkerHandle, reason: Reason, now: float) -> None:
        if not reason.memory:
            return
        state = self.pool.models[worker.model]
        policy = state.config.policy
        age = now - worker.started_at
        if age >= policy.min_lifetime:
            state.churn = 0
            return
        state.churn += 1
        if state.churn < CHURN_LIMIT or now < state.next_alarm:
            return
        spacing = min(MAX_ALARM_SPACING,
                      max(policy.min_lifetime, 1.0) * 2 ** (state.churn - CHURN_LIMIT))
        state.next_alarm = now + spacing
        log.error("policy_too_tight", model=worker.model, worker=worker.id,
                  reason=str(reason), churn=state.churn, age_seconds=round(age, 1),
                  detail=f"{state.churn} workers in a row recycled for memory younger than "
                  f"policy.min_lifetime ({policy.min_lifetime:.0f}s)",
                  baseline=worker.assessment.baseline, max_memory=policy.max_memory,
                  hint="recycles go on (a limit is a limit); raise the limit above the "
                  "measured baseline, or fix the leak (docs/policy.md)")

    def _diagnosis(self, worker: WorkerHandle, reason: Reason) -> Diagnosis | None:
        """Why a worker recycled for memory grew: the one from its last judgement, or made
        now (a host-pressure victim, a limit crossed on a sample taken outside a poll)."""
        if not reason.memory:
            return None
        if worker.diagnosis is None:
            config = self.pool.models[worker.model].config
            policy = config.policy
            worker.diagnosis = diagnose(list(worker.history),
                                        worker.facts(shapes=config.input_shapes), policy,
                                        worker.assessment, reason, worker.ready_probes)
        return worker.diagnosis

    def event(self, worker: WorkerHandle, reason: Reason, verdict: Verdict,
              now: float) -> dict[str, Any]:
        found = self._diagnosis(worker, reason)
        pressure = self.budget.pressure
        under = pressure is not None and pressure.under and \
            reason in (Reason.CONTAINER_PRESSURE, Reason.HOST_PRESSURE)
        return {"model": worker.model, "worker": worker.id, "pid": worker.pid,
                "reason": str(reason), "detail": verdict.detail, "jobs": worker.jobs,
                **(pressure.fields() if under and pressure is not None else {}),
                "age_seconds": round(now - worker.started_at, 1),
                "in_flight": len(self.router.held_by(worker.id)),
                **verdict.assessment.fields(),
                **({"cause": found.cause.value, "summary": found.summary,
                    "remedy": found.remedy, "evidence": found.evidence} if found else {})}


def _freeing_soon(worker: WorkerHandle, lead: float, now: float) -> bool:
    """Out of rotation on its way out, and within the lead of leaving it: its memory is
    counted as about to be freed only for as long as a way out is expected to take. A worker
    stuck draining (a long job, up to drain_timeout) is not freeing anything yet, and
    counting it at every poll would hide the others' growth until the kernel kills."""
    if worker.state not in (State.DRAINING, State.STOPPING):
        return False
    return worker.out_at is None or now - worker.out_at < lead


def _grown(worker: WorkerHandle) -> int:
    """What recycling this worker frees: how much it has grown over its baseline (a fresh
    worker comes back at its baseline, so recycling one that has not grown frees nothing and
    only costs a model load). Before the policy's warm-up is over, over its first reading
    once ready."""
    fresh = worker.assessment.baseline
    if fresh is None:
        after = [p.memory for p in worker.history.life.points
                 if worker.ready_at is not None and p.t >= worker.ready_at]
        fresh = after[0] if after else None
    return (worker.assessment.memory or 0) - fresh if fresh is not None else 0
