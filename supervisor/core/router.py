"""Jobs: per-model bounded queues, the in-flight table, dispatch, requeue and deadlines.

Every job is in exactly one place — a queue or the in-flight table of the worker holding it —
until it is answered, and answering removes it: that is how each request gets exactly one
reply. In-flight jobs are kept per worker because the hot path asks per worker (is it idle?
is this answer from the worker that holds the job?).

The bounds count what a model holds, queued *and* in flight (``max_queue`` jobs,
``max_queue_bytes`` bytes of arrays): a requeued job moves from one to the other and never
pushes a model past them.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import replace

from supervisor.config.keys import BatchPolicy
from supervisor.core.actions import Action, Reply, SendBatch
from supervisor.core.batch_wait import BatchWait, Decision
from supervisor.core.batching import job_rows, take_batch
from supervisor.core.cpu import CpuPressure
from supervisor.core.expiries import Expiries
from supervisor.core.jobs import Job
from supervisor.shared import logs
from supervisor.shared.protocol import (
    DEADLINE_EXCEEDED,
    INTERNAL,
    MAX_BATCH_JOBS,
    OVERLOADED,
    WORKER_CRASHED,
    Message,
    error_message,
)

UNBATCHED = BatchPolicy()

log = logs.get(__name__)


# A worker with fewer than 1/LAG of its model's busiest worker's jobs takes batches first.
LAG = 4


def first(jobs: int, busiest: int, answered_at: float) -> tuple[int, float, int]:
    """Sort key of an idle worker (lowest goes first): one left far behind, least used
    first; then the one that answered last (-inf: never), least used breaking ties."""
    if LAG * jobs < busiest:
        return (0, 0.0, jobs)
    return (1, -answered_at, jobs)


class Router:
    def __init__(self, outbox: list[Action], max_queue: int,
                 max_queue_bytes: int | None = None) -> None:
        self.outbox = outbox
        self.max_queue = max_queue
        self.max_queue_bytes = max_queue_bytes
        self.queues: dict[str, deque[Job]] = {}
        self.held: dict[str, dict[int, Job]] = {}  # worker id -> its jobs by id; never empty
        # model -> (batches sent, rows sent, rows computed: padding included)
        self.batches: dict[str, tuple[int, int, int]] = {}
        # model -> rows -> batches sent with that many rows of the head's padded length
        # (before padding): what `tfsupervisor tune` derives allowed_batch_sizes from.
        # Rows from MAX_BATCH_JOBS on share one key, so it holds at most MAX_BATCH_JOBS keys.
        self.batch_rows: dict[str, dict[int, int]] = {}
        self.pending_jobs: dict[str, int] = {}  # model -> admitted, not yet answered
        self.pending_bytes: dict[str, int] = {}
        self.expiries = Expiries()  # the earliest deadline of each model's queued jobs
        # The adaptive batch wait (a model whose batch_timeout_ms is not set): each model's
        # measurements, its last decision, and each worker's batch in flight (model, rows,
        # dispatched at) until it is answered.
        self.waits: dict[str, BatchWait] = {}
        self.wait_decisions: dict[str, Decision] = {}
        self.sent: dict[str, tuple[str, int, float]] = {}
        # model -> worker id -> when it last answered a batch: the latest goes first.
        self.freed: dict[str, dict[str, float]] = {}
        self.cpu = CpuPressure()  # whether the cores are contended, read at every poll

    # --- queries -------------------------------------------------------------------------

    def queued(self, model: str) -> int:
        return len(self.queues.get(model, ()))

    def held_by(self, worker_id: str) -> list[Job]:
        return list(self.held.get(worker_id, {}).values())

    def in_flight(self) -> Iterator[Job]:
        for jobs in self.held.values():
            yield from jobs.values()

    def pending(self) -> int:
        return sum(self.pending_jobs.values())

    # --- flow ----------------------------------------------------------------------------

    def answer(self, job: Job, msg: Message) -> None:
        """The one place an admitted job leaves the system: removed, then replied to. A job
        no longer here (answered already) is never answered twice."""
        if not self._release(job):
            return
        job.answered = True
        self.pending_jobs[job.model] -= 1
        self.pending_bytes[job.model] -= job.nbytes
        self.outbox.append(Reply(job.envelope, msg, job, job.model))

    def fail(self, job: Job, code: str, message: str) -> None:
        self.answer(job, error_message(job.client_job_id, code, message))

    def submit(self, job: Job) -> bool:
        """Queue a new job, or answer it 'overloaded' when its model holds its limit."""
        jobs = self.pending_jobs.get(job.model, 0)
        size = self.pending_bytes.get(job.model, 0)
        over = None
        if jobs >= self.max_queue:
            over = f"{jobs} jobs (max_queue {self.max_queue})"
        elif self.max_queue_bytes is not None and size + job.nbytes > self.max_queue_bytes:
            over = f"{size} bytes, this job {job.nbytes} more (max_queue_bytes " \
                   f"{self.max_queue_bytes})"
        if over is not None:
            message = f"model '{job.model}' holds {over}; retry later"
            self.outbox.append(Reply(job.envelope, error_message(job.client_job_id, OVERLOADED,
                                                                 message), None, job.model))
            return False
        self.waits.setdefault(job.model, BatchWait()).arrived(job_rows(job), jobs,
                                                             job.received_at)
        queue = self.queues.setdefault(job.model, deque())
        queue.append(job)
        self.expiries.add(job, queue)
        self.pending_jobs[job.model] = jobs + 1
        self.pending_bytes[job.model] = size + job.nbytes
        return True

    def dispatch(self, model: str, ready: Iterable[tuple[str, int]], now: float,
                 policy: BatchPolicy = UNBATCHED) -> int:
        """Send queued jobs, batched, to idle workers. ``ready`` is (worker id, jobs done) of
        the model's workers in rotation.

        The idle worker that answered last goes first: its model's code and data are still
        in the cores' caches (demo MLP, 32 clients, 2 workers, a 3 ms wait, one run: 5,613
        against 4,785 req/s when batches alternated between the workers). A worker left far behind
        (fewer than 1/LAG of the busiest one's jobs: a replacement, one that rarely wins)
        goes first instead, least used first, so every worker serves enough jobs for its
        warm-up and memory trend to be judged and for its errors to show."""
        queue = self.queues.get(model)
        if not queue:
            return 0
        ready = list(ready)
        freed = self.freed.setdefault(model, {})
        if len(freed) > len(ready) + 64:  # workers gone since
            live = {wid for wid, _ in ready}
            self.freed[model] = freed = {w: t for w, t in freed.items() if w in live}
        busiest = max((jobs for _, jobs in ready), default=0)
        idle = sorted((first(jobs, busiest, freed.get(wid, -math.inf)), wid)
                      for wid, jobs in ready if wid not in self.held)
        if not idle:
            return 0
        if policy.adaptive:
            contended = self.cpu.contended
            in_workers = sum(len(self.held.get(wid, ())) for wid, _ in ready) \
                if contended else 0
            decision = self.waits.setdefault(model, BatchWait()).decide(
                len(ready), policy.max_batch_size, now, contended, in_workers)
            self.wait_decisions[model] = decision
            policy = replace(policy, timeout=decision.seconds)
        sent = 0
        for _, worker_id in idle:
            try:
                batch = take_batch(queue, policy, now)
            except Exception as exc:  # a defect in batching must not stall the model
                self._unbatchable(queue, exc)
                continue
            if not batch:
                break
            rows = sum(job_rows(job) for job in batch)
            for job in batch:
                job.worker, job.dispatched_at = worker_id, now
                job.attempts += 1
                self.held.setdefault(worker_id, {})[job.id] = job
            # For tune, the rows the head's own padded length brought, riders left out:
            # they only fill the batch sizes already allowed.
            own = sum(job_rows(job) for job in batch if job.key == batch[0].key)
            sizes = self.batch_rows.setdefault(model, {})
            key = min(own, MAX_BATCH_JOBS)
            sizes[key] = sizes.get(key, 0) + 1
            pad = policy.pad_to(rows) if len(batch) > 1 or batch[0].rows is not None else 0
            count, total, computed = self.batches.get(model, (0, 0, 0))
            self.batches[model] = (count + 1, total + rows, computed + max(rows, pad))
            self.outbox.append(SendBatch(worker_id, tuple(batch), pad, now, rows))
            self.sent[worker_id] = (model, rows, now)
            sent += len(batch)
        if len(self.sent) > len(self.held) + 64:  # batches of workers gone unanswered
            self.sent = {w: s for w, s in self.sent.items() if w in self.held}
        return sent

    def _unbatchable(self, queue: deque[Job], exc: Exception) -> None:
        """Batching raised over this queue: its head is answered ``internal`` (it may be the
        job that set it off), so the jobs behind it are dispatched instead of stalled on
        every turn."""
        log.error("batching_failed", model=queue[0].model, error=f"{type(exc).__name__}: "
                  f"{exc}"[:500], exc_info=exc)
        self.fail(queue[0], INTERNAL, "the supervisor could not batch this job "
                  f"({type(exc).__name__}); it was not run")

    def batch_done(self, worker_id: str, now: float, served: bool = True) -> None:
        """A worker answered its batch: its time from dispatch counts in the model's costs.
        ``served``: some job of it got a result; only then is the worker the warm one that
        the next batch goes to (one that fails every job fast would take them all)."""
        sent = self.sent.pop(worker_id, None)
        if sent is not None:
            model, rows, at = sent
            if served:
                self.freed.setdefault(model, {})[worker_id] = now
            self.waits.setdefault(model, BatchWait()).called(rows, now - at)

    def batch_policy(self, model: str, policy: BatchPolicy) -> BatchPolicy:
        """``policy`` with the wait in force: an adaptive one's last decision."""
        if not policy.adaptive:
            return policy
        decision = self.wait_decisions.get(model)
        return replace(policy, timeout=decision.seconds if decision else 0.0)

    def holds(self, worker_id: str, job: Job) -> bool:
        """Whether ``job`` is still in that worker's hands (not requeued, not answered)."""
        return self.held.get(worker_id, {}).get(job.id) is job

    def complete(self, job_id: int, worker_id: str) -> Job | None:
        """The in-flight job a worker answered, or None if it is no longer that worker's
        (requeued after a drain timeout, say): a late answer is dropped, never sent twice."""
        return self.held.get(worker_id, {}).get(job_id)

    def _release(self, job: Job) -> bool:
        """Take a job out of wherever it is; False if it is nowhere (answered already)."""
        if job.worker is not None:
            jobs = self.held.get(job.worker)
            if jobs is None or jobs.pop(job.id, None) is None:
                return False
            if not jobs:
                del self.held[job.worker]  # a gone worker leaves no entry behind
            return True
        queue = self.queues.get(job.model)
        if queue is None:
            return False
        try:
            queue.remove(job)
        except ValueError:
            return False
        return True

    def requeue(self, worker_id: str, max_attempts: int, why: str, suspect: bool,
                note: str) -> tuple[int, int]:
        """Take back a lost worker's jobs: to the front of their queue, or answered
        ``worker_crashed`` (with ``note``) once they have been sent to ``max_attempts``
        workers — every try counts, whatever the cause (docs/protocol.md). With ``suspect``
        (one of them may have caused the loss) each runs alone from then on, so a poison
        input fails by itself. Returns (requeued, failed)."""
        requeued = failed = 0
        held = self.held.pop(worker_id, {})
        for job in sorted(held.values(), key=lambda j: j.id, reverse=True):
            job.worker = job.dispatched_at = None
            job.lost_on.append(worker_id)
            job.solo = job.solo or suspect
            queue = self.queues.setdefault(job.model, deque())
            queue.appendleft(job)
            if job.attempts >= max_attempts:
                tried = ", ".join(job.lost_on[-8:])
                self.fail(job, WORKER_CRASHED, f"{why}; the job was sent to {job.attempts} "
                          f"worker(s) ({tried}), each lost — {note}; not retried again")
                failed += 1
            else:
                self.expiries.add(job, queue)
                requeued += 1
        return requeued, failed

    def overdue(self, now: float, timeouts: dict[str, float]) -> list[Job]:
        """In-flight jobs that have run longer than their model's job timeout."""
        if not timeouts:
            return []
        return [j for j in self.in_flight() if j.model in timeouts and
                j.dispatched_at is not None and now - j.dispatched_at > timeouts[j.model]]

    def expire(self, now: float) -> None:
        """Answer queued jobs whose deadline has passed. One predicate decides both which
        are answered and which are kept, so no job can fall between the two."""
        for queue in self.queues.values():
            expired = [job for job in queue if job.expired(now)]
            for job in expired:
                self.fail(job, DEADLINE_EXCEEDED, f"deadline passed "
                          f"{now - job.received_at:.3f}s after the job was received, before "
                          "a worker could take it")

    def fail_queued(self, model: str, code: str, message: str) -> int:
        queue = self.queues.get(model)
        count = 0
        while queue:
            self.fail(queue[0], code, message)
            count += 1
        return count

    def forget(self, model: str) -> None:
        """A removed model with nothing pending leaves no entry behind."""
        if not self.queues.get(model) and not self.pending_jobs.get(model):
            self.queues.pop(model, None)
            self.pending_jobs.pop(model, None)
            self.pending_bytes.pop(model, None)
            self.batches.pop(model, None)
            self.batch_rows.pop(model, None)
            self.freed.pop(model, None)
            self.waits.pop(model, None)  # a model added again under this name starts afresh
            self.wait_decisions.pop(model, None)

