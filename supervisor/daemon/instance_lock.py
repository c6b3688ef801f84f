"""One supervisor per runtime directory: a lock file that names the running pid.

A second daemon started on the same runtime dir would bind over the first one's ipc
sockets (ZeroMQ's ipc takes over a path) and delete them when it exits, leaving the first
one running but unreachable. The lock is taken before any socket is touched, and held for
the life of the process (the kernel drops it when the process ends, however it ends).

This module owns the file's format (the holder's pid in decimal, then a newline): the
daemon writes it here, and `tfsupervisor drain` finds the daemon to signal with ``holder``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

LOCK_NAME = "supervisor.pid"


class AlreadyRunning(Exception):
    """Another live supervisor holds this runtime directory."""


class InstanceLock:
    def __init__(self, runtime_dir: Path) -> None:
        self.path = runtime_dir / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(fd)
            os.close(fd)
            raise AlreadyRunning(f"another supervisor (pid {pid or 'unknown'}) already "
                                 f"serves from {self.path.parent}; stop it first, or give "
                                 "this one another supervisor.runtime_dir") from None
        try:
            _write_pid(fd, os.getpid())
        except OSError:  # a full file system: no empty lock file left behind
            with contextlib.suppress(OSError):
                self.path.unlink()
            os.close(fd)
            raise
        self._fd = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                self.path.unlink()
            os.close(self._fd)
            self._fd = None


def holder(path: Path) -> int | None:
    """The pid of the live supervisor holding the lock file at ``path``, else None (no file,
    or one left by a supervisor that is gone). PermissionError when it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:  # held: a live supervisor
            return _read_pid(fd)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None  # left behind by a supervisor that is gone
    finally:
        os.close(fd)


def _write_pid(fd: int, pid: int) -> None:
    os.ftruncate(fd, 0)
    os.write(fd, f"{pid}\n".encode())


def _read_pid(fd: int) -> int | None:
    with contextlib.suppress(OSError):
        os.lseek(fd, 0, os.SEEK_SET)
        text = os.read(fd, 32).decode(errors="replace").strip()
        return int(text) if text.isdigit() else None
    return None
