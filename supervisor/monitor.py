"""Every poll interval: sample each worker's memory into its bounded history."""

from __future__ import annotations

from supervisor.config import SupervisorSection
from supervisor.history import Sample
from supervisor.pool import Pool, State, WorkerHandle
from supervisor.router import Router
from supervisor.sampling import read_memory


class Monitor:
    def __init__(self, pool: Pool, router: Router, settings: SupervisorSection) -> None:
        self.pool, self.router, self.settings = pool, router, settings
        self.next_poll = 0.0

    def on_ready(self, worker: WorkerHandle, now: float) -> None:
        self.sample(worker, now)

    def tick(self, now: float) -> None:
        if now < self.next_poll:
            return
        self.next_poll = now + self.settings.poll_interval
        for worker in list(self.pool.workers.values()):
            if worker.state is not State.GONE:
                self.sample(worker, now)

    def sample(self, worker: WorkerHandle, now: float) -> None:
        metric = self.pool.models[worker.model].config.policy.memory_metric
        memory = read_memory(worker.pid, metric)
        if memory is not None:
            worker.history.add(Sample(now, worker.jobs, memory))
