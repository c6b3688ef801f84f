"""A job as the supervisor holds it, from admission to its one reply.

Leaf module. Rule: imports the standard library only (Frame and Join are typing-only), so
every other core module can use ``Job`` without importing the router that queues it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from supervisor.shared.padding import Join
    from supervisor.shared.protocol import Frame

@dataclass(eq=False)
class Job:
    id: int
    model: str
    envelope: list[Frame]  # the client's routing frames, to send the reply back
    client_job_id: bytes
    inputs: list[dict[str, object]]  # wire specs of the arrays
    arrays: list[Frame]
    received_at: float
    deadline: float | None = None
    nbytes: int = 0  # array bytes: what the queue bound counts
    attempts: int = 0  # workers it was sent to, for any cause
    worker: str | None = None
    dispatched_at: float | None = None
    lost_on: list[str] = field(default_factory=list)  # workers lost while holding it
    solo: bool = False  # was in a batch whose worker died: never batched again
    answered: bool = False  # set by Router.answer, the one exit: no longer anywhere
    # What a batch mate must match (supervisor/shared/padding.py: padded axes at their bucket);
    # None: the plain layout (names, dtypes, shapes past the batch dimension).
    key: tuple[Any, ...] | None = None
    # A padded model's: by what it rides, padded up, in a batch of longer jobs (``Join``);
    # None: never.
    joins: Join | None = None
    # The batch dimension all its arrays share (supervisor/shared/arrays.py batch_rows, set by
    # admission from the parsed specs); None: there is none (no arrays, a 0-d array, arrays
    # that disagree), and the job is never batched with another.
    rows: int | None = None

    def expired(self, now: float) -> bool:
        return self.deadline is not None and now >= self.deadline
