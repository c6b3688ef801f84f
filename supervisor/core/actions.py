"""What the socket-free core asks the daemon to do. The daemon performs them in order.

The core decides; the daemon does the I/O (sockets, processes, /proc). A test can drive the
core with events and read these back, with no socket or process anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from supervisor.core.reasons import Reason
from supervisor.shared.protocol import Frame, Message

if TYPE_CHECKING:
    from supervisor.core.jobs import Job


@dataclass(frozen=True)
class Reply:
    """Send ``msg`` to the client behind ``envelope``. ``job`` is the admitted job it
    answers, or None for an answer at admission (refused, or a models request)."""

    envelope: list[Frame]
    msg: Message
    job: Job | None = None
    model: str = "-"  # metric label: a served model's name, never one a client made up


@dataclass(frozen=True)
class SendBatch:
    """Send these jobs to a worker as one JOB message, padded to ``pad_to`` rows; ``rows``:
    theirs before padding."""

    worker_id: str
    jobs: tuple[Job, ...]
    pad_to: int
    now: float
    rows: int


@dataclass(frozen=True)
class Spawn:
    worker_id: str
    model: str


@dataclass(frozen=True)
class Stop:
    """Ask a worker to exit: STOP message, then SIGTERM (the core kills it after a grace)."""

    worker_id: str


@dataclass(frozen=True)
class Kill:
    worker_id: str
    reason: Reason


@dataclass(frozen=True)
class SampleNow:
    """Read these workers' memory now and report it with ``Core.samples`` (a worker that
    just became ready is judged before it takes a job)."""

    worker_ids: tuple[str, ...]


Action = Reply | SendBatch | Spawn | Stop | Kill | SampleNow
