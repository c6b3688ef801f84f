"""Whether the cores are contended: the share of wall time during which some task waited
for a CPU, from the kernel's pressure stall information (PSI: the ``some`` line's total,
microseconds, of the daemon's cgroup on cgroup v2, else of the host), read by the daemon
at every poll and told here.

The adaptive batch wait (``core/batch_wait.py``) asks it: when tasks wait for cores, a
call's fixed costs are paid in the clients' and workers' CPU time, and fuller batches free
it. Demo MLP, 32 clients sharing 2 cores with the server: some task waited 40-50 % of the
time; idle, 0 %; one client at a time, under 5 %. Two thresholds, so that the fuller
batches, which lower the pressure, do not switch themselves off. Pure: time is passed in.
"""

from __future__ import annotations

import math

# Contended from this share of wall time with some task waiting for a CPU, and until the
# share falls under RELEASE.
CONTENDED = 0.20
RELEASE = 0.10


class CpuPressure:
    """The last poll interval's share of time with some task waiting for a CPU."""

    def __init__(self) -> None:
        self.share: float | None = None  # None: not known (no PSI here, or one reading yet)
        self.contended = False
        self._last: tuple[float, int] | None = None

    def read(self, total_us: int | None, now: float) -> None:
        """The ``some`` total (microseconds) read at ``now``; None: it could not be read."""
        if total_us is None or not isinstance(total_us, int) or not 0 <= total_us < 2**64:
            self.share, self.contended, self._last = None, False, None
            return
        last, self._last = self._last, (now, total_us)
        if last is None or now <= last[0] or total_us < last[1]:
            # A first reading, a clock that did not move, or a counter that went back
            # (another cgroup): a new start, nothing known until the next reading.
            self.share, self.contended = None, False
            return
        share = (total_us - last[1]) / 1e6 / (now - last[0])
        self.share = min(1.0, share) if math.isfinite(share) else None
        self.contended = self.share is not None and \
            self.share >= (RELEASE if self.contended else CONTENDED)
