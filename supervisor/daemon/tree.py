"""Each worker's process tree: found at every memory poll, taken down with the worker.

A handler may start processes of its own (a tokenizer server, a converter per job). Their
memory is the worker's, so it is counted at every poll, and they must not outlive it: one
more set of orphans per recycle is exactly the slow growth tfsupervisor exists to bound.

- **Found**: one pass over /proc/*/stat per poll gives every process's parent, process group
  and start time. A worker's tree is everything whose parent chain leads to it, plus the
  supervisor's own children in the worker's process group: orphans whose parent died are
  re-parented to the supervisor, which is a child subreaper (or PID 1 in a container).
- **Taken down**: when a worker exits, its process group gets SIGKILL while its zombie
  still holds the group's number (so the number cannot have been reused), and so does
  every descendant last seen, each checked by its start time through a pidfd.
- **Escaped**: an orphan that also left the process group (setsid after a double fork) is
  still known by the TREE_VAR mark the worker puts in its children's environment; it is
  killed and reported. A child of the supervisor without the mark (in a container, an orphan
  of a `kubectl exec` session) is not ours to kill: it is only reaped when it exits.

The scan costs about 13 µs per process on the host per poll (0.9 ms for 70 processes on
the 2-core test machine, 2026-12-06), once for all workers.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from supervisor.config.worker_spec import TREE_VAR, tree_mark

PROC = "/proc"
# A process's environment is read only for the supervisor's strays, and only this much of it.
MAX_ENVIRON = 1 << 20


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    pgid: int
    start: int  # clock ticks after boot: with the pid, who this process is


@dataclass(frozen=True)
class Escaped:
    proc: Proc
    worker_id: str
    killed: int  # it and its descendants


def read_proc(pid: int) -> Proc | None:
    try:
        with open(f"{PROC}/{pid}/stat", "rb") as stat:
            data = stat.read()
    except OSError:
        return None
    return _parse(pid, data)


def _parse(pid: int, data: bytes) -> Proc | None:
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = data[data.rfind(b")") + 2:].split()
    try:
        return Proc(pid, int(fields[1]), int(fields[2]), int(fields[19]))
    except (IndexError, ValueError):
        return None


def scan() -> dict[int, Proc]:
    procs = {}
    for name in os.listdir(PROC):
        if name.isdigit() and (proc := read_proc(int(name))) is not None:
            procs[proc.pid] = proc
    return procs


def kill(proc: Proc) -> bool:
    """SIGKILL to this very process, never to another that reuses its pid: the pidfd pins
    the process the pid names now, and the start time says whether that is still ``proc``."""
    try:
        fd = os.pidfd_open(proc.pid)
    except OSError:
        return False
    try:
        now = read_proc(proc.pid)
        if now is None or now.start != proc.start:
            return False
        signal.pidfd_send_signal(fd, signal.SIGKILL)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


class Trees:
    """The descendants of each live worker, as of the last refresh."""

    def __init__(self, me: int | None = None) -> None:
        self.me = os.getpid() if me is None else me
        self.members: dict[int, list[Proc]] = {}
        # Every process ever seen in a live worker's tree, to the worker's pid: one that
        # later turns up orphaned outside the group is known as escaped even without the
        # TREE_VAR mark (a child that cleared its environment). Pruned to the living.
        self.seen: dict[tuple[int, int], str] = {}

    def of(self, root: int) -> list[int]:
        return [proc.pid for proc in self.members.get(root, ())]

    def refresh(self, roots: Mapping[int, str]) -> list[Escaped]:
        """Find every worker's tree anew (``roots``: every live worker's pid, to its id);
        kill and return the strays that escaped a worker's tree."""
        procs = scan()
        children: dict[int, list[Proc]] = {}
        for proc in procs.values():
            children.setdefault(proc.ppid, []).append(proc)
        adopted: dict[int, list[Proc]] = {root: [] for root in roots}
        escaped = []
        for stray in children.get(self.me, ()):
            if stray.pid in adopted:
                continue  # a worker
            if stray.pgid in adopted:
                adopted[stray.pgid].append(stray)  # orphaned, still in the worker's group
            elif (worker_id := self._owner(stray)) is not None:
                tree = [stray, *_walk(children.get(stray.pid, []), children)]
                escaped.append(Escaped(stray, worker_id, sum(kill(p) for p in tree)))
        self.members = {root: _walk([*children.get(root, []), *adopted[root]], children)
                        for root in roots}
        self.seen = {key: root for key, root in self.seen.items() if key[0] in procs}
        for root, members in self.members.items():
            self.seen.update(((m.pid, m.start), roots[root]) for m in members)
        return escaped

    def _owner(self, stray: Proc) -> str | None:
        """Whose tree a stray escaped: the worker whose tree it was seen in (by pid and
        start time), else the one its TREE_VAR mark names; None if it is not ours."""
        return self.seen.get((stray.pid, stray.start)) or self._mark(stray.pid)

    def take_down(self, root: int) -> int:
        """SIGKILL the worker's process group and every descendant last seen; the number of
        descendants that were still running. Call it while the worker's zombie is unreaped
        (or the worker is alive): then the group's number cannot belong to anyone else."""
        with contextlib.suppress(OSError):
            os.killpg(root, signal.SIGKILL)
        return sum(kill(proc) for proc in self.members.pop(root, ()))

    def _mark(self, pid: int) -> str | None:
        """The worker id in the process's TREE_VAR, if it is one of this supervisor's."""
        try:
            with open(f"{PROC}/{pid}/environ", "rb") as environ:
                data = environ.read(MAX_ENVIRON)
        except OSError:
            return None
        prefix = f"{TREE_VAR}={tree_mark(self.me, '')}".encode()
        for entry in data.split(b"\0"):
            if entry.startswith(prefix):
                return entry[len(prefix):].decode(errors="replace")
        return None


def _walk(start: Iterable[Proc], children: dict[int, list[Proc]]) -> list[Proc]:
    found, stack, seen = [], list(start), set()
    while stack:
        proc = stack.pop()
        if proc.pid in seen:
            continue
        seen.add(proc.pid)
        found.append(proc)
        stack.extend(children.get(proc.pid, ()))
    return found
