"""One supervisor per runtime directory: a lock file that names the running pid.

A second daemon started on the same runtime dir would bind over the first one's ipc
sockets (ZeroMQ's ipc takes over a path) and delete them when it exits, leaving the first
one running but unreachable. The lock is taken before any socket is touched, and held for
the life of the process (the kernel drops it when the process ends, however it ends).
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
            holder = _read(fd)
            os.close(fd)
            raise AlreadyRunning(f"another supervisor (pid {holder or 'unknown'}) already "
                                 f"serves from {self.path.parent}; stop it first, or give "
                                 "this one another supervisor.runtime_dir") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                self.path.unlink()
            os.close(self._fd)
            self._fd = None


def _read(fd: int) -> str:
    with contextlib.suppress(OSError, ValueError):
        os.lseek(fd, 0, os.SEEK_SET)
        return str(int(os.read(fd, 32).decode().strip()))
    return ""
