"""Memory cgroups (v1) with a limit, made and removed by the container-budget bench and its
tests (tests/test_container_budget.py): root only."""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

MEMORY = Path("/sys/fs/cgroup/memory")


def unusable() -> str | None:
    """Why no memory cgroup can be made here, else None."""
    if os.geteuid() != 0:
        return "making memory cgroups needs root (CI runs as root)"
    if not (MEMORY / "memory.limit_in_bytes").exists():
        return "no cgroup v1 memory controller at /sys/fs/cgroup/memory"
    return None


@contextlib.contextmanager
def memory_cgroup(limit: int) -> Iterator[Path]:
    """A child memory cgroup with ``limit``; its processes killed and the cgroup removed on
    the way out."""
    reason = unusable()
    if reason is not None:
        raise RuntimeError(reason)
    path = MEMORY / f"tfs-test-{uuid.uuid4().hex[:12]}"
    path.mkdir()
    try:
        (path / "memory.limit_in_bytes").write_text(str(limit))
        with contextlib.suppress(OSError):  # no swap to hide the limit behind
            (path / "memory.swappiness").write_text("0")
        yield path
    finally:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            pids = (path / "cgroup.procs").read_text().split()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), 9)
            try:
                path.rmdir()
                break
            except OSError:
                time.sleep(0.1)  # a killed process still leaving
        if path.exists():
            raise RuntimeError(f"could not remove {path}")


def wrapper(cgroup: Path) -> list[str]:
    """Run the supervisor inside ``cgroup``: the shell joins it, then execs the daemon."""
    return ["sh", "-c", f'echo $$ > {cgroup}/cgroup.procs && exec "$@"', "sh"]


def read(cgroup: Path, name: str) -> int:
    return int((cgroup / name).read_text())


def oom_kills(cgroup: Path) -> int:
    for line in (cgroup / "memory.oom_control").read_text().splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            return int(value)
    raise RuntimeError("the kernel keeps no oom_kill counter (4.13 and later do)")
