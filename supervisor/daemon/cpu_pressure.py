"""Reading the kernel's CPU pressure (PSI, Linux 4.20 and later) for the core to judge
(``core/cpu.py``): the ``some`` line's ``total``, the microseconds during which some task
waited for a CPU.

Where: the daemon's own cgroup v2 ``cpu.pressure`` (a pod's or a unit's tasks alone, its
CPU limit's throttling included), else ``/proc/pressure/cpu`` (the whole host: a noisy
neighbour counts there too). In-kernel files, read on the loop at every poll like the
memory cgroup's. A kernel without PSI (or with ``psi=0``) has neither: None from then on,
and the batch wait never counts the cores as contended. A reading that fails is None,
never an exception.
"""

from __future__ import annotations

from pathlib import Path

from supervisor.daemon.cgroup import v2_directory
from supervisor.shared import logs

log = logs.get(__name__)

HOST = Path("/proc/pressure/cpu")


def locate(proc: Path = Path("/proc/self"), host: Path = HOST) -> Path | None:
    """The pressure file to read, or None where there is none."""
    try:
        directory = v2_directory(proc)
    except (OSError, ValueError):
        directory = None
    if directory is not None and (directory / "cpu.pressure").is_file():
        return directory / "cpu.pressure"
    return host if host.is_file() else None


def some_total(text: str) -> int:
    """The ``some`` line's ``total=`` (microseconds); ValueError when there is none."""
    for line in text.splitlines():
        kind, _, fields = line.partition(" ")
        if kind == "some":
            for field in fields.split():
                key, _, value = field.partition("=")
                if key == "total":
                    return int(value)
    raise ValueError("no 'some ... total=' line")


class CpuPressureReader:
    """The ``some`` total at every poll. Located once; a file that cannot be read (the
    cgroup removed, PSI switched off) is logged once and located again at the next poll."""

    def __init__(self, proc: Path = Path("/proc/self"), host: Path = HOST) -> None:
        self.proc, self.host = proc, host
        self.path: Path | None = None
        self.located = False
        self.failing = False

    def read(self) -> int | None:
        if not self.located:
            self.path, self.located = locate(self.proc, self.host), True
        if self.path is None:
            return None
        try:
            total = some_total(self.path.read_text())
        except (OSError, ValueError) as exc:
            if not self.failing:
                log.warning("cpu_pressure_unreadable", path=str(self.path),
                            error=f"{type(exc).__name__}: {exc}"[:300],
                            hint="the adaptive batch wait counts the cores as uncontended "
                            "until it can be read")
            self.failing, self.located = True, False
            return None
        self.failing = False
        return total
