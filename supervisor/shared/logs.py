"""Structured logging for the supervisor and its workers: one event name, flat fields.

Console rendering on a terminal, JSON lines otherwise (journald, files, pipes).

A log line that cannot be written (a full disk, a pipe whose reader went away, an I/O
error) is dropped and counted, never raised into the caller: the daemon outlives its log
output. The count is told on the next line that gets through, in `status` and in metrics.
"""

from __future__ import annotations

import datetime
import logging
import os
import sys
from collections.abc import Callable
from typing import Any, TextIO

import structlog

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
          "error": logging.ERROR}


Render = Callable[[Any, str, dict[str, Any]], str]


class Sink:
    """The log stream, written so that no failure reaches the code that logs.

    Lines go straight to the stream's descriptor with os.write (no Python buffer that would
    keep a failed line and write it again before every later one); a stream without a
    descriptor (a test's capture) is written as a file. Each line is tried once: an OSError
    (ENOSPC, EPIPE, EIO, EAGAIN on a non-blocking pipe) drops the rest of it.
    """

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream  # None: sys.stderr as it is at each write (as print does)
        self.dropped = 0  # lines lost since the process started
        self.last_error: str | None = None  # why the last one was lost
        self.untold = 0  # lost since the last line that got through
        self.torn = False  # a line was cut short: the next one starts on a fresh line
        self.render: Render | None = None  # renders the notice of lines lost

    def write(self, line: str) -> None:
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
            # A short write (a disk filling up) goes on once per bit of progress, never more.
            while fd is not None and written < len(data):
                written += os.write(fd, data[written:])
        except OSError as exc:
            self.last_error = f"{type(exc).__name__}: {exc}"
            self.torn = self.torn or written > 0
            return False
        self.torn = False
        return True


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
