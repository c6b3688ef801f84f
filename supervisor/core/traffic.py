"""What a model's traffic and its workers did, recorded for ``tfsupervisor tune`` in fixed
room: whatever the traffic and however long the daemon runs, none of this grows.

- ``Lengths``: a histogram of one variable-length axis (an input dimension the model
  declares ``None`` past the batch axis) with fixed buckets: exact up to 63, then 32
  buckets per power of two (each under 1/32 of its lengths wide) up to MAX_LENGTH, with the
  shortest and longest length seen in each bucket, so a padding size chosen from it is a
  length that really occurred.
- ``Traffic``: jobs admitted per model, and its ``Lengths`` (at most MAX_AXES axes). The
  router counts batch sizes (``Router.batch_rows``).
- ``WorkerRecord``: a worker that is gone, as the tuning needs it: its whole-life series
  (``history.Life``) and its last samples at full resolution; a model keeps the last
  PAST_WORKERS of them (``ModelState.past``).

Nothing here reads a clock: times are the core's, passed in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from supervisor.core.history import History, Sample
from supervisor.shared.protocol import TensorSpec

EXACT = 64  # lengths below this have a bucket each
SUBBUCKETS = 32  # buckets per power of two above
MAX_LENGTH = 2**20  # longer lengths share the last bucket (padding sizes stop at 2**20)
MAX_AXES = 4  # variable-length axes recorded per model
PAST_WORKERS = 8  # gone workers a model remembers
RECENT_POINTS = 1024  # full-resolution samples a record carries at most (a control reply's
# arrays hold at most 4096 items)


def bucket_of(length: int) -> int:
    """The bucket index of a length (0 .. buckets()-1)."""
    n = max(0, min(length, MAX_LENGTH))
    if n < EXACT:
        return n
    octave = n.bit_length() - 1  # >= 6
    sub = (n >> (octave - 5)) & (SUBBUCKETS - 1)
    return EXACT + (octave - 6) * SUBBUCKETS + sub


def buckets() -> int:
    return bucket_of(MAX_LENGTH) + 1


@dataclass
class Lengths:
    """One axis's observed lengths: per bucket [jobs, shortest, longest]."""

    jobs: int = 0
    counts: dict[int, list[int]] = field(default_factory=dict)  # at most buckets() keys

    def add(self, length: int) -> None:
        self.jobs += 1
        index = bucket_of(length)
        found = self.counts.get(index)
        if found is None:
            self.counts[index] = [1, length, length]
        else:
            found[0] += 1
            if length < found[1]:
                found[1] = length
            elif length > found[2]:
                found[2] = length

    def to_wire(self) -> dict[str, Any]:
        return {"jobs": self.jobs, "buckets": [[low, high, n] for _, (n, low, high)
                                               in sorted(self.counts.items())]}


class Traffic:
    """Jobs admitted to one model and the lengths of its variable-length axes."""

    def __init__(self) -> None:
        self.jobs = 0
        self.lengths: dict[str, Lengths] = {}  # "input:axis" -> histogram; <= MAX_AXES
        self._inputs: Sequence[TensorSpec] | None = None
        self._axes: list[tuple[str, int, str]] = []  # (input, axis, key)

    def admitted(self, specs: Sequence[dict[str, object]],
                 inputs: Sequence[TensorSpec] | None) -> None:
        """One admitted job (its wire specs); ``inputs``: the model's, which say which axes
        vary (None past the batch axis). Unknown inputs: only the job is counted."""
        self.jobs += 1
        if inputs is None:
            return
        if inputs is not self._inputs:
            self._inputs = inputs
            self._axes = [(s.name, axis, f"{s.name}:{axis}") for s in inputs
                          for axis, d in enumerate(s.shape) if axis >= 1 and d is None
                          ][:MAX_AXES]
        for name, axis, key in self._axes:
            for spec in specs:
                if spec.get("name") == name:
                    shape = spec.get("shape")
                    if isinstance(shape, list) and len(shape) > axis and \
                            type(shape[axis]) is int:
                        found = self.lengths.get(key)
                        if found is None:
                            found = self.lengths[key] = Lengths()
                        found.add(shape[axis])
                    break

    def to_wire(self, batch_rows: dict[int, int]) -> dict[str, Any]:
        return {"jobs": self.jobs,
                "batch_rows": [[rows, n] for rows, n in sorted(batch_rows.items())],
                "lengths": {key: h.to_wire() for key, h in self.lengths.items()}}


@dataclass(frozen=True)
class WorkerRecord:
    """A worker as ``tfsupervisor tune`` reads it (live, or gone and remembered)."""

    id: str
    started_at: float
    ready_at: float | None
    ended_at: float | None  # None while it lives
    reason: str | None  # why it left, when it did
    jobs: int
    life: tuple[Sample, ...]  # the whole life, coarsening (history.Life)
    recent: tuple[Sample, ...]  # the last samples at full resolution

    @classmethod
    def of(cls, worker_id: str, started_at: float, ready_at: float | None,
           ended_at: float | None, reason: str | None, jobs: int,
           history: History) -> WorkerRecord:
        recent = list(history)[-RECENT_POINTS:]
        return cls(worker_id, started_at, ready_at, ended_at, reason, jobs,
                   tuple(history.life.points), tuple(Sample(s.t, s.jobs, s.memory, s.vram)
                                                     for s in recent))

    def to_wire(self) -> dict[str, Any]:
        return {"id": self.id, "started_at": self.started_at, "ready_at": self.ready_at,
                "ended_at": self.ended_at, "reason": self.reason, "jobs": self.jobs,
                "life": [[s.t, s.jobs, s.memory] for s in self.life],
                "recent": [[s.t, s.jobs, s.memory] for s in self.recent]}
