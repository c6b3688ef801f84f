"""Reading a worker's memory from the outside (psutil), its own children included (which
those are: supervisor/daemon/tree.py, found anew at every poll)."""

from __future__ import annotations

import os
from collections.abc import Iterable

import psutil

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def read_memory(pid: int, metric: str) -> int | None:
    """RSS, USS or PSS in bytes of ``pid``; None if it is gone. USS and PSS read
    /proc/PID/smaps (about a millisecond per process): fine at one poll a second, which is
    why they are not the default."""
    return _one(pid, metric)


def read_memory_of(pids: Iterable[int], metric: str) -> int:
    """The processes' memory together (those gone count 0)."""
    return sum(_one(pid, metric) or 0 for pid in pids)


def _one(pid: int, metric: str) -> int | None:
    if metric == "rss":
        return _rss(pid)
    try:
        return int(getattr(psutil.Process(pid).memory_full_info(), metric))
    except psutil.Error:
        return None


def _rss(pid: int) -> int | None:
    """The figure psutil reports as rss, read straight from /proc/PID/statm: one small read
    instead of psutil's two (it also reads /proc/PID/stat to tell pids apart), which was
    most of the idle supervisor's sampling cost."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as statm:
            return int(statm.read().split()[1]) * PAGE_SIZE
    except (OSError, ValueError, IndexError):
        return None
