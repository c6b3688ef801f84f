"""Why a worker goes: one enum, with what each reason implies declared beside it.

Every recycle, drain, stop and kill names a Reason; events, metrics and `status` print its
value. Questions such as "does this reason say the policy is too tight?" or "may the worker
serve on until its replacement is ready?" are answered here, never by comparing strings
in several files.

Leaf module. Rule: imports the standard library and supervisor.shared.exitcodes only, so
every module that names a reason (core, daemon, CLI) can import it without a circle.
"""

from __future__ import annotations

import signal
from enum import StrEnum

from supervisor.shared.exitcodes import WorkerExit


class Reason(StrEnum):
    # The worker's own memory (policy limits and trends).
    KILL_MEMORY = "kill_memory"
    MAX_MEMORY = "max_memory"
    MAX_VRAM = "max_vram"
    GROWTH_PER_1K_JOBS = "growth_per_1k_jobs"
    GROWTH_PER_HOUR = "growth_per_hour"
    VRAM_GROWTH_PER_1K_JOBS = "vram_growth_per_1k_jobs"
    # Memory pressure: the host's available memory, or the container's limit (its cgroup's).
    HOST_PRESSURE = "host_pressure"
    CONTAINER_PRESSURE = "container_pressure"
    # Lifetime limits.
    MAX_JOBS = "max_jobs"
    MAX_AGE = "max_age"
    # Asked for: by an operator, a reload, the handler itself.
    MANUAL = "manual"
    RELOAD = "reload"
    REQUESTED = "requested"
    SCALE_DOWN = "scale_down"
    REMOVED = "removed"
    # Faults seen by the supervisor.
    HUNG = "hung"
    JOB_TIMEOUT = "job_timeout"
    START_TIMEOUT = "start_timeout"
    STOP_TIMEOUT = "stop_timeout"
    DRAIN_TIMEOUT = "drain_timeout"
    PROTOCOL_ERROR = "protocol_error"
    DIED = "died"  # exited on its own, unasked
    # The supervisor stops.
    SHUTDOWN = "shutdown"

    @property
    def memory(self) -> bool:
        """Caused by the worker's own memory: young recycles for these mean the policy is
        too tight (or the model leaks faster than a worker can warm up)."""
        return self in _MEMORY

    @property
    def over_limit(self) -> bool:
        """A limit already crossed: the worker leaves rotation at once (its replacement is
        started at the same time) instead of serving on while the replacement warms up."""
        return self in (Reason.MAX_MEMORY, Reason.MAX_VRAM, Reason.KILL_MEMORY)

    @property
    def planned(self) -> bool:
        """A soft reason, planned rather than forced: it never takes a model's last ready
        worker out of rotation before its replacement is ready (only a hard limit,
        ``kill_memory`` or the container's memory, may leave a model with none)."""
        return self in _PLANNED

    @property
    def suspects_jobs(self) -> bool:
        """The worker was lost in a way one of its jobs may have caused (it died, hung, spoke
        garbage or blew kill_memory while running them): each of them runs alone from then
        on, so a poison input fails by itself and costs no other job a try."""
        return self in (Reason.DIED, Reason.HUNG, Reason.PROTOCOL_ERROR, Reason.KILL_MEMORY)

    def loss_note(self, max_attempts: int) -> str:
        """Why a job lost on its last try is not tried again, for its worker_crashed reply."""
        if self is Reason.KILL_MEMORY:
            return "each time over kill_memory: possibly an input that needs more memory " \
                   "than kill_memory allows"
        if self.suspects_jobs:
            return "possibly a poison input"
        return f"max_attempts is {max_attempts}"

    @property
    def exit_cause(self) -> ExitCause:
        """What a worker that went for this reason is counted as once it has exited."""
        return _EXIT_CAUSE.get(self, ExitCause.RECYCLED)

    @property
    def urgency(self) -> int:
        """Lower goes first when several workers of a model want to go and only K may."""
        return _URGENCY.index(self) if self in _URGENCY else len(_URGENCY)


_MEMORY = frozenset({Reason.KILL_MEMORY, Reason.MAX_MEMORY, Reason.MAX_VRAM,
                     Reason.GROWTH_PER_1K_JOBS, Reason.GROWTH_PER_HOUR,
                     Reason.VRAM_GROWTH_PER_1K_JOBS})
_PLANNED = frozenset({Reason.MAX_MEMORY, Reason.MAX_VRAM, Reason.GROWTH_PER_1K_JOBS,
                      Reason.GROWTH_PER_HOUR, Reason.VRAM_GROWTH_PER_1K_JOBS, Reason.MAX_JOBS,
                      Reason.MAX_AGE, Reason.MANUAL, Reason.RELOAD, Reason.SCALE_DOWN})
_URGENCY = [Reason.KILL_MEMORY, Reason.CONTAINER_PRESSURE, Reason.MAX_MEMORY, Reason.MAX_VRAM,
            Reason.HOST_PRESSURE,
            Reason.GROWTH_PER_1K_JOBS, Reason.GROWTH_PER_HOUR, Reason.VRAM_GROWTH_PER_1K_JOBS,
            Reason.MANUAL, Reason.RELOAD, Reason.MAX_JOBS, Reason.MAX_AGE]


class ExitCause(StrEnum):
    """Why a worker's process ended: the closed set behind the ``cause`` of exit events,
    ``tfsupervisor_worker_exits_total`` and ``status`` (``exits``, ``last_unexpected_exit``).
    Derived from a Reason and the exit status by ``exit_cause`` alone."""

    RECYCLED = "recycled"  # replaced: policy, operator, reload, or the handler's own request
    STOPPED = "stopped"  # not replaced: scale-down, removed model, shutdown
    BOOT_FAILED = "boot_failed"  # never became ready: could not start, load error, start_timeout
    CRASHED = "crashed"  # exited on its own, unasked, after it was ready
    KILLED_EXTERNALLY = "killed_externally"  # a SIGKILL the supervisor did not send
    OOM_KILLED = "oom_killed"  # that SIGKILL, with the memory cgroup's OOM-kill counter risen
    KILLED_OVER_LIMIT = "killed_over_limit"  # killed for kill_memory (or a limit while loading)
    HUNG = "hung"  # killed: no heartbeat for heartbeat_timeout
    JOB_TIMEOUT = "job_timeout"  # killed: a job ran past job_timeout
    PROTOCOL_ERROR = "protocol_error"  # killed: it sent something undecodable or incomplete

    @property
    def expected(self) -> bool:
        """A way out the supervisor chose and completed: nothing for an operator to look at."""
        return self in (ExitCause.RECYCLED, ExitCause.STOPPED)


_EXIT_CAUSE = {
    Reason.KILL_MEMORY: ExitCause.KILLED_OVER_LIMIT,
    Reason.SCALE_DOWN: ExitCause.STOPPED, Reason.REMOVED: ExitCause.STOPPED,
    Reason.SHUTDOWN: ExitCause.STOPPED,
    Reason.HUNG: ExitCause.HUNG, Reason.JOB_TIMEOUT: ExitCause.JOB_TIMEOUT,
    Reason.PROTOCOL_ERROR: ExitCause.PROTOCOL_ERROR, Reason.START_TIMEOUT: ExitCause.BOOT_FAILED,
    Reason.DIED: ExitCause.CRASHED,
    # Only ever the kill that ends a way out already begun (the worker keeps that reason);
    # alone they would mean a worker stuck in its jobs or its exit.
    Reason.STOP_TIMEOUT: ExitCause.HUNG, Reason.DRAIN_TIMEOUT: ExitCause.HUNG,
}
# Kills that only finish a way out already under way: the worker's own reason says why.
_FOLLOW_UP_KILLS = frozenset({Reason.STOP_TIMEOUT, Reason.DRAIN_TIMEOUT, Reason.SHUTDOWN})


def exit_cause(reason: Reason | None, kill_reason: Reason | None, told: bool, ready: bool,
               code: int) -> ExitCause:
    """Why a worker's process ended. ``reason``: why it was leaving, if it was; ``kill_reason``:
    why the supervisor sent SIGKILL, if it did; ``told``: it had been told to exit (or said it
    would); ``ready``: it had become ready; ``code``: its Popen returncode."""
    if code == -signal.SIGKILL and kill_reason is None:
        return ExitCause.KILLED_EXTERNALLY
    if kill_reason is not None:
        # Killed before the kernel would: the container's limit is a limit too.
        if kill_reason.over_limit or kill_reason is Reason.CONTAINER_PRESSURE:
            return ExitCause.KILLED_OVER_LIMIT
        if not kill_reason.exit_cause.expected and kill_reason not in _FOLLOW_UP_KILLS:
            return kill_reason.exit_cause  # a fault outranks the way out it interrupted
    if not told:  # gone before anyone asked, even if it was already being replaced
        if not ready:
            return ExitCause.BOOT_FAILED
        return ExitCause.RECYCLED if code == WorkerExit.RECYCLE else ExitCause.CRASHED
    return (reason or Reason.DIED).exit_cause


class Hold(StrEnum):
    """Why a recycle the policy wants has not happened yet (status, metrics)."""

    # max_concurrent_recycles of the model's workers are already on their way out.
    MAX_CONCURRENT_RECYCLES = "max_concurrent_recycles"
    # The worker serves on because its replacement failed to start; the model backs off.
    BACKOFF = "backoff"
    # The model's last ready worker serves on until its replacement is ready, and the
    # replacement waits for room in the container's memory beside it.
    NO_ROOM = "no_room"

