"""Why a worker goes: one enum, with what each reason implies declared beside it.

Every recycle, drain, stop and kill names a Reason; events, metrics and `status` print its
value. Questions such as "does this reason say the policy is too tight?" or "may the worker
serve on until its replacement is ready?" are answered here, never by comparing strings
in several files.
"""

from __future__ import annotations

from enum import StrEnum


class Reason(StrEnum):
    # The worker's own memory (policy limits and trends).
    KILL_MEMORY = "kill_memory"
    MAX_MEMORY = "max_memory"
    MAX_VRAM = "max_vram"
    GROWTH_PER_1K_JOBS = "growth_per_1k_jobs"
    GROWTH_PER_HOUR = "growth_per_hour"
    VRAM_GROWTH_PER_1K_JOBS = "vram_growth_per_1k_jobs"
    # The host.
    HOST_PRESSURE = "host_pressure"
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
    def urgency(self) -> int:
        """Lower goes first when several workers of a model want to go and only K may."""
        return _URGENCY.index(self) if self in _URGENCY else len(_URGENCY)


_MEMORY = frozenset({Reason.KILL_MEMORY, Reason.MAX_MEMORY, Reason.MAX_VRAM,
                     Reason.GROWTH_PER_1K_JOBS, Reason.GROWTH_PER_HOUR,
                     Reason.VRAM_GROWTH_PER_1K_JOBS})
_URGENCY = [Reason.KILL_MEMORY, Reason.MAX_MEMORY, Reason.MAX_VRAM, Reason.HOST_PRESSURE,
            Reason.GROWTH_PER_1K_JOBS, Reason.GROWTH_PER_HOUR, Reason.VRAM_GROWTH_PER_1K_JOBS,
            Reason.MANUAL, Reason.RELOAD, Reason.MAX_JOBS, Reason.MAX_AGE]
