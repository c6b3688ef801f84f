"""What a supervisor killed outright left behind, reaped by the next one on its runtime dir.

Under systemd or Kubernetes the cgroup goes down with the service; in a terminal or a plain
container with another PID 1, a ``kill -9`` of the daemon leaves whatever of its workers'
trees does not die with them: the workers exit (PDEATHSIG), but a descendant that started
its own session (setsid) is re-parented to init and lives on, holding its memory. Nothing
the dead daemon could do about it; the next one does, before it serves:

- **Marked**: every worker is started with ``INSTANCE_VAR`` = ``ID@RUNTIME_DIR`` in its
  environment (the fronts too), which its descendants inherit: ``ID`` is random per daemon
  start, ``RUNTIME_DIR`` the runtime directory's real path.
- **Recorded**: the daemon writes ``RECORD`` in the runtime dir (its id, pid, start time and
  the boot's id) once it holds the instance lock, and removes it when it stops cleanly.
- **Reaped**: a daemon that finds a record there (the previous one did not stop cleanly)
  kills, with SIGKILL through a pidfd checked against the start time (tree.kill), every
  process whose environment carries that record's exact mark *and* that started after the
  recorded daemon did, in the same boot. Never by name, never by guess: a process without
  the mark, or with another runtime dir's, is left alone. One event says what was reaped.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from supervisor.config.worker_spec import INSTANCE_VAR
from supervisor.daemon.tree import MAX_ENVIRON, PROC, Proc, kill, read_proc, scan

RECORD = "instance.json"
BOOT_ID = "/proc/sys/kernel/random/boot_id"
# How many reaped pids the event lists (the count is always whole).
MAX_LISTED = 32


@dataclass(frozen=True)
class Instance:
    """One daemon start on one runtime dir."""

    id: str
    runtime_dir: str  # its real path
    pid: int
    start: int  # the daemon's start time, clock ticks after boot (/proc/PID/stat)
    boot: str | None  # the boot's id: start times mean nothing across boots

    @property
    def mark(self) -> str:
        return f"{self.id}@{self.runtime_dir}"

    @classmethod
    def this(cls, runtime_dir: Path) -> Instance:
        me = read_proc(os.getpid())
        return cls(secrets.token_hex(12), os.path.realpath(runtime_dir), os.getpid(),
                   me.start if me is not None else 0, boot_id())


def boot_id() -> str | None:
    try:
        with open(BOOT_ID, encoding="ascii") as file:
            return file.read().strip() or None
    except OSError:
        return None


def read_record(runtime_dir: Path) -> Instance | None:
    """The record a previous daemon left (None: none, or one that is not a record)."""
    try:
        data: Any = json.loads((runtime_dir / RECORD).read_text(encoding="utf-8"))
        found = Instance(str(data["id"]), str(data["runtime_dir"]), int(data["pid"]),
                         int(data["start"]), None if data["boot"] is None else str(data["boot"]))
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return found if found.id and found.runtime_dir else None


def write_record(runtime_dir: Path, instance: Instance) -> None:
    path = runtime_dir / RECORD
    temporary = path.with_name(f".{RECORD}.{os.getpid()}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        json.dump(asdict(instance), file)
    os.replace(temporary, path)


def remove_record(runtime_dir: Path, instance: Instance) -> None:
    """At a clean stop (every worker's tree taken down): nothing left to reap."""
    if read_record(runtime_dir) == instance:
        with contextlib.suppress(OSError):
            (runtime_dir / RECORD).unlink()


def left_by(previous: Instance, me: int) -> list[Proc]:
    """The processes ``previous`` provably left: its mark in their environment, started
    after it, in this boot."""
    if previous.boot is None or previous.boot != boot_id():
        return []
    entry = f"{INSTANCE_VAR}={previous.mark}".encode()
    return [proc for proc in scan().values()
            if proc.pid != me and proc.start >= previous.start and _carries(proc.pid, entry)]


def _carries(pid: int, entry: bytes) -> bool:
    try:
        with open(f"{PROC}/{pid}/environ", "rb") as environ:
            data = environ.read(MAX_ENVIRON)
    except OSError:
        return False
    return entry in data.split(b"\0")


def reap(runtime_dir: Path, instance: Instance) -> dict[str, Any] | None:
    """Kill what the previous daemon on this runtime dir left, then record this one. Call
    it holding the instance lock (no other daemon serves from here). Returns the event's
    fields when something was reaped, else None."""
    previous = read_record(runtime_dir)
    reaped: list[int] = []
    if previous is not None and previous.id != instance.id and \
            previous.runtime_dir == instance.runtime_dir:
        reaped = [proc.pid for proc in left_by(previous, instance.pid) if kill(proc)]
    write_record(runtime_dir, instance)
    if previous is None or not reaped:
        return None
    return {"previous_pid": previous.pid, "previous_instance": previous.id,
            "reaped": len(reaped), "pids": sorted(reaped)[:MAX_LISTED], "marker": INSTANCE_VAR}
