"""Liveness and readiness, as `/livez`, `/readyz` and `status --ready` answer them.

The HTTP probes (daemon/listener.py) run on the metrics listener's threads and never call
into the main loop: they read what the loop last published here. The loop publishes the
time of every completed turn (one float), a readiness report at its metrics cadence (at
most a second old) and, at once, that a drain has begun. A loop that wedges stops
publishing, and the probes say so after LIVENESS_TIMEOUT.

The readiness rule itself (not_ready_reason) is one function for both: the CLI applies it
to the status endpoint's report, the probe to the published one, which holds the same
fields.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

if TYPE_CHECKING:
    from supervisor.core.pool import Pool

# /livez (and /readyz) fail once the main loop has not completed a turn for this long
# (seconds). An idle loop completes one at least every MAX_SLEEP (0.5 s, daemon.py); a turn
# over STALL (1 s) is already logged as a stall: 10 s is a loop that is stuck, not a slow
# one, and a third of the systemd unit's WatchdogSec (30 s), which catches the same fault.
LIVENESS_TIMEOUT = 10.0
# Most `model` parameters one /readyz request may name; a model name quoted in an answer is
# cut at NAME_SHOWN characters (a probe's answer is one short line, whatever it is asked).
MAX_MODELS = 16
NAME_SHOWN = 64
PATHS = ("/livez", "/readyz")

Report = dict[str, Any]


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
            return 400, (f"bad query {_shown(query)}: {path} takes "
                         + (f"model=NAME, at most {MAX_MODELS} times" if path == "/readyz"
                            else "none"))
        allowed = ("model",) if path == "/readyz" else ()
        unknown = sorted(k for k in params if k not in allowed)
        if unknown:
            return 400, (f"unknown parameter {_shown(unknown[0])}: {path} takes "
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


def readiness(pool: Pool, serving: bool, ready: bool, stopping: bool) -> Report:
    """The fields of the status report that not_ready_reason reads (control.py's status
    gives the same ones, with more), nothing that could hold a secret: no error text."""
    return {"serving": serving, "ready": ready, "stopping": stopping, "models": {
        name: {"required": state.config.required, "removed": state.removed,
               "failing_to_start": state.unavailable,
               "workers": [{"state": w.state.value} for w in pool.of_model(name)]}
        for name, state in pool.models.items()}}


def not_ready_reason(report: Report, models: list[str] | None,
                     errors: bool = True) -> str | None:
    """Why the daemon is not ready, in one line; None when ready. Ready: the daemon's own
    answer (past start-up, not stopping, every required model has a ready worker), or with
    ``models`` named: past start-up, not stopping, and each of those has a ready worker now,
    required or not. A model the daemon does not serve is not ready: a probe that names it
    fails loudly rather than passing. ``errors``: quote a model's last error (the status
    endpoint's readers may see it; an HTTP probe's may not)."""
    served = report.get("models", {})
    if report.get("stopping"):
        return "the supervisor is stopping (draining: new jobs are answered shutting_down)"
    if not models:
        if report.get("ready"):
            return None
        models = sorted(m for m, s in served.items() if s.get("required", True)
                        and not s.get("removed"))
    elif report.get("serving") and all(
            name in served and any(w.get("state") == "ready" for w in served[name]["workers"])
            for name in models):
        return None
    unknown = [m for m in models if m not in served]
    if unknown:
        return (f"this supervisor does not serve {', '.join(map(_shown, unknown))} (it serves "
                f"{', '.join(sorted(served)) or 'no model'})")
    waiting = [m for m in models
               if not any(w.get("state") == "ready" for w in served[m]["workers"])]
    if waiting:
        return "no ready worker for " + "; ".join(_why_no_worker(m, served[m], errors)
                                                  for m in waiting)
    return "starting: not every required model has had its ready workers yet"


def _why_no_worker(name: str, model: dict[str, Any], errors: bool) -> str:
    states = sorted(w.get("state", "?") for w in model["workers"])
    counts = ", ".join(f"{states.count(s)} {s}" for s in sorted(set(states))) or "no worker"
    if errors and model.get("last_error"):
        counts += f"; last error: {model['last_error']}"
    elif model.get("failing_to_start"):
        counts += "; failing to start: `tfsupervisor status` says why"
    return f"{name!r} ({counts})"


def _shown(name: str) -> str:
    return repr(name[:NAME_SHOWN])
