"""Readiness: the one rule `/readyz`, `status --ready`, the HTTP fronts' `/v2/health/ready`
and `tfsupervisor status` apply, and the fields it reads.

The daemon publishes a report (readiness()) at its metrics cadence and at once when a drain
begins; each reader applies not_ready_reason() to it. Nothing here reads a clock or a socket.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from supervisor.core.pool import Pool

# Most models one readiness question may name; a model name quoted in an answer is cut at
# NAME_SHOWN characters (a probe's answer is one short line, whatever it is asked).
MAX_MODELS = 16
NAME_SHOWN = 64

Report = dict[str, Any]
# Before the loop's first publication: not serving, not ready.
STARTING: Report = {"serving": False, "ready": False, "stopping": False, "models": {}}


def readiness(pool: Pool, serving: bool, ready: bool, stopping: bool,
              fronts: list[dict[str, Any]] | None = None) -> Report:
    """The fields of the status report that not_ready_reason reads (control.py's status
    gives the same ones, with more), nothing that could hold a secret: no error text."""
    report: Report = {"serving": serving, "ready": ready, "stopping": stopping, "models": {
        name: {"required": state.config.required, "removed": state.removed,
               "failing_to_start": state.unavailable,
               "workers": [{"state": w.state.value} for w in pool.of_model(name)]}
        for name, state in pool.models.items()}}
    if fronts is not None:  # the HTTP fronts' states, as `status` gives them
        report["http"] = {"fronts": [{"state": f["state"]} for f in fronts]}
    return report


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
    fronts = (report.get("http") or {}).get("fronts")
    if fronts and not any(f.get("state") == "running" for f in fronts):
        return (f"no HTTP front is running (0 of {len(fronts)}; `tfsupervisor status` says "
                "why they exit)")
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
        return (f"this supervisor does not serve {', '.join(map(shown, unknown))} (it serves "
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


def shown(name: str) -> str:
    return repr(name[:NAME_SHOWN])
