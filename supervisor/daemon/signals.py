"""Signals: the handlers only record; the main loop acts on what was recorded.

A wake-up socket pair makes the loop's poller return as soon as a signal arrives.
"""

from __future__ import annotations

import contextlib
import signal
import socket
from typing import Any


class SignalInbox:
    """Records signals; a wake-up fd makes the poller return at once."""

    def __init__(self) -> None:
        self.pending: list[int] = []
        self._reader, self._writer = socket.socketpair()
        self._reader.setblocking(False)
        self._writer.setblocking(False)

    def install(self) -> None:
        signal.set_wakeup_fd(self._writer.fileno(), warn_on_full_buffer=False)
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(signum, self._record)
        # A write to a pipe whose reader went away (the log output, a client's) fails with
        # EPIPE, which the writer handles, instead of killing the daemon. Python ignores
        # SIGPIPE already; said here so that nothing loaded later can undo it unnoticed.
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)

    def wake(self) -> None:
        """Make the poller return now (from any thread: a reload's read that is done)."""
        with contextlib.suppress(BlockingIOError):  # full: it will wake anyway
            self._writer.send(b"\0")

    def _record(self, signum: int, frame: Any) -> None:
        self.pending.append(signum)

    def fileno(self) -> int:
        return self._reader.fileno()

    def take(self, woken: bool) -> list[int]:
        """The signals recorded since the last call. ``woken``: the poller saw the wake-up
        fd readable, so it is drained (a recv that would block costs an exception: not on
        every wake-up). Python runs a signal's handler before the next bytecode after the
        poll returns, so a signal that woke the loop is in ``pending`` by now."""
        if woken:
            try:
                while self._reader.recv(4096):
                    pass
            except BlockingIOError:
                pass
        if not self.pending:
            return []  # never the live list: a handler may append while the caller iterates
        taken, self.pending = self.pending, []
        return taken
