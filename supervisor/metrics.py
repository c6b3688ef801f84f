"""Prometheus metrics (off unless `supervisor.metrics` names a listen address).

Gauges about workers and queues are not kept twice: the main loop publishes an immutable
snapshot of the pool every poll, and the scrape thread reads only that. Counters and
histograms for jobs are updated where jobs are answered (prometheus_client is thread-safe).
No job ids in labels; worker ids are labels, so each recycle starts new series, as pod
names do under Kubernetes.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from supervisor.pool import Pool, State
from supervisor.router import Router

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5,
                   10, 30, 60)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


@dataclass(frozen=True)
class WorkerRow:
    model: str
    worker: str
    state: str
    memory_metric: str
    memory: int | None
    rss_growth_per_hour: float | None
    growth_per_1k_jobs: float | None
    vram: int | None
    jobs: int


@dataclass(frozen=True)
class Snapshot:
    workers: tuple[WorkerRow, ...] = ()
    queued: tuple[tuple[str, int], ...] = ()
    recycles: tuple[tuple[str, str, int], ...] = ()  # model, reason, count
    available: tuple[tuple[str, bool], ...] = ()


class Metrics(Collector):
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.snapshot = Snapshot()
        self.jobs = Counter("tfsupervisor_jobs", "Jobs answered, by model and outcome (ok or "
                            "an error code).", ["model", "outcome"], registry=self.registry)
        self.latency = Histogram("tfsupervisor_job_latency_seconds", "From a job's arrival to "
                                 "its answer.", ["model"], buckets=LATENCY_BUCKETS,
                                 registry=self.registry)
        self.queue_wait = Histogram("tfsupervisor_queue_wait_seconds", "From a job's arrival "
                                    "to its dispatch to a worker.", ["model"],
                                    buckets=LATENCY_BUCKETS, registry=self.registry)
        self.batch_size = Histogram("tfsupervisor_batch_size", "Rows per dispatched batch.",
                                    ["model"], buckets=BATCH_BUCKETS, registry=self.registry)
        ProcessCollector(namespace="tfsupervisor", registry=self.registry)
        self.registry.register(self)

    @functools.lru_cache(maxsize=4096)  # noqa: B019 - one Metrics per process, bounded
    def _child(self, family: str, *labels: str) -> Any:
        """labels() resolved once per label set: it is on every job's path."""
        return getattr(self, family).labels(*labels)

    def job(self, model: str, outcome: str, latency: float | None) -> None:
        self._child("jobs", model, outcome).inc()
        if latency is not None:
            self._child("latency", model).observe(latency)

    def batch(self, model: str, rows: int, waits: list[float]) -> None:
        self._child("batch_size", model).observe(rows)
        queue_wait = self._child("queue_wait", model)
        for wait in waits:
            queue_wait.observe(wait)

    def serve(self, address: str) -> None:
        host, _, port = address.rpartition(":")
        start_http_server(int(port), addr=host.strip("[]") or "127.0.0.1",
                          registry=self.registry)

    def publish(self, pool: Pool, router: Router) -> None:
        """Called from the main loop: replace the snapshot the scrape thread reads."""
        workers = tuple(
            WorkerRow(w.model, w.id, w.state.value,
                      pool.models[w.model].config.policy.memory_metric,
                      w.assessment.memory, w.assessment.growth_per_hour,
                      w.assessment.growth_per_1k_jobs, w.assessment.vram, w.jobs)
            for w in pool.workers.values())
        self.snapshot = Snapshot(
            workers=workers,
            queued=tuple((m, router.queued(m)) for m in pool.models),
            recycles=tuple((m, r, n) for m, s in pool.models.items()
                           for r, n in s.recycles.items()),
            available=tuple((m, not s.unavailable) for m, s in pool.models.items()))

    def collect(self) -> Iterable[Metric]:
        snap = self.snapshot
        memory = GaugeMetricFamily("tfsupervisor_worker_memory_bytes", "Worker memory by the "
                                   "model's memory_metric (rss, uss or pss).",
                                   labels=["model", "worker", "metric"])
        vram = GaugeMetricFamily("tfsupervisor_worker_vram_bytes", "Worker GPU memory (NVML).",
                                 labels=["model", "worker"])
        slope = GaugeMetricFamily("tfsupervisor_worker_growth_bytes_per_hour", "Robust memory "
                                  "growth trend after warm-up.", labels=["model", "worker"])
        slope_jobs = GaugeMetricFamily("tfsupervisor_worker_growth_bytes_per_1k_jobs", "Robust "
                                       "memory growth per 1000 jobs after warm-up.",
                                       labels=["model", "worker"])
        jobs = CounterMetricFamily("tfsupervisor_worker_jobs", "Jobs answered by the worker.",
                                   labels=["model", "worker"])
        states = GaugeMetricFamily("tfsupervisor_workers", "Workers by state.",
                                   labels=["model", "state"])
        for row in snap.workers:
            if row.memory is not None:
                memory.add_metric([row.model, row.worker, row.memory_metric], row.memory)
            if row.vram is not None:
                vram.add_metric([row.model, row.worker], row.vram)
            if row.rss_growth_per_hour is not None:
                slope.add_metric([row.model, row.worker], row.rss_growth_per_hour)
            if row.growth_per_1k_jobs is not None:
                slope_jobs.add_metric([row.model, row.worker], row.growth_per_1k_jobs)
            jobs.add_metric([row.model, row.worker], row.jobs)
        for model, _ in snap.queued:
            for state in State:
                count = sum(1 for r in snap.workers if r.model == model and r.state == state.value)
                states.add_metric([model, state.value], count)
        queue = GaugeMetricFamily("tfsupervisor_queue_depth", "Jobs queued.", labels=["model"])
        for model, depth in snap.queued:
            queue.add_metric([model], depth)
        recycles = CounterMetricFamily("tfsupervisor_recycles", "Worker recycles by reason.",
                                       labels=["model", "reason"])
        for model, reason, count in snap.recycles:
            recycles.add_metric([model, reason], count)
        available = GaugeMetricFamily("tfsupervisor_model_available", "1 while the model can "
                                      "be served.", labels=["model"])
        for model, ok in snap.available:
            available.add_metric([model], 1.0 if ok else 0.0)
        yield from (memory, vram, slope, slope_jobs, jobs, states, queue, recycles, available)
