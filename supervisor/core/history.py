"""Bounded per-worker memory history: the supervisor's own memory never grows with uptime."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from supervisor.shared.probes import Probes


@dataclass(frozen=True)
class Sample:
    """One poll of one worker. ``t`` is monotonic seconds; memory figures are bytes."""

    t: float
    jobs: int
    memory: int
    vram: int | None = None
    probes: Probes | None = None  # the worker's latest probes at the time (its heartbeats)
    children: int | None = None  # of ``memory``, its child processes' (None: not read)


# Points a worker's whole-life series keeps (Life): its resolution coarsens with age instead.
LIFE_POINTS = 128


class Life:
    """A worker's whole life in at most LIFE_POINTS samples (without probes): when full,
    every other point is dropped and from then on only every other sample is kept, so the
    series spans ready to now at a resolution that halves each time its length doubles.
    ``tfsupervisor tune`` reads it for the time to a plateau, which the bounded recent
    history (a few trend windows) cannot show."""

    def __init__(self, cap: int = LIFE_POINTS) -> None:
        self.cap = cap
        self.points: list[Sample] = []
        self.stride = 1  # every stride-th sample is kept
        self.seen = 0

    def add(self, sample: Sample) -> None:
        index, self.seen = self.seen, self.seen + 1
        if index % self.stride:
            return
        self.points.append(Sample(sample.t, sample.jobs, sample.memory, sample.vram))
        if len(self.points) > self.cap:
            self.points = self.points[::2]
            self.stride *= 2


class History:
    def __init__(self, maxlen: int = 256) -> None:
        self._samples: deque[Sample] = deque(maxlen=maxlen)
        self.life = Life()

    def add(self, sample: Sample) -> None:
        self._samples.append(sample)
        self.life.add(sample)

    def __len__(self) -> int:
        return len(self._samples)

    def __iter__(self) -> Iterator[Sample]:
        return iter(self._samples)

    def last(self) -> Sample | None:
        return self._samples[-1] if self._samples else None


@dataclass(frozen=True)
class Reading:
    """One worker's memory as read from outside (the daemon reads, the core records)."""

    memory: int
    vram: int | None = None
    children: int | None = None  # of ``memory``, the worker's child processes' share
    # Its private memory (anonymous resident pages: what it adds to the container, the
    # shared libraries' and files' pages being charged once), None when not read.
    private: int | None = None
