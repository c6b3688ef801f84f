"""Reading a worker's memory from the outside (psutil), its own children included.

Finding a process's descendants means scanning every process on the host (psutil reads
/proc/*/stat), about 7 ms on a quiet machine. Workers rarely start processes of their own,
so the scan is done once for all workers, and only every DESCENDANT_REFRESH seconds; each
poll then reads just the known pids.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import psutil

DESCENDANT_REFRESH = 30.0
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def read_memory(pid: int, metric: str, descendants: Iterable[int] = ()) -> int | None:
    """RSS, USS or PSS in bytes of ``pid`` plus the given descendants; None if ``pid`` is
    gone. USS and PSS read /proc/PID/smaps (about a millisecond per process): fine at one
    poll a second, which is why they are not the default."""
    total = _one(pid, metric)
    if total is None:
        return None
    for child in descendants:
        total += _one(child, metric) or 0
    return total


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


class Descendants:
    """Descendant pids of each worker, from one process scan every DESCENDANT_REFRESH s."""

    def __init__(self) -> None:
        self.by_pid: dict[int, list[int]] = {}
        self.next_scan = 0.0

    def of(self, pid: int) -> list[int]:
        return self.by_pid.get(pid, [])

    def refresh(self, roots: Iterable[int], now: float) -> None:
        if now < self.next_scan:
            return
        self.next_scan = now + DESCENDANT_REFRESH
        children: dict[int, list[int]] = {}
        for proc in psutil.process_iter(["ppid"]):
            children.setdefault(proc.info["ppid"], []).append(proc.pid)
        self.by_pid = {root: _walk(root, children) for root in roots}


def _walk(root: int, children: dict[int, list[int]]) -> list[int]:
    found, stack = [], list(children.get(root, []))
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, []))
    return found
