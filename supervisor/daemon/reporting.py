"""What the outside sees of the daemon: readiness and the watchdog (systemd), the STATUS=
line, startup progress, Prometheus metrics, the HTTP probes' health (daemon/health.py) and
the job-error summary."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from supervisor.config.keys import SupervisorSection
from supervisor.core.budget import Budget
from supervisor.core.jobs import Job
from supervisor.core.pool import Pool, State
from supervisor.core.readiness import readiness
from supervisor.core.router import Router
from supervisor.daemon import listener
from supervisor.daemon.health import Health
from supervisor.daemon.metrics import Metrics
from supervisor.daemon.notify import Notifier
from supervisor.shared import logs
from supervisor.shared.protocol import OVERLOADED, RESULT, Message

log = logs.get(__name__)

# While starting, say which workers are still warming up, this often (seconds).
STARTUP_PROGRESS = 5.0
# While stopping, every EXTEND_EVERY seconds systemd is asked to wait EXTEND_AHEAD more
# (EXTEND_TIMEOUT_USEC), never past the daemon's own shutdown deadline: a drain longer than
# TimeoutStopSec is not killed half-way while the main loop runs, and a loop that wedges
# stops asking, so systemd kills it at most EXTEND_AHEAD later.
EXTEND_EVERY = 5.0
EXTEND_AHEAD = 15.0


class ErrorSummary:
    """Job errors are counted, and logged as one summary a minute, never one line a job."""

    PERIOD = 60.0

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str], int] = {}
        self.since: float | None = None

    def count(self, model: str, code: str, now: float) -> None:
        self.counts[model, code] = self.counts.get((model, code), 0) + 1
        if self.since is None:
            self.since = now
            self.flush(now, first=True)

    def flush(self, now: float, first: bool = False) -> None:
        """Log what was counted: at the first error, then at most once a period."""
        if not self.counts or self.since is None:
            return
        if not first and now - self.since < self.PERIOD:
            return
        summary = {f"{m}/{c}": n for (m, c), n in sorted(self.counts.items())}
        level = "warning" if any(c == OVERLOADED for _, c in self.counts) else "info"
        getattr(log, level)("job_errors", counts=summary, seconds=round(now - self.since))
        self.counts.clear()
        self.since = now


class Reporter:
    def __init__(self, pool: Pool, router: Router, now: float,
                 budget: Budget | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.pool, self.router, self.budget = pool, router, budget
        self.metrics = Metrics()
        self.health = Health(now, clock)
        self.server: listener.Listener | None = None  # /metrics, /livez, /readyz
        self.notifier = Notifier()
        self.errors = ErrorSummary()
        self.serving = False  # every model has its ready workers (READY=1 sent)
        # The HTTP fronts' facts (daemon/fronts.py), when supervisor.http is on
        self.fronts: Callable[[float], list[dict[str, Any]]] | None = None
        self.next_watchdog = 0.0
        self.next_publish = 0.0
        self.next_progress = now + STARTUP_PROGRESS
        self.next_extend = 0.0

    def report(self, now: float, settings: SupervisorSection, stopping: bool,
               stop_deadline: float | None = None) -> None:
        """Called from the main loop's housekeeping; ``stop_deadline`` is when the shutdown
        under way will be over at the latest (Core.shutdown_deadline)."""
        if self.notifier.watchdog_interval and now >= self.next_watchdog:
            self.notifier.watchdog()  # from the main loop itself: a wedged loop stops pinging
            self.next_watchdog = now + self.notifier.watchdog_interval
        if stop_deadline is not None and now >= self.next_extend:
            self.next_extend = now + EXTEND_EVERY
            usec = round(min(EXTEND_AHEAD, stop_deadline - now) * 1e6)
            if usec > 0:  # past its own deadline the daemon asks for nothing more
                self.notifier.extend_timeout(usec)
        if not self.serving and not stopping and self.ready_enough(settings):
            self.serving = True
            log.info("serving", models={m: len(self.pool.ready(m)) for m in self.pool.models})
            self.notifier.ready(self.summary(now, stopping))
            self.next_publish = now  # /readyz says so now, not at the next publication
        elif not self.serving and now >= self.next_progress:
            self.next_progress = now + STARTUP_PROGRESS
            warming = {w.id: round(now - w.started_at) for w in self.pool.workers.values()
                       if w.state is State.STARTING}
            if warming:
                log.info("warming_up", workers_seconds=warming)
        self.errors.flush(now)
        if now >= self.next_publish:
            self.next_publish = now + min(1.0, settings.poll_interval)
            self.notifier.status(self.summary(now, stopping))
            self.metrics.publish(self.pool, self.router, self.budget)
            self.health.publish(readiness(self.pool, self.serving and not stopping,
                                          self.ready_now(stopping), stopping,
                                          self.fronts(now) if self.fronts else None))

    def serve(self, address: str) -> None:
        """Listen on supervisor.metrics: /metrics, /livez, /readyz."""
        self.server = listener.serve(address, listener.routes(self.metrics.app(), self.health))

    def stopping(self) -> None:
        """A drain has begun: systemd and the probes are told at once."""
        self.notifier.stopping()
        self.health.stop()

    def close(self) -> None:
        """Stop listening and notifying (at exit, and after a start that failed later on)."""
        if self.server is not None:
            self.server.close()
            self.server = None
        self.notifier.close()

    def ready_enough(self, settings: SupervisorSection) -> bool:
        """Start-up: every required model has its ready workers (ready_min_workers, or all).
        A model marked `required: false` that cannot load does not hold back the others."""
        wanted = settings.ready_min_workers
        return all(len(self.pool.ready(m)) >= min(wanted or s.config.workers, s.config.workers)
                   for m, s in self.pool.models.items() if not s.removed and s.config.required)

    def ready_now(self, stopping: bool) -> bool:
        """`status --ready`: past start-up, not stopping, and every required model can take
        a job now (at least one ready worker)."""
        return self.serving and not stopping and all(
            self.pool.ready(m) for m, s in self.pool.models.items()
            if not s.removed and s.config.required)

    def summary(self, now: float, stopping: bool) -> str:
        """One line for systemd's STATUS=: per model ready/configured, warming, queued."""
        parts = []
        for name, state in self.pool.models.items():
            warming = [w for w in self.pool.of_model(name) if w.state is State.STARTING]
            text = f"{name} {len(self.pool.ready(name))}/{state.config.workers} ready"
            if warming:
                oldest = max(now - w.started_at for w in warming)
                text += f", {len(warming)} warming ({oldest:.0f}s)"
            if self.router.queued(name):
                text += f", {self.router.queued(name)} queued"
            if state.unavailable:
                text += ", UNAVAILABLE"
            parts.append(text)
        return ("stopping: " if stopping else "") + "; ".join(parts)

    def reloaded(self, result: dict[str, Any]) -> dict[str, Any]:
        """A reload's outcome (Daemon.reload's answer), counted; the answer is passed on."""
        self.metrics.reloaded(bool(result.get("ok")))
        return result

    def answered(self, job: Job, msg: Message, now: float) -> None:
        """Every job that entered the system, as it leaves it."""
        outcome = "ok" if msg.kind == RESULT else str(msg.header.get("code", "error"))
        self.metrics.job(job.model, outcome, now - job.received_at)
        if outcome != "ok":
            self.errors.count(job.model, outcome, now)

    def refused(self, model_label: str, code: str, now: float) -> None:
        """A request answered at admission."""
        self.metrics.job(model_label, code, None)
        self.errors.count(model_label, code, now)
