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
from supervisor.daemon.sampling import Descendants, read_memory


def available_memory() -> int:
    return int(psutil.virtual_memory().available)


class Monitor:
    def __init__(self, vram: VramReader | None = None,
                 host_available: Callable[[], int] = available_memory) -> None:
        self.vram = vram or VramReader()
        self.host_available = host_available
        self.descendants = Descendants()

    def read(self, targets: Iterable[tuple[str, int, str]], all_pids: Iterable[int],
             now: float) -> dict[str, Reading]:
        """Readings of (worker id, pid, metric) targets; ``all_pids`` are every live
        worker's, whose descendants are found once for all."""
        targets = list(targets)
        vram = self.vram.read(pid for _, pid, _ in targets)
        self.descendants.refresh(all_pids, now)
        out = {}
        for worker_id, pid, metric in targets:
            memory = read_memory(pid, metric, self.descendants.of(pid))
            if memory is not None:
                out[worker_id] = Reading(memory, vram.get(pid))
        return out
