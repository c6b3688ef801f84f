"""The earliest deadline among a model's queued jobs, without scanning its queue.

The daemon asks on every wake-up when the queues next need it (Core.queue_wake). Looking at
the head of each queue only would be O(1) but wrong whenever a later job has a shorter
deadline than the head (clients send their own timeouts): that job would be answered up to
MAX_SLEEP late.
Scanning every queued job on every wake-up would cost the hot path O(queue).

So: a heap of (deadline, job id, job) per model, pushed whenever a job with a deadline is
queued (again, after a requeue). Entries of jobs no longer queued (dispatched or answered)
are dropped when they reach the top; and the heap is rebuilt from the queue whenever a push
finds it holding more than twice the queue's length, so it never holds more than about
twice max_queue entries however many jobs pass through without ever waiting.
"""

from __future__ import annotations

import heapq
from collections import deque

from supervisor.core.jobs import Job

SLACK = 16  # entries a heap may hold past twice its queue before it is rebuilt


class Expiries:
    def __init__(self) -> None:
        self.heaps: dict[str, list[tuple[float, int, Job]]] = {}

    def add(self, job: Job, queue: deque[Job]) -> None:
        """``job`` was just queued (or queued again) in ``queue``."""
        if job.deadline is None:
            return
        heap = self.heaps.setdefault(job.model, [])
        heapq.heappush(heap, (job.deadline, job.id, job))
        if len(heap) > 2 * len(queue) + SLACK:
            heap[:] = [(j.deadline, j.id, j) for j in queue if j.deadline is not None]
            heapq.heapify(heap)

    def earliest(self, model: str) -> float | None:
        """The earliest deadline of a job still queued for ``model``; None if none has one."""
        heap = self.heaps.get(model)
        while heap and not _queued(heap[0][2]):
            heapq.heappop(heap)
        return heap[0][0] if heap else None


def _queued(job: Job) -> bool:
    return job.worker is None and not job.answered
