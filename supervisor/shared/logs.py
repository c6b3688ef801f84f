"""Structured logging for the supervisor and its workers: one event name, flat fields.

Console rendering on a terminal, JSON lines otherwise (journald, files, pipes).

A log line that cannot be written (a full disk, a pipe whose reader went away or stopped
reading, an I/O error) is dropped and counted, never raised into the caller and never waited
for: the daemon outlives its log output. The count is told on the next line that gets
through, in `status` and in metrics.
"""

from __future__ import annotations

import datetime
import errno
import logging
import os
import select
import socket
import stat
import sys
import threading
from collections.abc import Callable
from typing import Any, TextIO

import structlog

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
          "error": logging.ERROR}


Render = Callable[[Any, str, dict[str, Any]], str]


class Writer:
    """Writes to one descriptor without ever blocking, leaving the descriptor's own flags
    alone: a pipe or socket may be shared with other processes (a shell's pipeline,
    journald's stream socket) that expect it blocking.

    A pipe is reopened through /proc as an open file description of our own, which is made
    non-blocking; a socket is sent to with MSG_DONTWAIT on a duplicate. A reader that stops
    reading then costs an EAGAIN (a dropped line), never a frozen loop. A file or a terminal
    is written as it is (a write to them does not wait on another process)."""

    def __init__(self, fd: int) -> None:
        info = os.fstat(fd)
        self.key = (fd, info.st_dev, info.st_ino)
        self._own: int | None = None
        self._socket: socket.socket | None = None
        self._fd = fd
        self._poll = False  # a pipe of which no descriptor of our own could be had
        if stat.S_ISFIFO(info.st_mode):
            try:
                self._own = os.open(f"/proc/self/fd/{fd}",
                                    os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError:  # no /proc, or a FIFO with no reader: polled before each write
                self._poll = True
        elif stat.S_ISSOCK(info.st_mode):
            self._socket = socket.socket(fileno=os.dup(fd))

    def write(self, data: bytes) -> int:
        """Some of ``data`` written (at least a byte), or OSError (EAGAIN when it would wait)."""
        if self._socket is not None:
            return self._socket.send(data, socket.MSG_DONTWAIT)
        if self._own is not None:
            return os.write(self._own, data)
        if self._poll:  # writable means a PIPE_BUF write fits: never more at once, never unasked
            if not select.select([], [self._fd], [], 0)[1]:
                raise BlockingIOError(errno.EAGAIN, os.strerror(errno.EAGAIN))
            return os.write(self._fd, data[:select.PIPE_BUF])
        return os.write(self._fd, data)

    def close(self) -> None:
        if self._own is not None:
            os.close(self._own)
        if self._socket is not None:
            self._socket.close()


class Sink:
    """The log stream, written so that no failure reaches the code that logs.

    Lines go straight to the stream's descriptor with os.write (no Python buffer that would
    keep a failed line and write it again before every later one); a stream without a
    descriptor (a test's capture) is written as a file. Each line is tried once: an OSError
    (ENOSPC, EPIPE, EIO, EAGAIN from a pipe or socket nobody reads) drops the rest of it.
    """

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream  # None: sys.stderr as it is at each write (as print does)
        self.dropped = 0  # lines lost since the process started
        self.last_error: str | None = None  # why the last one was lost
        self.untold = 0  # lost since the last line that got through
        self.torn = False  # a line was cut short: the next one starts on a fresh line
        self.render: Render | None = None  # renders the notice of lines lost
        self._writer: Writer | None = None  # the current descriptor's, rebuilt when it changes
        self._lock = threading.Lock()  # lines from several threads, each whole or dropped

    def write(self, line: str) -> None:
        with self._lock:
            self._write(line)

    def _write(self, line: str) -> None:
        if self.untold and self.render is not None:
            notice = self.render(None, "warning", {
                "event": "log_lines_dropped", "count": self.untold, "error": self.last_error,
                "level": "warning", "timestamp": _now(),
                **structlog.contextvars.get_contextvars()})
            if not self._put(notice):
                self._lost()
                return
            self.untold = 0
        if not self._put(line):
            self._lost()

    def _lost(self) -> None:
        self.dropped += 1
        self.untold += 1

    def _put(self, line: str) -> bool:
        text = ("\n" if self.torn else "") + line + "\n"
        stream = self.stream or sys.stderr
        try:
            fd = stream.fileno()
        except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation: no descriptor
            fd = None
        data = text.encode("utf-8", "backslashreplace")
        written = 0
        try:
            if fd is None:
                stream.write(text)
                stream.flush()
            writer = None if fd is None else self._writer_for(fd)
            # A short write (a disk filling up) goes on once per bit of progress, never more.
            while writer is not None and written < len(data):
                written += writer.write(data[written:])
        except OSError as exc:
            self.last_error = f"{type(exc).__name__}: {exc}"
            self.torn = self.torn or written > 0
            return False
        self.torn = False
        return True

    def _writer_for(self, fd: int) -> Writer:
        info = os.fstat(fd)
        if self._writer is None or self._writer.key != (fd, info.st_dev, info.st_ino):
            if self._writer is not None:
                self._writer.close()
            self._writer = Writer(fd)
        return self._writer


class SinkLogger:
    """structlog's logger: every level goes to the sink (PrintLogger's methods, made safe)."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink

    def msg(self, message: str) -> None:
        self.sink.write(message)

    log = debug = info = warn = warning = msg
    fatal = failure = err = error = critical = exception = msg


_sink = Sink()


def sink() -> Sink:
    """The process's log sink (its counts of lines dropped)."""
    return _sink


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat().replace("+00:00", "Z")


def configure(level: str = "info", fmt: str = "auto", **bound: Any) -> None:
    """Set up structlog once per process; ``bound`` fields go on every event."""
    renderer: Any = (structlog.dev.ConsoleRenderer(colors=True) if renders_console(fmt)
                     else structlog.processors.JSONRenderer())
    _sink.render = renderer
    sink_logger = SinkLogger(_sink)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(LEVELS.get(level, logging.INFO)),
        logger_factory=lambda *_: sink_logger,
        cache_logger_on_first_use=True,
    )
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(**bound)


def renders_console(fmt: str) -> bool:
    """Whether ``fmt`` (auto, console or json) means console rendering in this process."""
    return sys.stderr.isatty() if fmt == "auto" else fmt == "console"


def write_line(line: str) -> None:
    """One already rendered line to the log stream, as structlog writes its own (flushed, so
    it stays in order with them)."""
    _sink.write(line)


def get(name: str) -> Any:
    """The logger of module ``name`` (pass ``__name__``): every event it logs says where it
    came from in a ``module`` field, so the name always follows the file. Lazy: the field is
    bound when the logger is first used, after configure() (a logger bound at import would
    keep structlog's default console output)."""
    return structlog.get_logger(module=name)
