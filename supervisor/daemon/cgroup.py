"""Reading the supervisor's own memory cgroup: the budget the kernel enforces.

Where it is: ``/proc/self/cgroup`` names the cgroup (v1: the line whose controllers include
``memory``; v2: the ``0::`` line), and ``/proc/self/mountinfo`` says where that hierarchy is
mounted (a container sees its own cgroup as the root of its mount). What it holds:

- cgroup v2: ``memory.max`` and ``memory.high`` (``max``: none), ``memory.current``,
  ``memory.stat``'s ``inactive_file``, ``memory.events``' ``oom_kill``.
- cgroup v1: ``memory.limit_in_bytes``, ``memory.usage_in_bytes``, ``memory.stat``'s
  ``total_inactive_file`` (and ``hierarchical_memory_limit`` for ancestors above the mount),
  ``memory.oom_control``'s ``oom_kill`` (kernels 4.13 and later).

On both, every ancestor up to the mount is read as well and the level with the least room
is the budget: a systemd slice or a pod's limit above the daemon's cgroup binds too, judged
against that level's own usage (a sibling's memory counts there).

These are in-kernel files (a few microseconds each, nothing that can hang like a network
mount), so they are read on the loop at every poll: a pod's limits can be resized in place.
A reading that fails is None, never an exception: the loop must not die of housekeeping.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from supervisor.core.budget import CgroupMemory
from supervisor.shared import logs

log = logs.get(__name__)

# cgroup v1 writes "no limit" as the largest page-aligned 64-bit count
# (9223372036854771712 on 4 KiB pages); nothing real is near 2**62.
V1_UNLIMITED = 2**62


@dataclass(frozen=True)
class Location:
    version: int
    directory: Path
    mount: Path  # the hierarchy's mount point: ancestors are read up to it


def locate(proc: Path = Path("/proc/self")) -> Location | None:
    """This process's memory cgroup directory, or None (no memory controller mounted)."""
    lines = (proc / "cgroup").read_text().splitlines()
    mounts = _cgroup_mounts((proc / "mountinfo").read_text())
    for line in lines:  # v1 first: on a hybrid host, memory is v1's controller
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(",") and (1, "memory") in mounts:
            found = _under(mounts[1, "memory"], path, 1)
            if found is not None:
                return found
    for line in lines:
        hierarchy, controllers, path = line.split(":", 2)
        if hierarchy == "0" and not controllers and (2, "") in mounts:
            found = _under(mounts[2, ""], path, 2)
            if found is not None and (found.directory / "memory.current").exists():
                return found  # v2 with the memory controller enabled for this cgroup
    return None


def v2_directory(proc: Path = Path("/proc/self")) -> Path | None:
    """This process's cgroup v2 directory, whatever controllers it has (its ``cpu.pressure``
    is there), or None (no v2 hierarchy mounted, or ours is outside what it shows)."""
    mounts = _cgroup_mounts((proc / "mountinfo").read_text())
    for line in (proc / "cgroup").read_text().splitlines():
        hierarchy, controllers, path = line.split(":", 2)
        if hierarchy == "0" and not controllers and (2, "") in mounts:
            found = _under(mounts[2, ""], path, 2)
            return None if found is None else found.directory
    return None


def _cgroup_mounts(mountinfo: str) -> dict[tuple[int, str], tuple[str, Path]]:
    """(version, "memory" or "") -> (the mount's root within the hierarchy, mount point)."""
    out: dict[tuple[int, str], tuple[str, Path]] = {}
    for line in mountinfo.splitlines():
        head, sep, tail = line.partition(" - ")
        fields, extra = head.split(), tail.split()
        if not sep or len(fields) < 5 or len(extra) < 3:
            continue
        root, point, fstype, options = _unescape(fields[3]), fields[4], extra[0], \
            extra[2].split(",")
        if fstype == "cgroup2":
            out.setdefault((2, ""), (root, Path(_unescape(point))))
        elif fstype == "cgroup" and "memory" in options:
            out.setdefault((1, "memory"), (root, Path(_unescape(point))))
    return out


def _under(mount: tuple[str, Path], path: str, version: int) -> Location | None:
    root, point = mount
    if path == root or root == "/":
        relative = "" if path == root else path
    elif path.startswith(root.rstrip("/") + "/"):
        relative = path[len(root.rstrip("/")):]
    else:
        return None  # our cgroup is outside what this mount shows
    directory = point / relative.lstrip("/")
    return Location(version, directory, point) if directory.is_dir() else None


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal."""
    return field.encode().decode("unicode_escape") if "\\" in field else field


def read(location: Location) -> CgroupMemory:
    """One reading (raises OSError or ValueError on a file that is gone or garbled): the
    level with the least room, from the daemon's own cgroup up to the mount (a parent's
    limit binds too, and is judged against the parent's own usage: a sibling's memory
    counts there), with the OOM kills of the daemon's own cgroup (its processes')."""
    own = location.directory
    level = _level_v1 if location.version == 1 else _level_v2
    best = level(own)
    directory = own
    while directory != location.mount and location.mount in directory.parents:
        directory = directory.parent
        if not (directory / ("memory.limit_in_bytes" if location.version == 1
                             else "memory.max")).exists():
            break  # a v2 hierarchy's root has no limit files
        candidate = level(directory)
        if _tighter(candidate, best):
            best = candidate
    if location.version == 1:
        # The limits of ancestors above what this mount shows (a container sees its own
        # cgroup as the root): only the effective limit is known, against our own usage.
        effective = _keyed(own / "memory.stat").get("hierarchical_memory_limit")
        mine = level(own)
        if effective is not None and effective < V1_UNLIMITED and \
                _tighter(CgroupMemory(1, mine.path, effective, mine.usage, mine.inactive_file),
                         best):
            best = CgroupMemory(1, mine.path, effective, mine.usage, mine.inactive_file)
        oom = _keyed(own / "memory.oom_control").get("oom_kill")
    else:
        oom = _keyed(own / "memory.events").get("oom_kill")
    return CgroupMemory(location.version, best.path, best.limit, best.usage,
                        best.inactive_file, best.high, oom)


def _level_v1(directory: Path) -> CgroupMemory:
    stat = _keyed(directory / "memory.stat")
    limit = int((directory / "memory.limit_in_bytes").read_text())
    return CgroupMemory(1, str(directory), limit if limit < V1_UNLIMITED else None,
                        int((directory / "memory.usage_in_bytes").read_text()),
                        stat.get("total_inactive_file", stat.get("inactive_file", 0)))


def _level_v2(directory: Path) -> CgroupMemory:
    stat = _keyed(directory / "memory.stat")
    return CgroupMemory(2, str(directory), _max(directory / "memory.max"),
                        int((directory / "memory.current").read_text()),
                        stat.get("inactive_file", 0), _max(directory / "memory.high"))


def _tighter(level: CgroupMemory, best: CgroupMemory) -> bool:
    if level.binding_limit is None:
        return False
    if best.binding_limit is None:
        return True
    return level.binding_limit - level.working_set < best.binding_limit - best.working_set


def _max(path: Path) -> int | None:
    if not path.exists():
        return None
    text = path.read_text().strip()
    return None if text == "max" else int(text)


def _keyed(path: Path) -> dict[str, int]:
    """A flat-keyed cgroup file (``key value`` lines); missing file: empty."""
    if not path.exists():
        return {}
    out = {}
    for line in path.read_text().splitlines():
        key, _, value = line.partition(" ")
        if value.strip().lstrip("-").isdigit():
            out[key] = int(value)
    return out


class CgroupReader:
    """The budget at every poll. Located once, located again after a reading fails (the
    process was moved, the cgroup removed); a failure is logged once, not every poll."""

    def __init__(self, proc: Path = Path("/proc/self")) -> None:
        self.proc = proc
        self.location: Location | None = None
        self.located = False
        self.failing = False

    def read(self) -> CgroupMemory | None:
        try:
            if not self.located:
                self.location, self.located = locate(self.proc), True
            if self.location is None:
                return None
            reading = read(self.location)
        except (OSError, ValueError, IndexError) as exc:
            if not self.failing:
                log.warning("memory_cgroup_unreadable", error=f"{type(exc).__name__}: {exc}",
                            hint="memory is judged by the host alone until it can be read")
            self.failing, self.located = True, False
            return None
        self.failing = False
        return reading
