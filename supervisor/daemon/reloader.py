"""A reload's files, read off the main loop with a deadline.

The config file and the client key directories may sit on a network mount, where open()
or read() can block for minutes. Read on the loop, that froze every job, every status
answer and the watchdog, and then healthy workers were killed as hung. So a reload reads in
a thread; the loop goes on and applies what was read when the thread is done, or answers
"timed out" when the deadline passes. A read that never returns is abandoned (a thread
blocked in the kernel cannot be stopped); until it returns, further reloads are refused at
once rather than stacking more stuck threads.

Every requester gets one answer. A reload asked for while a read is in flight is answered
by the read after it, so a change made after the first read began is never missed; if the
read in flight times out instead, they get its answer, and the client keys are re-read for
them (a removal always applies).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from supervisor.config.keys import Config, CurveConfig
from supervisor.config.loading import load_config
from supervisor.daemon import security
from supervisor.daemon.codewatch import fingerprints

Answer = Callable[[dict[str, Any]], None]


@dataclass
class Read:
    """What one read found: the keys (when CURVE is on) and the config, or what failed."""

    path: Path | None  # None: the keys only
    curve: CurveConfig | None
    # (keys, problems), set at once when read: applied even if the config read then hangs
    keys: tuple[dict[str, dict[bytes, bool]], list[str]] | None = None
    config: Config | None = None
    code: dict[str, str | None] | None = None  # each model's code fingerprint, read with it
    reading: str | None = None  # the code file being fingerprinted (None: the config file)
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def run(self, wake: Callable[[], None]) -> None:
        try:
            # Keys first, and kept whatever the config file holds: a removal always applies.
            if self.curve is not None:
                self.keys = security.reread_clients(self.curve)
            if self.path is not None:
                self.config = load_config(self.path)
                self.code = fingerprints(self.config, self._reading)
        except BaseException as exc:  # reported by the loop, never raised in this thread
            self.error = exc
        finally:
            self.done.set()
            wake()

    def _reading(self, path: Path) -> None:
        self.reading = str(path)


@dataclass
class Outcome:
    read: Read
    answers: list[Answer]
    timed_out: bool = False
    keys_again: bool = False  # timed out with reloads queued: their keys are being re-read


class Reloader:
    def __init__(self, timeout: float, wake: Callable[[], None]) -> None:
        self.timeout = timeout
        self.wake = wake
        self.current: Read | None = None
        self.deadline = 0.0
        self.answers: list[Answer] = []  # of the read in flight
        self.again: list[Answer | None] | None = None  # asked for during it: one more read
        self.stuck: Read | None = None  # abandoned after its deadline, not returned yet
        self.stuck_since = 0.0
        self.keys_only: Read | None = None  # the keys re-read while a config read is stuck

    def request(self, path: Path, curve: CurveConfig | None, answer: Answer | None,
                now: float) -> dict[str, Any] | None:
        """Start a read (or queue one after the read in flight). An error to answer at
        once, or None: the answer comes with the outcome."""
        if self.stuck is not None and not self.stuck.done.is_set():
            keys = "; the client keys are being re-read and apply when read" \
                if self._read_keys(curve) else ""  # a removal applies all the same
            return {"ok": False, "error": f"config rejected, running config kept: the read "
                    f"of {self.stuck.path} started {now - self.stuck_since:.0f}s ago has not "
                    f"returned (a file system that does not answer, or a file too large to "
                    f"parse); reload again once it does{keys}"}
        self.stuck = None
        if self.current is not None:
            self.again = [*(self.again or []), answer]
            return None
        self._start(path, curve, [answer] if answer else [], now)
        return None

    def _start(self, path: Path, curve: CurveConfig | None, answers: list[Answer],
               now: float) -> None:
        read = Read(path, curve)
        self.current, self.deadline, self.answers = read, now + self.timeout, answers
        threading.Thread(target=read.run, args=(self.wake,), name="config-read",
                         daemon=True).start()

    def next_deadline(self) -> float | None:
        return self.deadline if self.current is not None else None

    def keys_read(self) -> Read | None:
        """A keys-only read that is done (at most once each)."""
        read = self.keys_only
        if read is None or not read.done.is_set():
            return None
        self.keys_only = None
        return read

    def outcome(self, path: Path, curve: CurveConfig | None, now: float) -> Outcome | None:
        """The read in flight once it is done or past its deadline; the next queued read
        (with the paths now in force) is started then."""
        read = self.current
        if read is None:
            return None
        if read.done.is_set():
            result = Outcome(read, self.answers)
        elif now >= self.deadline:
            result = Outcome(read, self.answers, timed_out=True)
            self.stuck, self.stuck_since = read, self.deadline - self.timeout
        else:
            return None
        self.current, self.answers = None, []
        if self.again is not None:
            queued, self.again = self.again, None
            if result.timed_out:  # the next read would hang on the same file system; the
                result.answers += [a for a in queued if a is not None]  # keys may not
                result.keys_again = self._read_keys(curve)
            else:
                self._start(path, curve, [a for a in queued if a is not None], now)
        return result

    def _read_keys(self, curve: CurveConfig | None) -> bool:
        """Re-read the client keys alone (a config read is stuck): a removal made since the
        last read applies when they are read. False if there are no keys to read."""
        if curve is None:
            return False
        if self.keys_only is None:
            self.keys_only = Read(None, curve)
            threading.Thread(target=self.keys_only.run, args=(self.wake,), name="keys-read",
                             daemon=True).start()
        return True
