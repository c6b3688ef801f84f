"""Reading a worker's memory from the outside (psutil), its own children included."""

from __future__ import annotations

import psutil


def read_memory(pid: int, metric: str) -> int | None:
    """RSS, USS or PSS in bytes of ``pid`` and its descendants; None if it is gone.

    USS and PSS read /proc/PID/smaps, which costs about a millisecond per process per call:
    fine at one poll a second, which is why they are not the default.
    """
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    total = 0
    for proc in procs:
        try:
            if metric == "rss":
                total += proc.memory_info().rss
            else:
                total += getattr(proc.memory_full_info(), metric)
        except psutil.Error:
            if proc is root:
                return None
    return total
