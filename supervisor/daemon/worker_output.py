"""Workers' stdout and stderr under JSON logs: captured, so that every line the supervisor's
log stream carries is a JSON object.

Where lines come from
---------------------
TensorFlow writes to the process's stderr on its own (absl/oneDNN C++ lines, Python
warnings, tracebacks), and so may any user handler. Each worker gets one pipe for both
streams (merged, so a traceback keeps its place among the lines printed before it); the
daemon's poller watches the read ends. What comes through is cut into lines and each line
is either

- one of the worker's own structured log events (a JSON object with its ``event`` and this
  worker's id): written through unchanged, or
- anything else: one ``worker_output`` event with the worker, its model and the line.

Rate limits
-----------
Per worker, a token bucket bounds both (one bucket each, so a flood of text never costs the
worker its own events): a worker printing in a loop can neither flood the journal nor keep
the supervisor busy formatting. Lines over the budget are counted and reported in one
``worker_output_suppressed`` event at most every REPORT_PERIOD. The last text lines held back
are kept and logged when the worker is reaped, just before its exit event: the traceback or
``Check failed`` line that explains a crash is not lost to the rate limit.

Pure and I/O parts
------------------
:class:`LineSplitter`, :class:`TokenBucket` and :class:`OutputStream` are pure (bytes and
time in, records out); :class:`WorkerOutput` does the pipes and the writing.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
from collections import deque
from collections.abc import Container
from dataclasses import dataclass
from typing import Any, NamedTuple

import zmq

from supervisor.shared import logs

log = logs.get(__name__)

# The longest line kept whole (bytes). The partial-line buffer never grows past it, so a
# worker writing megabytes without a newline costs no memory; the worker's own JSON events
# (a traceback inside one can be tens of KB) pass through whole up to this size.
MAX_LINE = 64 * 1024
# Bytes of a text line shown in its worker_output event; the rest is cut (truncated: true).
# Enough for any log or traceback line, and the event stays under journald's LineMax (48K)
# even when JSON escaping grows undecodable bytes six-fold.
TEXT_LIMIT = 4096
# Per worker: a burst large enough for TF's start-up lines plus a long Python traceback,
# then a trickle. journald drops a service's lines past 10,000 per 30 s (about 330/s),
# its own events included; 10/s per worker keeps 30 flooding workers under that.
BURST = 200
RATE = 10.0  # lines per second
# At most one worker_output_suppressed event per worker this often (seconds).
REPORT_PERIOD = 10.0
# Text lines held back by the rate limit and kept to be logged when the worker exits (the
# end of a traceback); older ones are counted as suppressed.
TAIL_LINES = 32
# One read; at most READS_PER_TURN per worker per loop turn, so a flooding worker cannot
# keep the loop from the sockets (it waits on its full pipe meanwhile: back-pressure).
CHUNK = 64 * 1024
READS_PER_TURN = 2
# What is left in a pipe is read when its worker is reaped, up to this many reads (a
# grandchild that inherited the pipe and writes on cannot stall the reaping).
FINAL_READS = 64
# The kernel buffer of each pipe (Linux; 64 KiB otherwise). Four times the default, so the
# workers do not wait on a loop turn that is slow (a reload, a memory read) unless they
# write megabytes; small enough that 64 workers (16 MiB) stay far below the per-user soft
# limit on pipe buffers (fs.pipe-user-pages-soft, 64 MiB), past which new pipes get 4 KiB.
PIPE_SIZE = 256 * 1024

# absl/glog prefixes (TensorFlow's C++ logs: "E0513 12:01:02.123456 ..." or, before absl
# is set up, "I0000 00:00:1796293910.835071 ...": seconds since the epoch) and Python
# logging's default format ("WARNING:tensorflow:..."); anything else is logged as a warning:
# text outside the structured logs is worth a look.
_PREFIX = re.compile(rb"([IWEF])\d{4} \d\d:\d\d:\d+\.\d+ |(DEBUG|INFO|WARNING|ERROR|CRITICAL):")
_ABSL_LEVELS = {b"I": "info", b"W": "warning", b"E": "error", b"F": "error"}
_NAMED_LEVELS = {b"DEBUG": "debug", b"INFO": "info", b"WARNING": "warning", b"ERROR": "error",
                 b"CRITICAL": "error"}


class Line(NamedTuple):
    data: bytes  # without its newline; at most MAX_LINE bytes
    size: int  # the line's length in all (larger than len(data) when it was cut)


class Passthrough(NamedTuple):
    """One of the worker's own JSON log events, to be written as it is."""

    text: str


class Text(NamedTuple):
    """Anything else the worker wrote: one worker_output event."""

    line: str
    level: str
    size: int  # bytes the line had
    tail: bool  # held back by the rate limit, logged when the worker exited

    @property
    def truncated(self) -> bool:
        return self.size > TEXT_LIMIT


class Suppressed(NamedTuple):
    dropped: int


Record = Passthrough | Text | Suppressed


class LineSplitter:
    """Bytes in, complete lines out; a partial line waits for the rest (at most ``limit``
    bytes of any line are kept, the remainder only counted)."""

    def __init__(self, limit: int = MAX_LINE) -> None:
        self.limit = limit
        self._head = bytearray()
        self._size = 0

    def feed(self, data: bytes) -> tuple[list[bytes], dict[int, int]]:
        """The complete lines, without their newlines, and the full size of each one that
        was cut to the limit, by its index (rarely any: no dict per line, see OutputStream).
        """
        lines = data.split(b"\n")
        rest = lines.pop()
        cut: dict[int, int] = {}
        if lines and self._size:  # the first one ends the partial line
            self._add(lines[0])
            lines[0] = bytes(self._head)
            if self._size > self.limit:
                cut[0] = self._size
            self._head.clear()
            self._size = 0
        if len(data) > self.limit:  # only then can a line inside this read be too long
            for i, line in enumerate(lines):
                if len(line) > self.limit and i not in cut:
                    cut[i] = len(line)
                    lines[i] = line[:self.limit]
        self._add(rest)
        return lines, cut

    def flush(self) -> Line | None:
        """The partial line, if any (the stream has ended)."""
        if not self._size:
            return None
        line = Line(bytes(self._head), self._size)
        self._head.clear()
        self._size = 0
        return line

    def _add(self, piece: bytes) -> None:
        room = self.limit - len(self._head)
        if room > 0:
            self._head += piece[:room]
        self._size += len(piece)


class TokenBucket:
    """``burst`` at once, then ``rate`` per second."""

    def __init__(self, rate: float, burst: int, now: float) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = float(burst)
        self.last = now

    def take(self, now: float, count: int = 1) -> int:
        """How many of ``count`` may go now (all, some or none); those are taken."""
        self.tokens = min(self.burst, self.tokens + max(0.0, now - self.last) * self.rate)
        self.last = now
        granted = min(count, int(self.tokens))
        self.tokens -= granted
        return granted

    def give_back(self) -> None:
        """One token taken for nothing (the line was not what it might have been)."""
        self.tokens = min(self.burst, self.tokens + 1.0)


def own_event(line: Line, worker_id: str) -> str | None:
    """The line as text if it is one of this worker's own structured log events, else None.

    Proven, not assumed: a JSON object with an event and this worker's id (its log setup
    binds it to every event). Any other JSON (a handler printing data, a line naming another
    worker) is text like the rest, so it keeps its attribution and cannot pose as an event.
    NaN and Infinity, which Python accepts and jq does not, make a line text too."""
    if not line.data.startswith(b"{") or line.size > len(line.data):
        return None
    try:
        text = line.data.decode("utf-8")
        value = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError):  # RecursionError: deeply nested brackets
        return None
    if (isinstance(value, dict) and value.get("worker") == worker_id
            and isinstance(value.get("event"), str)):
        return text.rstrip("\r")
    return None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def text_record(line: Line, tail: bool = False) -> Text:
    data = line.data[:TEXT_LIMIT]
    if data.endswith(b"\r"):
        data = data[:-1]
    # backslashreplace keeps undecodable bytes visible (\xff) rather than as U+FFFD
    text = data.decode("utf-8", "backslashreplace")
    return Text(text + "…" if line.size > TEXT_LIMIT else text, level_of(data), line.size, tail)


def level_of(data: bytes) -> str:
    match = _PREFIX.match(data)
    if match is None:
        return "warning"
    absl, named = match.groups()
    return _ABSL_LEVELS[absl] if absl else _NAMED_LEVELS[named]


class OutputStream:
    """One worker's output: bytes and the time in, records to log out.

    Cheap when flooded: lines over the budget are counted in bulk, not looked at one by one
    (about 2 µs a line otherwise: a 64 KiB read of short lines would hold the loop 70 ms).
    Only lines that could be the worker's own events (they start a JSON object and hold its
    id in JSON quotes) are taken one at a time, and parsed only while the event budget
    lasts: past it they are counted as dropped unparsed (8 µs a line otherwise)."""

    def __init__(self, worker_id: str, now: float) -> None:
        self.worker_id = worker_id
        self._quoted_id = json.dumps(worker_id).encode()  # as its JSON events spell it
        self._splitter = LineSplitter()
        self._text_budget = TokenBucket(RATE, BURST, now)
        self._event_budget = TokenBucket(RATE, BURST, now)
        # Text lines held back since the last one logged: the end of a crash's output.
        self._tail: deque[Line] = deque(maxlen=TAIL_LINES)
        self.dropped = 0  # lines lost for good, not reported yet
        self._report_at: float | None = None

    def feed(self, data: bytes, now: float) -> list[Record]:
        records: list[Record] = []
        lines, cut = self._splitter.feed(data)
        if cut or self._quoted_id in data or (lines and self._quoted_id in lines[0]):
            start = 0
            for i, line in enumerate(lines):
                if i in cut:
                    self._texts(lines[start:i], now, records)
                    self._text(Line(line, cut[i]), now, records)
                    start = i + 1
                elif line.startswith(b"{") and self._quoted_id in line:
                    self._texts(lines[start:i], now, records)
                    self._candidate(Line(line, len(line)), now, records)
                    start = i + 1
            lines = lines[start:]
        self._texts(lines, now, records)
        self._report(now, records)
        return records

    def tick(self, now: float) -> list[Record]:
        """The suppressed report, when one is due and no output came to carry it."""
        records: list[Record] = []
        self._report(now, records)
        return records

    def finish(self, now: float) -> list[Record]:
        """The stream has ended (its worker exited): the partial line, what was dropped,
        and the lines held back, in that order."""
        records: list[Record] = []
        last = self._splitter.flush()
        if last is not None:
            self._candidate(last, now, records)
        if self.dropped:
            records.append(Suppressed(self.dropped))
        self.dropped = 0
        self._report_at = None
        records.extend(text_record(line, tail=True) for line in self._tail)
        self._tail.clear()
        return records

    def _candidate(self, line: Line, now: float, records: list[Record]) -> None:
        """One line that may be one of the worker's own events."""
        if not self._event_budget.take(now):
            self._lose(1, now)
            return
        event = own_event(line, self.worker_id)
        if event is not None:
            records.append(Passthrough(event))
        else:
            self._event_budget.give_back()
            self._text(line, now, records)

    def _texts(self, lines: list[bytes], now: float, records: list[Record]) -> None:
        """Text lines, none cut: those within the budget logged, the rest in bulk."""
        if not lines:
            return
        allowed = self._text_budget.take(now, len(lines))
        if allowed:
            self._logged(now)
            records.extend(text_record(Line(line, len(line))) for line in lines[:allowed])
        self._hold(lines[allowed:], now)

    def _text(self, line: Line, now: float, records: list[Record]) -> None:
        if self._text_budget.take(now):
            self._logged(now)
            records.append(text_record(line))
        else:
            self._hold_one(line, now)

    def _logged(self, now: float) -> None:
        """A text line is logged: the ones held back before it are not the last any more."""
        if self._tail:
            self._lose(len(self._tail), now)
            self._tail.clear()

    def _hold(self, lines: list[bytes], now: float) -> None:
        if not lines:
            return
        overflow = len(self._tail) + len(lines) - TAIL_LINES
        if overflow > 0:
            self._lose(overflow, now)  # the deque's maxlen pushes out as many
        self._tail.extend(Line(line[:TEXT_LIMIT], len(line)) for line in lines[-TAIL_LINES:])

    def _hold_one(self, line: Line, now: float) -> None:
        if len(self._tail) == TAIL_LINES:
            self._lose(1, now)
        self._tail.append(Line(line.data[:TEXT_LIMIT], line.size))  # bounded: cut now

    def _lose(self, count: int, now: float) -> None:
        self.dropped += count
        if self._report_at is None:
            self._report_at = now + REPORT_PERIOD

    def _report(self, now: float, records: list[Record]) -> None:
        if self._report_at is not None and now >= self._report_at:
            if self.dropped:
                records.append(Suppressed(self.dropped))
            self.dropped = 0
            self._report_at = None


@dataclass
class _Pipe:
    fd: int  # the read end; -1 once closed
    model: str
    stream: OutputStream


class WorkerOutput:
    """The capture pipes of all workers: opened at spawn, read when the poller says so,
    drained and closed when the worker is reaped. Never raises for a pipe's sake: a read
    error is logged and that pipe dropped."""

    def __init__(self) -> None:
        self._poller: zmq.Poller | None = None
        self._pipes: dict[str, _Pipe] = {}
        self._by_fd: dict[int, _Pipe] = {}

    def attach(self, poller: zmq.Poller) -> None:
        self._poller = poller
        for fd in self._by_fd:
            poller.register(fd, zmq.POLLIN)

    def open(self, worker_id: str, model: str, now: float) -> int:
        """A pipe for this worker; returns the write end, for the child's stdout and stderr.
        The caller closes it once the child is started (or failed to start), so that the
        read end sees the end of the stream when the worker exits."""
        self.finish(worker_id, now)  # never two pipes for one worker id
        read_fd, write_fd = os.pipe()  # both close-on-exec: no other worker inherits them
        os.set_blocking(read_fd, False)
        with contextlib.suppress(OSError, AttributeError):  # not Linux, or over a limit
            fcntl.fcntl(write_fd, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
        pipe = _Pipe(read_fd, model, OutputStream(worker_id, now))
        self._pipes[worker_id] = pipe
        self._by_fd[read_fd] = pipe
        if self._poller is not None:
            self._poller.register(read_fd, zmq.POLLIN)
        return write_fd

    def readable(self, ready: Container[Any]) -> list[int]:
        """The pipes the poller found readable (``ready``: what it returned)."""
        return [fd for fd in self._by_fd if fd in ready]

    def read(self, ready: Container[Any], now: float) -> None:
        """Read the pipes the poller found readable (``ready``: what it returned)."""
        for fd in self.readable(ready):
            if fd in self._by_fd:  # an earlier read in this turn may have closed it
                self._read(self._by_fd[fd], READS_PER_TURN, now)

    def tick(self, now: float) -> None:
        for pipe in self._pipes.values():
            self._write(pipe, pipe.stream.tick(now))

    def finish(self, worker_id: str, now: float) -> None:
        """The worker is gone: what is left in its pipe, then the pipe closed."""
        pipe = self._pipes.pop(worker_id, None)
        if pipe is None:
            return
        if pipe.fd >= 0:
            self._read(pipe, FINAL_READS, now)
            self._close(pipe)
        self._write(pipe, pipe.stream.finish(now))

    def finish_all(self, now: float) -> None:
        for worker_id in list(self._pipes):
            self.finish(worker_id, now)

    def _read(self, pipe: _Pipe, reads: int, now: float) -> None:
        for _ in range(reads):
            try:
                data = os.read(pipe.fd, CHUNK)
            except BlockingIOError:
                return
            except OSError as exc:
                log.error("worker_output_failed", worker=pipe.stream.worker_id,
                          model=pipe.model, error=f"{type(exc).__name__}: {exc}")
                self._close(pipe)
                return
            if not data:  # every writer has closed it: the worker has exited
                self._close(pipe)  # (or the poller would report it readable every turn)
                return
            self._write(pipe, pipe.stream.feed(data, now))

    def _close(self, pipe: _Pipe) -> None:
        if pipe.fd < 0:
            return
        if self._poller is not None:
            with contextlib.suppress(KeyError):
                self._poller.unregister(pipe.fd)
        self._by_fd.pop(pipe.fd, None)
        with contextlib.suppress(OSError):  # closed already (EBADF): nothing to release
            os.close(pipe.fd)
        pipe.fd = -1

    @staticmethod
    def _write(pipe: _Pipe, records: list[Record]) -> None:
        worker, model = pipe.stream.worker_id, pipe.model
        for record in records:
            if isinstance(record, Passthrough):
                logs.write_line(record.text)
            elif isinstance(record, Text):
                extra: dict[str, Any] = {}
                if record.truncated:
                    extra = {"truncated": True, "line_bytes": record.size}
                if record.tail:
                    extra["held_back"] = True
                getattr(log, record.level)("worker_output", worker=worker, model=model,
                                           line=record.line, **extra)
            else:
                log.warning("worker_output_suppressed", worker=worker, model=model,
                            dropped=record.dropped, limit=f"{RATE:g} lines/s, burst {BURST}")
