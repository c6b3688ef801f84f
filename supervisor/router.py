"""Jobs: per-model bounded queues, the in-flight table, dispatch, requeue and deadlines.

Every job is in exactly one place — a queue or the in-flight table — until it is answered,
and answering removes it: that is how each request gets exactly one reply.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from supervisor.batching import BatchPolicy, job_rows, take_batch
from supervisor.protocol import (
    DEADLINE_EXCEEDED,
    OVERLOADED,
    WORKER_CRASHED,
    Frame,
    Message,
    error_message,
)


@dataclass
class Job:
    id: int
    model: str
    envelope: list[Frame]  # the client's routing frames, to send the reply back
    client_job_id: bytes
    inputs: list[dict[str, object]]  # wire specs of the arrays
    arrays: list[Frame]
    received_at: float
    deadline: float | None = None
    attempts: int = 0
    worker: str | None = None
    dispatched_at: float | None = None
    crashed_workers: list[str] = field(default_factory=list)
    solo: bool = False  # was in a batch whose worker died: never batched again


UNBATCHED = BatchPolicy()
ReplyFn = Callable[[Job, Message], None]
SendJobFn = Callable[[str, list[Job], int], None]  # worker id, batch, rows to pad up to


class Router:
    def __init__(self, max_queue: int, reply: ReplyFn, send_job: SendJobFn,
                 observe: ReplyFn | None = None) -> None:
        self.max_queue = max_queue
        self._reply = reply
        self._send_job = send_job
        self._observe = observe  # sees every answer: metrics
        self.queues: dict[str, deque[Job]] = {}
        self.inflight: dict[int, Job] = {}
        self.batches: dict[str, tuple[int, int]] = {}  # model -> (batches sent, rows sent)

    # --- queries -------------------------------------------------------------------------

    def queued(self, model: str) -> int:
        return len(self.queues.get(model, ()))

    def held_by(self, worker_id: str) -> list[Job]:
        return [j for j in self.inflight.values() if j.worker == worker_id]

    def busy_workers(self) -> set[str]:
        return {j.worker for j in self.inflight.values() if j.worker is not None}

    def pending(self) -> int:
        return len(self.inflight) + sum(len(q) for q in self.queues.values())

    # --- flow ----------------------------------------------------------------------------

    def answer(self, job: Job, msg: Message) -> None:
        """The one place a job leaves the system: removed, then replied to."""
        self.inflight.pop(job.id, None)
        self._reply(job, msg)
        if self._observe is not None:
            self._observe(job, msg)

    def fail(self, job: Job, code: str, message: str) -> None:
        self.answer(job, error_message(job.client_job_id, code, message))

    def submit(self, job: Job) -> None:
        queue = self.queues.setdefault(job.model, deque())
        if len(queue) >= self.max_queue:
            self.fail(job, OVERLOADED, f"model '{job.model}' has {len(queue)} jobs queued "
                      f"(max_queue {self.max_queue}); retry later")
            return
        queue.append(job)

    def dispatch(self, model: str, ready: Iterable[tuple[str, int]], now: float,
                 policy: BatchPolicy = UNBATCHED) -> int:
        """Send queued jobs, batched, to idle workers. ``ready`` is (worker id, jobs done) of
        the model's ready workers; the least used idle worker goes first, so load spreads."""
        queue = self.queues.get(model)
        if not queue:
            return 0
        busy = self.busy_workers()
        idle = sorted((jobs, wid) for wid, jobs in ready if wid not in busy)
        sent = 0
        for _, worker_id in idle:
            batch = take_batch(queue, policy, now)
            if not batch:
                break
            rows = sum(job_rows(job) for job in batch)
            for job in batch:
                job.worker, job.dispatched_at = worker_id, now
                job.attempts += 1
                self.inflight[job.id] = job
            count, total = self.batches.get(model, (0, 0))
            self.batches[model] = (count + 1, total + rows)
            self._send_job(worker_id, batch, policy.pad_to(rows))
            sent += len(batch)
        return sent

    def _expired(self, job: Job, now: float) -> None:
        self.fail(job, DEADLINE_EXCEEDED, f"deadline passed {now - job.received_at:.3f}s after "
                  "the job was received, before a worker could take it")

    def complete(self, job_id: int, worker_id: str) -> Job | None:
        """The in-flight job a worker answered, or None if it is no longer that worker's
        (requeued after a drain timeout, say): a late answer is dropped, never sent twice."""
        job = self.inflight.get(job_id)
        if job is None or job.worker != worker_id:
            return None
        return job

    def requeue(self, worker_id: str, max_attempts: int, why: str,
                blame_jobs: bool = True) -> tuple[int, int]:
        """Take back a lost worker's jobs: to the front of their queue, or answered
        ``worker_crashed`` once they have been tried ``max_attempts`` times. With
        ``blame_jobs`` false (we killed the worker for its memory, say) the try is not
        counted against the jobs. Returns (requeued, failed)."""
        requeued = failed = 0
        held = self.held_by(worker_id)
        for job in sorted(held, key=lambda j: j.id, reverse=True):
            del self.inflight[job.id]
            job.worker = job.dispatched_at = None
            if not blame_jobs:
                job.attempts -= 1
                self.queues.setdefault(job.model, deque()).appendleft(job)
                requeued += 1
                continue
            job.crashed_workers.append(worker_id)
            # Which job of a batch killed the worker is unknown: each runs alone from now on,
            # so a poison input fails by itself and its batch mates go through.
            job.solo = job.solo or len(held) > 1
            if job.attempts >= max_attempts:
                self.fail(job, WORKER_CRASHED, f"{why}; the job was tried on {job.attempts} "
                          f"worker(s) ({', '.join(job.crashed_workers)}), each lost — possibly a "
                          "poison input; not retried again")
                failed += 1
            else:
                self.queues.setdefault(job.model, deque()).appendleft(job)
                requeued += 1
        return requeued, failed

    def overdue(self, now: float, timeouts: dict[str, float]) -> list[Job]:
        """In-flight jobs that have run longer than their model's job timeout."""
        if not timeouts:
            return []
        return [j for j in self.inflight.values() if j.model in timeouts and
                j.dispatched_at is not None and now - j.dispatched_at > timeouts[j.model]]

    def expire(self, now: float) -> None:
        """Answer queued jobs whose deadline has passed (queues are short; a scan is fine)."""
        for queue in self.queues.values():
            if not any(j.deadline is not None and now >= j.deadline for j in queue):
                continue
            keep = deque(j for j in queue if j.deadline is None or now < j.deadline)
            for job in queue:
                if job.deadline is not None and now >= job.deadline:
                    self._expired(job, now)
            queue.clear()
            queue.extend(keep)

    def fail_queued(self, model: str, code: str, message: str) -> int:
        queue = self.queues.get(model)
        count = 0
        while queue:
            self.fail(queue.popleft(), code, message)
            count += 1
        return count

    def fail_everything(self, code: str, message: str) -> int:
        count = sum(self.fail_queued(model, code, message) for model in list(self.queues))
        for job in list(self.inflight.values()):
            self.fail(job, code, message)
            count += 1
        return count
