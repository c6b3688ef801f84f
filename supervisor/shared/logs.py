"""Structured logging for the supervisor and its workers: one event name, flat fields.

Console rendering on a terminal, JSON lines otherwise (journald, files, pipes)."""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
          "error": logging.ERROR}


def configure(level: str = "info", fmt: str = "auto", **bound: Any) -> None:
    """Set up structlog once per process; ``bound`` fields go on every event."""
    renderer: Any = (structlog.dev.ConsoleRenderer(colors=True) if renders_console(fmt)
                     else structlog.processors.JSONRenderer())
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(LEVELS.get(level, logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
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
    print(line, file=sys.stderr, flush=True)


def get(name: str) -> Any:
    """The logger of module ``name`` (pass ``__name__``): every event it logs says where it
    came from in a ``module`` field, so the name always follows the file. Lazy: the field is
    bound when the logger is first used, after configure() (a logger bound at import would
    keep structlog's default console output)."""
    return structlog.get_logger(module=name)
