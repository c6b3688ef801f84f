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


class History:
    def __init__(self, maxlen: int = 256) -> None:
        self._samples: deque[Sample] = deque(maxlen=maxlen)

    def add(self, sample: Sample) -> None:
        self._samples.append(sample)

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
