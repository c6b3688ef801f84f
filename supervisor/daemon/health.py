"""Liveness and readiness, as `/livez`, `/readyz` and `status --ready` answer them.

The HTTP probes (daemon/listener.py) run on the metrics listener's threads and never call
into the main loop: they read what the loop last published here. The loop publishes the
time of every completed turn (one float), a readiness report at its metrics cadence (at
most a second old) and, at once, that a drain has begun. A loop that wedges stops
publishing, and the probes say so after LIVENESS_TIMEOUT.

The readiness rule itself is supervisor/core/readiness.py's, one function for all: the CLI
applies it to the status endpoint's report, the probe to the published one, the HTTP fronts
to what the `models` reply carries.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from urllib.parse import parse_qs

from supervisor.core.readiness import MAX_MODELS, NAME_SHOWN, Report, not_ready_reason, shown

__all__ = ["LIVENESS_TIMEOUT", "MAX_MODELS", "NAME_SHOWN", "PATHS", "Health",
           "not_ready_reason"]

# /livez (and /readyz) fail once the main loop has not completed a turn for this long
# (seconds). An idle loop completes one at least every MAX_SLEEP (0.5 s, daemon.py); a turn
# over STALL (1 s) is already logged as a stall: 10 s is a loop that is stuck, not a slow
# one, and a third of the systemd unit's WatchdogSec (30 s), which catches the same fault.
LIVENESS_TIMEOUT = 10.0
PATHS = ("/livez", "/readyz")


class Health:
    """What the loop last published; read from other threads (each field is replaced
    whole, never changed in place, so a reader sees one publication or the next)."""

    def __init__(self, now: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.turned_at = now  # start-up counts as a turn: the loop has not had its chance
        self.report: Report = {"serving": False, "ready": False, "stopping": False,
                               "models": {}}
        self.stopping = False

    def turned(self, now: float) -> None:
        """The main loop completed a turn (called at the end of every one)."""
        self.turned_at = now

    def publish(self, report: Report) -> None:
        self.report = report

    def stop(self) -> None:
        """A drain has begun: not ready from now on, whatever the last report said."""
        self.stopping = True

    def answer(self, path: str, query: str) -> tuple[int, str]:
        """(HTTP status, one line) for a probe path in PATHS and its query string."""
        query = "&".join(field for field in query.split("&") if field)  # `?model=m&` is fine
        try:
            params = parse_qs(query, keep_blank_values=True, strict_parsing=bool(query),
                              max_num_fields=MAX_MODELS)
        except ValueError:  # a field without "=", or more than MAX_MODELS of them
            return 400, (f"bad query {shown(query)}: {path} takes "
                         + (f"model=NAME, at most {MAX_MODELS} times" if path == "/readyz"
                            else "none"))
        allowed = ("model",) if path == "/readyz" else ()
        unknown = sorted(k for k in params if k not in allowed)
        if unknown:
            return 400, (f"unknown parameter {shown(unknown[0])}: {path} takes "
                         + ("model=NAME (repeatable)" if allowed else "none"))
        silent = self.clock() - self.turned_at
        if silent > LIVENESS_TIMEOUT:
            return 503, (f"not alive: the main loop has not completed a turn for {silent:.1f}s "
                         f"(bound {LIVENESS_TIMEOUT:g}s)")
        if path == "/livez":
            return 200, "alive"
        report = self.report
        if self.stopping:
            report = {**report, "stopping": True}
        reason = not_ready_reason(report, params.get("model"), errors=False)
        return (200, "ready") if reason is None else (503, f"not ready: {reason}")
