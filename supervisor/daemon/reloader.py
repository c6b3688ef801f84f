"""A reload's files, read off the main loop with a deadline.

The config file and the client key directories may sit on a network mount, where open()
or read() can block for minutes; on the loop, that would freeze every job, every status
answer and the watchdog, and healthy workers would be killed as hung. So a reload reads off
the loop (daemon/offloop.py); the loop goes on and applies what was read once the read is
done, or answers "timed out" when the deadline passes. A read that never returns is stuck
(a thread blocked in the kernel cannot be stopped); until it returns, further reloads are
refused at once rather than stacking more stuck threads.

Every requester gets one answer. A reload asked for while a read is in flight is answered
by the read after it, so a change made after the first read began is never missed; if the
read in flight times out instead, they get its answer, and the client keys are re-read for
them (a removal always applies).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from supervisor.config.keys import Config, CurveConfig
from supervisor.config.loading import load_config
from supervisor.daemon import security
from supervisor.daemon.codewatch import fingerprints
from supervisor.daemon.offloop import OffLoop, Task

Answer = Callable[[dict[str, Any]], None]


@dataclass
class Read:
    """What one read found: the keys (when CURVE is on) and the config, or what failed.

    Its thread (daemon/offloop.py) sets ``keys``, ``config``, ``code`` and ``reading``, each
    replaced whole; the loop reads them once the task is done, or past its deadline, when
    the keys (read first) still apply and ``reading`` names where it hung."""

    path: Path | None  # None: the keys only
    curve: CurveConfig | None
    # (keys, problems), set at once when read: applied even if the config read then hangs
    keys: tuple[dict[str, dict[bytes, bool]], list[str]] | None = None
    config: Config | None = None
    code: dict[str, str | None] | None = None  # each model's code fingerprint, read with it
    reading: str | None = None  # the code file being fingerprinted (None: the config file)
    task: Task[None] | None = None

    def run(self) -> None:
        # Keys first, and kept whatever the config file holds: a removal always applies.
        if self.curve is not None:
            self.keys = security.reread_clients(self.curve)
        if self.path is not None:
            self.config = load_config(self.path)
            self.code = fingerprints(self.config, self._reading)

    def start(self, offloop: OffLoop, name: str, timeout: float) -> Read:
        self.task = offloop.submit(name, self.run, timeout)
        return self

    @property
    def done(self) -> bool:
        return self.task is not None and self.task.done()

    @property
    def error(self) -> BaseException | None:
        """What the read raised (reported by the loop); only once done."""
        return None if self.task is None else self.task.error

    def _reading(self, path: Path) -> None:
        self.reading = str(path)


@dataclass
class Outcome:
    read: Read
    answers: list[Answer]
    timed_out: bool = False
    keys_again: bool = False  # timed out with reloads queued: their keys are being re-read


class Reloader:
    def __init__(self, timeout: float, offloop: OffLoop) -> None:
        self.timeout = timeout
        self.offloop = offloop
        self.current: Read | None = None
        self.answers: list[Answer] = []  # of the read in flight
        self.again: list[Answer | None] | None = None  # asked for during it: one more read
        self.stuck: Read | None = None  # abandoned after its deadline, not returned yet
        self.keys_only: Read | None = None  # the keys re-read while a config read is stuck

    def request(self, path: Path, curve: CurveConfig | None, answer: Answer | None,
                now: float) -> dict[str, Any] | None:
        """Start a read (or queue one after the read in flight). An error to answer at
        once, or None: the answer comes with the outcome."""
        if self.stuck is not None and not self.stuck.done:
            keys = "; the client keys are being re-read and apply when read" \
                if self._read_keys(curve) else ""  # a removal applies all the same
            started = self.stuck.task.started if self.stuck.task is not None else now
            return {"ok": False, "error": f"config rejected, running config kept: the read "
                    f"of {self.stuck.path} started {now - started:.0f}s ago has not "
                    f"returned (a file system that does not answer, or a file too large to "
                    f"parse); reload again once it does{keys}"}
        self.stuck = None
        if self.current is not None:
            self.again = [*(self.again or []), answer]
            return None
        self._start(path, curve, [answer] if answer else [])
        return None

    def _start(self, path: Path, curve: CurveConfig | None, answers: list[Answer]) -> None:
        self.current = Read(path, curve).start(self.offloop, "config-read", self.timeout)
        self.answers = answers

    def next_deadline(self) -> float | None:
        task = self.current.task if self.current is not None else None
        return task.deadline if task is not None else None

    def keys_read(self) -> Read | None:
        """A keys-only read that is done (at most once each)."""
        read = self.keys_only
        if read is None or not read.done:
            return None
        self.keys_only = None
        return read

    def outcome(self, path: Path, curve: CurveConfig | None, now: float) -> Outcome | None:
        """The read in flight once it is done or past its deadline; the next queued read
        (with the paths now in force) is started then."""
        read = self.current
        if read is None or read.task is None:
            return None
        if read.done:
            result = Outcome(read, self.answers)
        elif read.task.stuck(now):
            result = Outcome(read, self.answers, timed_out=True)
            self.stuck = read
        else:
            return None
        self.current, self.answers = None, []
        if self.again is not None:
            queued, self.again = self.again, None
            if result.timed_out:  # the next read would hang on the same file system; the
                result.answers += [a for a in queued if a is not None]  # keys may not
                result.keys_again = self._read_keys(curve)
            else:
                self._start(path, curve, [a for a in queued if a is not None])
        return result

    def _read_keys(self, curve: CurveConfig | None) -> bool:
        """Re-read the client keys alone (a config read is stuck): a removal made since the
        last read applies when they are read. False if there are no keys to read."""
        if curve is None:
            return False
        if self.keys_only is None:
            self.keys_only = Read(None, curve).start(self.offloop, "keys-read", self.timeout)
        return True
