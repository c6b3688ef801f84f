"""Control commands: status on the control (status) and admin endpoints, recycle and reload
on the admin endpoint only."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from supervisor.config.keys import BatchingConfig, PolicyConfig
from supervisor.core.core import Core
from supervisor.core.diagnosis import growth_split, trends
from supervisor.core.policy import Assessment, byte_limits, over_limits, window_needed
from supervisor.core.pool import WorkerHandle
from supervisor.core.recycling import held_back
from supervisor.core.traffic import WorkerRecord
from supervisor.core.tuning import HISTORY_FORMAT
from supervisor.daemon.sampling import read_memory
from supervisor.shared.protocol import TensorSpec

Answer = Callable[[dict[str, Any]], None]

# Commands that change what the daemon does; the status endpoint refuses them.
ADMIN_COMMANDS = ("recycle", "reload")
# A status is built (~378 µs of the loop with a few models) at most once per loop turn and
# reused by every status in that turn; while the status endpoint is saturated (requests
# waited their turn in the last second: pacing.py), for this long too, so that a flood
# costs the loop their reading and sending, not a status each. An admin command starts anew.
STATUS_FRESH = 0.1


class Controller:
    def __init__(self, core: Core, reload: Callable[[Answer], None],
                 serving: Callable[[], bool], ready: Callable[[], bool],
                 resources: Callable[[], dict[str, Any]] = dict,
                 fronts: Callable[[], list[dict[str, Any]] | None] = lambda: None,
                 turn: Callable[[], float] = lambda: 0.0,
                 paced: Callable[[], dict[str, Any] | None] = lambda: None,
                 busy: Callable[[], bool] = lambda: False) -> None:
        self.core = core
        self.fronts = fronts  # the HTTP front processes (None: no http.listen)
        self.resources = resources  # the daemon's own: log lines dropped, descriptors
        self.reload = reload
        self.serving = serving  # past start-up (READY=1 sent) and not stopping
        self.ready = ready  # serving, and every required model has a ready worker now
        self.turn = turn  # when the loop's current turn began: one status per turn at most
        self.paced = paced  # the control endpoint's pacing (pacing.py), shown in status
        self.busy = busy  # status requests wait their turn lately: answers shared longer
        # the status published last: when, in which turn, and the answer itself
        self.published: tuple[float, float, dict[str, Any]] | None = None

    def handle(self, header: dict[str, Any], now: float, admin: bool,
               answer: Answer) -> dict[str, Any] | None:
        """The answer now, or None when ``answer`` gets it later (a reload, whose files are
        read off the loop). ``admin``: the command came in on the admin endpoint, the only
        one that may change the service."""
        command = header.get("command")
        if command == "status":
            return self.snapshot(now)
        if admin and command in ADMIN_COMMANDS:
            self.published = None  # what it changes shows in the next status
        if command in ADMIN_COMMANDS and not admin:
            return {"ok": False, "error": f"{command!r} changes the service: send it to the "
                    "admin endpoint (supervisor.admin), which only the service user, "
                    "admin_group or curve.admin_clients may reach"}
        if command in ADMIN_COMMANDS and self.core.shutdown_started is not None:
            return {"ok": False, "error": f"the supervisor is stopping (draining its jobs): "
                    f"{command} no longer applies"}
        if command == "explain":
            return self.explain(header.get("model"))
        if command == "tune":
            return self.tune(header.get("model"), now)
        if command == "recycle":
            return self.recycle(header.get("model"), header.get("worker"))
        if command == "reload":
            def done(result: dict[str, Any]) -> None:
                self.published = None
                answer(result)
            self.reload(done)
            return None
        return {"ok": False, "error": f"unknown command {str(command)[:64]!r}; known: status, "
                "explain, tune, recycle, reload"}

    def explain(self, model: object) -> dict[str, Any]:
        """Per worker of a model: the probes, their trends per 1k jobs over the trend
        window, what accounts for the growth in bytes (Python objects, native heap, TF
        allocator, other), the input shapes that grew it most, and the suspected cause
        (read-only)."""
        state = self.core.pool.models.get(model) if isinstance(model, str) else None
        if state is None:
            return {"ok": False, "error": f"no model named {str(model)[:64]!r}"}
        policy = state.config.policy
        workers = []
        for w in self.core.pool.of_model(state.name):
            found = trends(list(w.history), w.facts(shapes=state.config.input_shapes), policy)
            probes = w.probes
            split = growth_split(found, probes)
            workers.append({
                "id": w.id, "slot": w.slot, "state": w.state.value, "jobs": w.jobs,
                "memory": w.assessment.memory, "baseline": w.assessment.baseline,
                "trends": found.fields(),
                # in the policy's warm-up nothing is judged: what it grew so far is shown
                "warmed_up": w.assessment.warmed_up, "so_far": _so_far(w),
                # what the policy judged: its window (0: not full enough yet) and slopes
                "judged": _judged(w.assessment, policy),
                # what accounts for the growth, per 1k jobs (None: memory does not grow)
                "growth_split": split.fields() if split else None,
                "probes": probes.to_wire() if probes else None,
                "probes_at_ready": w.ready_probes.to_wire() if w.ready_probes else None,
                "probe_cost_per_job": probes.cost_per_job() if probes else None,
                "diagnosis": w.diagnosis.fields() if w.diagnosis else None})
        return {"ok": True, "result": {"model": state.name, "workers": workers,
                                       "memory_metric": policy.memory_metric,
                                       "last_recycle": state.last_recycle and
                                       {k: v for k, v in state.last_recycle.items()
                                        if k != "at"},
                                       "last_unexpected_exit": state.last_unexpected_exit and
                                       {k: v for k, v in state.last_unexpected_exit.items()
                                        if k != "at"},
                                       "memory_budget": self.core.budget.snapshot(
                                           self.core.config.supervisor.min_available_memory)}}

    def tune(self, model: object, now: float) -> dict[str, Any]:
        """What `tfsupervisor tune` derives a policy from (read-only, fixed size per model):
        each worker's whole-life memory series and its last samples, the workers gone
        lately, the batch sizes sent and the lengths of variable-length inputs. Times are
        the daemon's monotonic seconds, ``now`` among them."""
        pool = self.core.pool
        if model is not None and (not isinstance(model, str) or model not in pool.models):
            return {"ok": False, "error": f"no model named {str(model)[:64]!r} (served: "
                    f"{', '.join(sorted(pool.models))})"}
        names = [model] if isinstance(model, str) else list(pool.models)
        models = {}
        for name in names:
            state = pool.models[name]
            live = [WorkerRecord.of(w.id, w.started_at, w.ready_at, None, None, w.jobs,
                                    w.history).to_wire()
                    for w in pool.of_model(name) if w.ready_at is not None]
            models[name] = {
                "traffic": state.traffic.to_wire(self.core.router.batch_rows.get(name, {})),
                "workers": live + [r.to_wire() for r in state.past]}
        return {"ok": True, "result": {"format": HISTORY_FORMAT, "now": now,
                                       "poll_interval": self.core.config.supervisor.poll_interval,
                                       "models": models}}

    def recycle(self, model: object, worker: object) -> dict[str, Any]:
        if not isinstance(model, str) or not (worker is None or isinstance(worker, str)):
            return {"ok": False, "error": "recycle needs a model name and optionally a worker id"}
        try:
            scheduled = self.core.recycle(model, worker)
        except KeyError as exc:
            return {"ok": False, "error": str(exc.args[0])}
        return {"ok": True, "result": {"scheduled": scheduled}}

    def snapshot(self, now: float) -> dict[str, Any]:
        """The status answer published in this loop turn (or, while the endpoint is
        saturated, in the last STATUS_FRESH seconds); else a new one, published. The same
        object each time it is reused (the daemon keeps its encoding beside it)."""
        turn = self.turn()
        if self.published is not None:
            at, its_turn, answer = self.published
            if its_turn == turn or (now - at < STATUS_FRESH and self.busy()):
                return answer
        answer = {"ok": True, "result": self.status(now)}
        self.published = (now, turn, answer)
        return answer

    def status(self, now: float) -> dict[str, Any]:
        pool, router = self.core.pool, self.core.router
        models = {}
        for name, state in pool.models.items():
            workers = [self._worker(w, now) for w in pool.of_model(name)]
            models[name] = {
                "workers": workers,
                "configured_workers": state.config.workers,
                "required": state.config.required,
                "queued": router.queued(name),
                "in_flight": sum(1 for j in router.in_flight() if j.model == name),
                "recycles": dict(state.recycles),
                "last_recycle": _ago(state.last_recycle, now),
                "recycles_held_back": sum(1 for w in workers if w["recycle_held_back"]),
                "exits": {str(cause): n for cause, n in state.exits.items()},
                "last_unexpected_exit": _ago(state.last_unexpected_exit, now),
                "memory_metric": state.config.policy.memory_metric,
                "max_memory": state.config.policy.max_memory,
                "limits": {str(r): v for r, v in byte_limits(state.config.policy)},
                "policy_too_tight": state.churn >= 2,
                "available": pool.available(name),
                # its workers fail to start (last_error says why); retried with back-off
                "failing_to_start": state.unavailable,
                # dropped by a reload: finishing its queue, then gone
                "removed": state.removed,
                "last_error": state.last_error,
                # live workers run code that differs from what is on disk: reload rolls them
                "code_changed_on_disk": any(w["code_current"] is False for w in workers),
                # what its code on disk is, not known: never taken for current
                "code_unknown": state.code_on_disk is None,
                "inputs": _wire(state.inputs),
                "batches": self._batches(name, state.config.batching),
            }
        return {"serving": self.serving(), "ready": self.ready(),
                "stopping": self.core.shutdown_started is not None, "models": models,
                "memory_budget": self.core.budget.snapshot(
                    self.core.config.supervisor.min_available_memory),
                # the file a reload re-reads (`reload -c` another file names it)
                "config": _config_file(self.core.config.path),
                "supervisor": {**self.resources(), "control_paced": self.paced(),
                               "cpu_pressure": self._cpu()},
                "http": self._http()}

    def _cpu(self) -> dict[str, Any]:
        """The share of the last poll interval in which some task waited for a CPU (None:
        no PSI here, or not read yet), and whether the batch wait counts it contended."""
        cpu = self.core.router.cpu
        return {"some_share": None if cpu.share is None else round(cpu.share, 3),
                "contended": cpu.contended}

    def _http(self) -> dict[str, Any] | None:
        fronts = self.fronts()
        if fronts is None:
            return None
        sup = self.core.config.supervisor
        return {"listen": sup.http.listen, "grpc": sup.grpc.listen, "fronts": fronts}

    def _batches(self, model: str, batching: BatchingConfig) -> dict[str, Any]:
        router = self.core.router
        count, rows, computed = router.batches.get(model, (0, 0, 0))
        if batching.batch_timeout_ms is not None:
            wait = {"mode": "fixed", "ms": batching.batch_timeout_ms,
                    "why": "batch_timeout_ms is set"}
        else:
            decision = router.wait_decisions.get(model)
            wait = {"mode": "adaptive", "ms": round(decision.seconds * 1e3, 3) if decision
                    else 0.0, "why": decision.reason if decision else "no batch sent yet"}
        return {"max_batch_size": batching.max_batch_size, "sent": count,
                "mean_rows": round(rows / count, 2) if count else None,
                # rows the model computed that were copies padding a batch up to an
                # allowed size: compute spent on nothing (allowed_batch_sizes)
                "padding_share": round(1 - rows / computed, 3) if computed else None,
                "wait": wait}

    def _worker(self, worker: WorkerHandle, now: float) -> dict[str, Any]:
        last = worker.history.last()
        a = worker.assessment
        policy = self.core.pool.models[worker.model].config.policy
        held = held_back(self.core.pool, worker)
        return {"id": worker.id, "slot": worker.slot, "role": str(worker.role),
                "pid": worker.pid, "state": worker.state.value,
                "rss": read_memory(worker.pid, "rss") if worker.pid else None,
                "memory": last.memory if last else None,
                # how old that reading is: memory and vram are as of then
                "sampled_ago": round(now - last.t, 3) if last else None,
                "vram": last.vram if last else None,
                # absolute limits its last sample is at or over (so it is on its way out)
                "over_limits": [str(r) for r, _, _ in over_limits(
                    last.memory if last else None, last.vram if last else None, policy)],
                "recycle_held_back": {"reason": str(held[0]), "why": str(held[1])}
                if held else None,
                "tf_memory": worker.tf_memory,
                "jobs": worker.jobs, "age": round(now - worker.started_at, 3),
                "in_flight": len(self.core.router.held_by(worker.id)),
                "warmed_up": a.warmed_up, "baseline": a.baseline,
                # its warm-up ended at ready: the growth was its own tracing (the baseline is
                # the level at ready; policy.py, Explained warm-up)
                "warmup_explained": a.warmup_explained,
                "growth_per_1k_jobs": a.growth_per_1k_jobs,
                "growth_per_hour": a.growth_per_hour,
                "seconds_to_limit": a.seconds_to_limit,
                # a trend recycles once seconds_to_limit is under this (policy.trend_lead)
                "lead_seconds": a.lead_seconds,
                "recycle_reason": str(worker.reason) if worker.reason else None,
                # asked for (an operator, a reload), to start at the next poll
                "recycle_requested": str(requested) if (requested := self.core.recycler
                                                         .requested.get(worker.id)) else None,
                # why it grows, once its trend is judged suspect (diagnosis.py)
                "suspected_cause": worker.diagnosis.cause.value if worker.diagnosis else None,
                "suspected": worker.diagnosis.summary if worker.diagnosis else None,
                # the fingerprint of the code it was started from, and whether that is the
                # code on disk now (None: not known)
                "code": worker.code,
                "code_current": None if worker.code is None or (disk := self.core.pool.models[
                    worker.model].code_on_disk) is None else worker.code == disk}


def _judged(a: Assessment, policy: PolicyConfig) -> dict[str, Any]:
    """The policy's own trend figures beside its limits, so that `explain` says what was
    judged rather than what the probes' shorter fit shows (they disagreed: "not growing
    beyond noise" printed above "+1.3 GiB per 1k jobs" from an unfilled window)."""
    return {"window": a.window, "window_needed": window_needed(policy),
            "growth_per_1k_jobs": a.growth_per_1k_jobs, "growth_per_hour": a.growth_per_hour,
            "max_growth_per_1k_jobs": policy.max_growth_per_1k_jobs,
            "max_growth_per_hour": policy.max_growth_per_hour,
            "warmup_explained": a.warmup_explained}


def _so_far(worker: WorkerHandle) -> dict[str, int] | None:
    """Memory and jobs from its first sample once ready to its last (None: fewer than two).
    From its first sample of all, it showed the model's loading (~490 MiB for the demo MLP)
    as grown over its first jobs."""
    ready, last = worker.ready_at, worker.history.last()
    first = next((p for p in worker.history.life.points
                  if ready is not None and p.t >= ready), None)
    if first is None or last is None or last is first or last.memory is None \
            or first.memory is None:
        return None
    return {"memory": last.memory - first.memory, "jobs": last.jobs - first.jobs}


def _wire(specs: list[TensorSpec] | None) -> list[dict[str, object]] | None:
    return None if specs is None else [s.to_wire() for s in specs]


def _ago(event: dict[str, Any] | None, now: float) -> dict[str, Any] | None:
    """A recorded event, its monotonic time ``at`` given as seconds ago."""
    if event is None:
        return None
    return {**{k: v for k, v in event.items() if k != "at"},
            "seconds_ago": round(now - event["at"], 1)}


def _config_file(path: os.PathLike[str] | None) -> str | None:
    """The config file's absolute path (None: started without one); abspath, not resolve:
    nothing on the loop touches the file system without a deadline."""
    return os.path.abspath(path) if path is not None else None
