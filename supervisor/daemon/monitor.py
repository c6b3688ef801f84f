"""Reading workers' memory from outside (psutil, NVML) for the core to judge.

The I/O half of memory monitoring: what to read and when is the core's (``Core.poll_due``),
what the readings mean is the policy's. A reading that fails (the process is gone, NVML is
missing) is left out, never raised: the loop must not die of its own housekeeping.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import psutil

from supervisor.core.history import Reading
from supervisor.daemon.gpu import VramReader
from supervisor.daemon.sampling import read_tree
from supervisor.daemon.tree import Trees


def available_memory() -> int:
    return int(psutil.virtual_memory().available)


class Monitor:
    def __init__(self, vram: VramReader | None = None,
                 host_available: Callable[[], int] = available_memory) -> None:
        self.vram = vram or VramReader()
        self.host_available = host_available

    def available(self) -> int | None:
        """The host's available memory (None if /proc/meminfo cannot be read)."""
        try:
            return self.host_available()
        except (OSError, ValueError):
            return None

    def read(self, targets: Iterable[tuple[str, int, str]], trees: Trees) -> dict[str, Reading]:
        """Readings of (worker id, pid, metric) targets, each worker's tree (as ``trees``
        last found it) included."""
        members = {pid: trees.of(pid) for _, pid, _ in targets}
        vram = self.vram.read(p for pid, tree in members.items() for p in (pid, *tree))
        out = {}
        for worker_id, pid, metric in targets:
            found = read_tree(pid, members[pid], metric)
            if found is not None:
                memory, children, private = found
                out[worker_id] = Reading(memory, _vram(vram, pid, members[pid]), children,
                                         private)
        return out


def _vram(used: dict[int, int], pid: int, tree: list[int]) -> int | None:
    """The tree's GPU memory; None when NVML reported none of it (no GPU, no NVML)."""
    found = [used[p] for p in (pid, *tree) if p in used]
    return sum(found) if found else None
