"""Dynamic batching, supervisor side: which queued jobs go together, and to what size.

Jobs combine when every input has the same name, dtype and shape past the first (batch)
dimension, a padded dimension counting at its bucket (supervisor/shared/padding.py). The queue
head decides; later jobs that fit join it in arrival order, up to ``max_batch_size`` rows.
A partial batch waits up to ``batch_timeout`` for more jobs (0: dispatch at once, so an
idle service adds no latency and batches form only under load).
The batch is padded up to the next allowed size, which bounds the number of distinct shapes
a model ever sees (and with it TF's per-shape memory growth); rows it would be padded with
are given to queued jobs of shorter padded lengths first (``_riders``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from supervisor.config.keys import BatchPolicy

if TYPE_CHECKING:
    from supervisor.core.jobs import Job

# Queued jobs looked at past the head when filling a batch: bounds the work per dispatch.
SCAN_LIMIT = 256




def job_key(job: Job) -> tuple[Any, ...]:
    """What must match for two jobs to share a batch (a padded model's key is made at
    admission: its variable-length axes count at their bucket)."""
    if job.key is not None:
        return job.key
    return tuple((s.get("name"), s.get("dtype"), tuple(_shape(s)[1:])) for s in job.inputs)


def job_rows(job: Job) -> int:
    """Rows a job adds to a batch (1 for a job that runs alone: see ``Job.rows``)."""
    return job.rows if job.rows is not None else 1


def batchable(job: Job) -> bool:
    """Only jobs whose arrays agree on a batch dimension may share a batch: anything else
    would hand one client's rows to another."""
    return job.rows is not None and not job.solo


def _shape(spec: dict[str, Any]) -> list[int]:
    shape = spec.get("shape")
    return list(shape) if isinstance(shape, list) else []


def _live(queue: deque[Job], now: float) -> Iterator[Job]:
    """Queued jobs whose deadline has not passed (expired ones are answered elsewhere)."""
    for index, job in enumerate(queue):
        if index > SCAN_LIMIT:
            return
        if job.deadline is None or now < job.deadline:
            yield job


def take_batch(queue: deque[Job], policy: BatchPolicy, now: float) -> list[Job]:
    """Remove and return the next batch, or [] if there is none or it should wait."""
    candidates = _live(queue, now)
    head = next(candidates, None)
    if head is None:
        return []
    batch, rows = [head], job_rows(head)
    if policy.max_batch_size > 1 and rows <= policy.max_batch_size and batchable(head):
        key = job_key(head)
        for job in candidates:
            if rows >= policy.max_batch_size:
                break
            if batchable(job) and job_key(job) == key and \
                    rows + job_rows(job) <= policy.max_batch_size:
                batch.append(job)
                rows += job_rows(job)
        waiting = now < head.received_at + policy.timeout
        if rows < policy.max_batch_size and waiting:
            return []
        batch += _riders(queue, head, policy.pad_to(rows) - rows, now)
    if len(batch) == len(queue):  # all of it (one job in flight, say): nothing to keep
        queue.clear()
        return batch
    taken = {id(job) for job in batch}
    kept = [job for job in queue if id(job) not in taken]
    queue.clear()
    queue.extend(kept)
    return batch


def _riders(queue: deque[Job], head: Job, free: int, now: float) -> list[Job]:
    """Shorter jobs for the ``free`` rows a batch is padded with (copies of its last row
    otherwise), each padded up to the batch's bucket: a padded row costs a call what a real
    one does, so a job riding there costs nothing and is one row fewer later. Longest
    bucket first (the dearest call it spares), then arrival."""
    if free <= 0 or head.joins is None:
        return []
    top = head.joins
    fits = [job for job in _live(queue, now)
            if job.joins is not None and job is not head and batchable(job) and
            job.key != head.key and job.joins.fits_under(top)]
    fits.sort(key=lambda job: job.joins.buckets if job.joins else (), reverse=True)
    riders = []
    for job in fits:
        if job_rows(job) <= free:
            riders.append(job)
            free -= job_rows(job)
    return riders


def next_deadline(queue: deque[Job], policy: BatchPolicy) -> float | None:
    """When the head's partial batch stops waiting (None: nothing waits)."""
    if not queue or policy.timeout <= 0:
        return None
    return queue[0].received_at + policy.timeout
