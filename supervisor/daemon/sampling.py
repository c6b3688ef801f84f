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


def read_tree(pid: int, tree: Iterable[int], metric: str) -> tuple[int, int, int] | None:
    """A worker's reading: its tree's memory (``metric``), its children's share of it, and
    the tree's private memory (anonymous resident pages: statm's resident less its
    file-backed and shared pages, what each process adds to the container beyond the
    libraries and files they share, charged once). None if ``pid`` is gone. Under ``rss``
    one read of /proc/PID/statm per process gives both."""
    if metric != "rss":
        own = _one(pid, metric)
        if own is None:
            return None
        children = read_memory_of(tree, metric)
        return own + children, children, sum(_statm(p)[1] for p in (pid, *tree))
    resident, private = _statm(pid)
    if resident is None:
        return None
    children = private_children = 0
    for child in tree:
        size, mine = _statm(child)
        children += size or 0
        private_children += mine
    return resident + children, children, private + private_children


def _statm(pid: int) -> tuple[int | None, int]:
    """(resident, private) bytes; (None, 0) if the process is gone."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as statm:
            fields = statm.read().split()
        resident, shared = int(fields[1]), int(fields[2])
    except (OSError, ValueError, IndexError):
        return None, 0
    return resident * PAGE_SIZE, max(0, resident - shared) * PAGE_SIZE


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
