"""Jobs: per-model bounded queues, the in-flight table, dispatch, requeue and deadlines.

Every job is in exactly one place — a queue or the in-flight table of the worker holding it —
until it is answered, and answering removes it: that is how each request gets exactly one
reply. In-flight jobs are kept per worker because the hot path asks per worker (is it idle?
is this answer from the worker that holds the job?).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
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
        self.held: dict[str, dict[int, Job]] = {}  # worker id -> its jobs by id; never empty
        self.batches: dict[str, tuple[int, int]] = {}  # model -> (batches sent, rows sent)

    # --- queries -------------------------------------------------------------------------

    def queued(self, model: str) -> int:
        return len(self.queues.get(model, ()))

    def held_by(self, worker_id: str) -> list[Job]:
        return list(self.held.get(worker_id, {}).values())

    def in_flight(self) -> Iterator[Job]:
        for jobs in self.held.values():
            yield from jobs.values()

    def pending(self) -> int:
        in_flight = sum(len(jobs) for jobs in self.held.values())
        return in_flight + sum(len(q) for q in self.queues.values())

    # --- flow ----------------------------------------------------------------------------

    def answer(self, job: Job, msg: Message) -> None:
        """The one place a job leaves the system: removed, then replied to."""
        self._release(job)
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
        idle = sorted((jobs, wid) for wid, jobs in ready if wid not in self.held)
        sent = 0
        for _, worker_id in idle:
            batch = take_batch(queue, policy, now)
            if not batch:
                break
            rows = sum(job_rows(job) for job in batch)
            for job in batch:
                job.worker, job.dispatched_at = worker_id, now
                job.attempts += 1
                self.held.setdefault(worker_id, {})[job.id] = job
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
        return self.held.get(worker_id, {}).get(job_id)

    def _release(self, job: Job) -> None:
        jobs = self.held.get(job.worker or "")
        if jobs is not None and jobs.pop(job.id, None) is not None and not jobs:
            del self.held[job.worker or ""]  # a reaped worker leaves no entry behind

    def requeue(self, worker_id: str, max_attempts: int, why: str,
                blame_jobs: bool = True) -> tuple[int, int]:
        """Take back a lost worker's jobs: to the front of their queue, or answered
        ``worker_crashed`` once they have been tried ``max_attempts`` times. With
        ``blame_jobs`` false (we killed the worker for its memory, say) the try is not
        counted against the jobs. Returns (requeued, failed)."""
        requeued = failed = 0
        held = self.held_by(worker_id)
        for job in sorted(held, key=lambda j: j.id, reverse=True):
            self._release(job)
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
        return [j for j in self.in_flight() if j.model in timeouts and
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
        for job in list(self.in_flight()):
            self.fail(job, code, message)
            count += 1
        return count
