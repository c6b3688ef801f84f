"""Prometheus metrics (off unless `supervisor.metrics` names a listen address).

Gauges about workers and queues are not kept twice: the main loop publishes an immutable
snapshot of the pool every poll, and the scrape thread reads only that. Counters and
histograms for jobs are updated where jobs are answered (prometheus_client is thread-safe).

Label values come from closed or configured sets only, so the number of series is bounded
whatever the traffic and however often workers are recycled: no job ids, and no worker ids
either. Per-worker series are labelled by the worker's stable *slot* (0..workers-1, a
replacement takes the slot of the worker it replaces) and its *role* in it: ``current``
(starting or serving, staying) or ``outgoing`` (on its way out, e.g. serving on or draining
while its replacement warms up). So a model has at most two series per slot and family. In
the rare case of several outgoing workers in one slot (a replacement that had to go before
its predecessor was gone) they are added up in one series: memory, VRAM and jobs summed,
baseline and growth the largest. Worker ids are in `status` and the logs.
"""

from __future__ import annotations

import bisect
import itertools
import platform
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any, TypeVar

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Info,
    make_wsgi_app,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from supervisor.config.keys import PolicyConfig
from supervisor.core.budget import Budget
from supervisor.core.policy import byte_limits
from supervisor.core.pool import Pool, State, WorkerHandle
from supervisor.core.reasons import ExitCause
from supervisor.core.recycling import held_back
from supervisor.core.router import Router

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5,
                   10, 30, 60)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
Number = TypeVar("Number", int, float)


# Reload outcomes (tfsupervisor_config_reloads_total): the running config is kept on reject.
RELOAD_OUTCOMES = ("applied", "rejected")
# Worker states that are counted; GONE workers have left the registry, so never counted.
COUNTED_STATES = tuple(s for s in State if s is not State.GONE)


@dataclass(frozen=True)
class SlotRow:
    """One (model, slot, role) series set: one worker, or the outgoing ones of a slot."""

    model: str
    slot: int
    role: str
    memory_metric: str
    memory: int | None
    vram: int | None
    baseline: int | None
    growth_per_hour: float | None
    growth_per_1k_jobs: float | None
    jobs: int

    @property
    def labels(self) -> list[str]:
        return [self.model, str(self.slot), self.role]


@dataclass(frozen=True)
class ModelRow:
    model: str
    configured: int
    available: bool
    queued: int
    held_back: int  # recycles the policy wants that wait (recycling.held_back)
    states: tuple[tuple[str, int], ...]  # (state, workers), non-zero ones and always ready
    recycles: tuple[tuple[str, str, int], ...]  # (reason, cause, count) of those that happened
    exits: tuple[tuple[str, int], ...]  # (cause, count), every cause that can happen
    limits: tuple[tuple[str, int], ...]  # (limit, bytes) of those set


@dataclass(frozen=True)
class BudgetRow:
    """The container's memory (core/budget.py), when the daemon could read its cgroup."""

    limit: int | None  # the binding limit (memory.high when lower than the hard limit)
    working_set: int
    headroom: int | None
    oom_kills: int


@dataclass(frozen=True)
class Snapshot:
    slots: tuple[SlotRow, ...] = ()
    models: tuple[ModelRow, ...] = ()
    budget: BudgetRow | None = None


def budget_row(budget: Budget) -> BudgetRow | None:
    if budget.cgroup is None:
        return None
    return BudgetRow(budget.limit, budget.cgroup.working_set, budget.headroom(),
                     budget.oom.total)


def slot_rows(pool: Pool) -> tuple[SlotRow, ...]:
    """Per-worker figures by (model, slot, role): one row per label set, never two."""
    groups: dict[tuple[str, int, str], list[WorkerHandle]] = {}
    for worker in pool.workers.values():
        groups.setdefault((worker.model, worker.slot, str(worker.role)), []).append(worker)
    rows = []
    for (model, slot, role), workers in sorted(groups.items()):
        a = [w.assessment for w in workers]
        # Figures as `status` shows them: the last sample (a killed worker is not judged).
        last = [w.history.last() for w in workers]
        rows.append(SlotRow(
            model, slot, role, pool.models[model].config.policy.memory_metric,
            memory=_sum([s.memory if s else None for s in last]),
            vram=_sum([s.vram if s else None for s in last]),
            baseline=_max([x.baseline for x in a]),
            growth_per_hour=_max([x.growth_per_hour for x in a]),
            growth_per_1k_jobs=_max([x.growth_per_1k_jobs for x in a]),
            jobs=sum(w.jobs for w in workers)))
    return tuple(rows)


def model_rows(pool: Pool, router: Router) -> tuple[ModelRow, ...]:
    rows = []
    for name, state in pool.models.items():
        workers = list(pool.of_model(name))
        states = tuple((s.value, n) for s in COUNTED_STATES
                       if (n := sum(1 for w in workers if w.state is s)) or s is State.READY)
        rows.append(ModelRow(
            name, state.config.workers, pool.available(name), router.queued(name),
            held_back=sum(1 for w in workers if held_back(pool, w) is not None),
            states=states,
            recycles=tuple((r, c, n) for (r, c), n in sorted(state.recycle_causes.items())),
            exits=tuple((c.value, state.exits.get(c, 0)) for c in ExitCause
                        if state.exits.get(c) or _can_happen(c, state.config.policy)),
            limits=tuple((r.value, v) for r, v in byte_limits(state.config.policy))))
    return tuple(rows)


def _can_happen(cause: ExitCause, policy: PolicyConfig) -> bool:
    """Exit causes are counted from 0 (so increase() sees the first one), except those the
    model's policy rules out: they would be series that are always 0."""
    if cause is ExitCause.JOB_TIMEOUT:
        return policy.job_timeout is not None
    if cause is ExitCause.KILLED_OVER_LIMIT:
        return bool(byte_limits(policy))
    return True


def _sum(values: Sequence[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _max(values: Sequence[Number | None]) -> Number | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def _version() -> str:
    try:
        return version("tfsupervisor")
    except PackageNotFoundError:
        return "unknown"


class Metrics(Collector):
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.snapshot = Snapshot()
        self.jobs = Tally("tfsupervisor_jobs", "Jobs answered, by model and outcome (ok or "
                          "an error code).", ("model", "outcome"))
        self.latency = Buckets("tfsupervisor_job_latency_seconds", "From a job's arrival to "
                               "its answer.", LATENCY_BUCKETS)
        self.queue_wait = Buckets("tfsupervisor_queue_wait_seconds", "From a job's arrival "
                                  "to its dispatch to a worker.", LATENCY_BUCKETS)
        self.batch_size = Buckets("tfsupervisor_batch_size", "Rows per dispatched batch.",
                                  BATCH_BUCKETS)
        self.reloads = Counter("tfsupervisor_config_reloads", "Config reloads by outcome "
                               "(rejected: the running config was kept).", ["outcome"],
                               registry=self.registry)
        for outcome in RELOAD_OUTCOMES:  # at 0 from the start: increase() sees the first one
            self.reloads.labels(outcome)
        self.loaded = Gauge("tfsupervisor_config_last_reload_success_timestamp_seconds",
                            "When the running config was loaded: at start, or by the last "
                            "applied reload (Unix time).", registry=self.registry)
        self.loaded.set_to_current_time()
        Info("tfsupervisor_build", "The running supervisor's version and Python.",
             registry=self.registry).info({"version": _version(),
                                           "python": platform.python_version()})
        ProcessCollector(namespace="tfsupervisor", registry=self.registry)
        self.registry.register(self)

    def job(self, model: str, outcome: str, latency: float | None) -> None:
        self.jobs.inc((model, outcome))
        if latency is not None:
            self.latency.observe(model, latency)

    def batch(self, model: str, rows: int, waits: list[float]) -> None:
        self.batch_size.observe(model, rows)
        for wait in waits:
            self.queue_wait.observe(model, wait)

    def reloaded(self, applied: bool) -> None:
        self.reloads.labels(RELOAD_OUTCOMES[0] if applied else RELOAD_OUTCOMES[1]).inc()
        if applied:
            self.loaded.set_to_current_time()

    def app(self) -> Any:
        """The WSGI app that serves the registry (daemon/listener.py routes /metrics to it)."""
        return make_wsgi_app(self.registry)

    def publish(self, pool: Pool, router: Router, budget: Budget | None = None) -> None:
        """Called from the main loop: replace the snapshot the scrape thread reads."""
        self.snapshot = Snapshot(slot_rows(pool), model_rows(pool, router),
                                 budget_row(budget) if budget is not None else None)

    def collect(self) -> Iterable[Metric]:
        return [*families(self.snapshot), self.jobs.family(), self.latency.family(),
                self.queue_wait.family(), self.batch_size.family()]


class Tally:
    """A counter by label values, kept as a plain dict and read at scrape time. Counting is
    on every job's path, where prometheus_client's Counter takes a lock (measured with the
    histograms below: ~8 µs of the supervisor's CPU per job, against ~1 µs). The main loop
    alone writes; the scrape thread copies the dict (atomic under the GIL)."""

    def __init__(self, name: str, doc: str, labels: tuple[str, ...]) -> None:
        self.name, self.doc, self.labels = name, doc, labels
        self.counts: dict[tuple[str, ...], int] = {}

    def inc(self, values: tuple[str, ...]) -> None:
        self.counts[values] = self.counts.get(values, 0) + 1

    def family(self) -> Metric:
        family = CounterMetricFamily(self.name, self.doc, labels=list(self.labels))
        for values, count in self.counts.copy().items():
            family.add_metric(list(values), count)
        return family


class Buckets:
    """A histogram by model, counted into fixed buckets with one bisect (a value on a bound
    falls in that bound's bucket, as ``le`` says) and turned into cumulative Prometheus
    buckets at scrape time; see Tally for why."""

    def __init__(self, name: str, doc: str, bounds: Sequence[float]) -> None:
        self.name, self.doc, self.bounds = name, doc, list(bounds)
        self.series: dict[str, tuple[list[int], list[float]]] = {}  # counts (+Inf last), sum

    def observe(self, model: str, value: float) -> None:
        series = self.series.get(model)
        if series is None:
            series = self.series[model] = ([0] * (len(self.bounds) + 1), [0.0])
        series[0][bisect.bisect_left(self.bounds, value)] += 1
        series[1][0] += value

    def family(self) -> Metric:
        family = HistogramMetricFamily(self.name, self.doc, labels=["model"])
        for model, (counts, total) in self.series.copy().items():
            cumulative = list(itertools.accumulate(counts[:]))
            # ``le`` as prometheus_client writes it: repr of the float (1.0, 0.0005).
            buckets = [(repr(float(b)), c) for b, c in zip(self.bounds, cumulative,
                                                           strict=False)]
            family.add_metric([model], [*buckets, ("+Inf", cumulative[-1])], total[0])
        return family


def families(snap: Snapshot) -> list[Metric]:
    """The snapshot as metric families (a family without samples still says it exists)."""
    slot = ["model", "slot", "role"]
    memory = GaugeMetricFamily("tfsupervisor_worker_memory_bytes", "Worker memory by the "
                               "model's memory_metric (rss, uss or pss), per slot and role.",
                               labels=[*slot, "metric"])
    baseline = GaugeMetricFamily("tfsupervisor_worker_baseline_bytes", "Worker memory at its "
                                 "first sample after the policy's warm-up.",
                                 labels=[*slot, "metric"])
    vram = GaugeMetricFamily("tfsupervisor_worker_vram_bytes", "Worker GPU memory (NVML).",
                             labels=slot)
    slope = GaugeMetricFamily("tfsupervisor_worker_growth_bytes_per_hour", "Robust memory "
                              "growth trend after warm-up.", labels=slot)
    slope_jobs = GaugeMetricFamily("tfsupervisor_worker_growth_bytes_per_1k_jobs", "Robust "
                                   "memory growth per 1000 jobs after warm-up.", labels=slot)
    jobs = CounterMetricFamily("tfsupervisor_worker_jobs", "Jobs answered by the slot's worker "
                               "(starts again from 0 when a new worker takes the slot).",
                               labels=slot)
    for row in snap.slots:
        if row.memory is not None:
            memory.add_metric([*row.labels, row.memory_metric], row.memory)
        if row.baseline is not None:
            baseline.add_metric([*row.labels, row.memory_metric], row.baseline)
        if row.vram is not None:
            vram.add_metric(row.labels, row.vram)
        if row.growth_per_hour is not None:
            slope.add_metric(row.labels, row.growth_per_hour)
        if row.growth_per_1k_jobs is not None:
            slope_jobs.add_metric(row.labels, row.growth_per_1k_jobs)
        jobs.add_metric(row.labels, row.jobs)
    states = GaugeMetricFamily("tfsupervisor_workers", "Workers by state (ready always, other "
                               "states while there are any).", labels=["model", "state"])
    configured = GaugeMetricFamily("tfsupervisor_workers_configured", "Workers the model is "
                                   "configured to have.", labels=["model"])
    queue = GaugeMetricFamily("tfsupervisor_queue_depth", "Jobs queued.", labels=["model"])
    recycles = CounterMetricFamily("tfsupervisor_recycles", "Worker recycles by reason, and "
                                   "by the suspected cause of a memory recycle ('none' for "
                                   "the others; docs/policy.md).",
                                   labels=["model", "reason", "cause"])
    held = GaugeMetricFamily("tfsupervisor_recycles_held_back", "Recycles the policy wants "
                             "that wait: max_concurrent_recycles already under way, the "
                             "replacement failing to start (back-off), or the model's last "
                             "ready worker's replacement waiting for room in the container.",
                             labels=["model"])
    exits = CounterMetricFamily("tfsupervisor_worker_exits", "Worker processes that ended, by "
                                "cause (docs/operations.md).", labels=["model", "cause"])
    limits = GaugeMetricFamily("tfsupervisor_policy_limit_bytes", "Absolute limits set in the "
                               "model's policy (max_memory and kill_memory in its "
                               "memory_metric, max_vram).", labels=["model", "limit"])
    available = GaugeMetricFamily("tfsupervisor_model_available", "1 while the model can "
                                  "be served.", labels=["model"])
    for m in snap.models:
        for state, count in m.states:
            states.add_metric([m.model, state], count)
        configured.add_metric([m.model], m.configured)
        queue.add_metric([m.model], m.queued)
        for reason, cause, count in m.recycles:
            recycles.add_metric([m.model, reason, cause], count)
        held.add_metric([m.model], m.held_back)
        for cause, count in m.exits:
            exits.add_metric([m.model, cause], count)
        for limit, value in m.limits:
            limits.add_metric([m.model, limit], value)
        available.add_metric([m.model], 1.0 if m.available else 0.0)
    return [memory, baseline, vram, slope, slope_jobs, jobs, states, configured, queue,
            recycles, held, exits, limits, available, *budget_families(snap.budget)]


def budget_families(row: BudgetRow | None) -> list[Metric]:
    """The container's memory: present once its cgroup could be read (the limit only under
    one)."""
    if row is None:
        return []
    out: list[Metric] = []
    if row.limit is not None:
        out.append(GaugeMetricFamily("tfsupervisor_memory_budget_bytes", "The memory limit "
                                     "of the supervisor's cgroup (memory.high when lower than "
                                     "the hard limit): what the container may use.",
                                     value=row.limit))
    out.append(GaugeMetricFamily("tfsupervisor_memory_working_set_bytes", "The cgroup's "
                                 "usage less its inactive file cache (the kubelet's figure).",
                                 value=row.working_set))
    if row.headroom is not None:
        out.append(GaugeMetricFamily("tfsupervisor_memory_headroom_bytes", "Memory left: the "
                                     "tighter of the cgroup's limit less its working set and "
                                     "the host's available memory.", value=row.headroom))
    out.append(CounterMetricFamily("tfsupervisor_oom_kills", "Kernel OOM kills counted in the "
                                   "supervisor's memory cgroup since it started (workers' "
                                   "are also exits with cause oom_killed).",
                                   value=row.oom_kills))
    return out
