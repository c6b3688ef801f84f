"""Failover across supervisors, shared by Client and AsyncClient: which endpoint to try next,
and what each outcome of a try means for the job (docs/deployment.md lists the rules).

A job is sent elsewhere at once when it surely did not run where it was sent (no
connection, or answered shutting_down, overloaded or unavailable), and after a dropped
connection only if the client allows it (it may then run twice). A reply that never comes
within the timeout is never retried.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator

from supervisor.client.errors import NoReply
from supervisor.shared import protocol
from supervisor.shared.protocol import ERROR, Message

# Answers that mean the job did not run there: another supervisor may take it at once.
RETRY_ELSEWHERE = frozenset({protocol.SHUTTING_DOWN, protocol.OVERLOADED, protocol.UNAVAILABLE})
# How long an endpoint is passed over after it failed us.
DOWN_SECONDS = 5.0
# How long a send may wait for a connection before that endpoint counts as down.
CONNECT_WAIT = 1.0
# Less time than this left: no new round of connection attempts.
MIN_ROUND = 0.01


class Rotation:
    """Round-robin over a client's endpoints, passing over ones that failed it lately."""

    def __init__(self, endpoints: list[str]) -> None:
        self.endpoints = endpoints
        self._turn = itertools.count()
        self._down: dict[str, float] = {}  # endpoint -> monotonic time it may be tried again

    def pick(self, tried: list[str]) -> str | None:
        """The next endpoint not yet tried for this job: healthy ones first."""
        if len(self.endpoints) == 1:  # the common case, on every call: no lists to build
            return None if self.endpoints[0] in tried else self.endpoints[0]
        start = next(self._turn)
        order = [self.endpoints[(start + i) % len(self.endpoints)]
                 for i in range(len(self.endpoints))]
        now = time.monotonic()
        fresh = [e for e in order if e not in tried]
        healthy = [e for e in fresh if self._down.get(e, 0.0) <= now]
        choices = healthy or fresh
        return choices[0] if choices else None

    def mark_down(self, endpoint: str) -> None:
        self._down[endpoint] = time.monotonic() + DOWN_SECONDS


class NotSent(Exception):
    """No connection to that supervisor: the job never left; safe to send elsewhere."""


class Lost(Exception):
    """The connection dropped while the job was out: it may or may not have run."""


class Attempt:
    """One call's tour of the supervisors."""

    def __init__(self, rotation: Rotation, retry_unanswered: bool, timeout: float,
                 deadline: float | None = None) -> None:
        self.rotation = rotation
        self.retry_unanswered = retry_unanswered
        self.timeout = timeout
        self.deadline = deadline if deadline is not None else time.monotonic() + timeout
        self.started = self.deadline - timeout
        self.tried: list[str] = []
        self.last: Message | None = None  # the latest refusal
        self.unreached = 0  # endpoints of this round with no connection (not_sent)

    def endpoints(self) -> Iterator[str]:
        """Each endpoint once; then, when none could even be reached (no connection: a
        supervisor still starting, say, or a script launched together with it), round
        again until the deadline. Each try waits up to CONNECT_WAIT for a connection, so
        the rounds never spin."""
        while True:
            while (endpoint := self.rotation.pick(self.tried)) is not None:
                self.tried.append(endpoint)
                yield endpoint
            if self.unreached < len(self.tried) or \
                    self.deadline - time.monotonic() < MIN_ROUND:
                return
            self.tried, self.unreached = [], 0

    def not_sent(self, endpoint: str) -> None:
        self.unreached += 1
        self.rotation.mark_down(endpoint)

    def lost(self, endpoint: str) -> None:
        """The connection dropped with the job out: try elsewhere, or raise NoReply."""
        self.rotation.mark_down(endpoint)
        if not self.retry_unanswered:
            raise NoReply(f"the connection to {endpoint} dropped while the job was out; it "
                          "may have run (retry_unanswered is off)")

    def silent(self, endpoint: str) -> NoReply:
        return NoReply(f"no reply from {endpoint} within {self.timeout:g}s: the job was sent, "
                       "so it may have run (or may still)")

    def answered(self, endpoint: str, reply: Message) -> bool:
        """Whether ``reply`` is the job's answer; False for a refusal, to try elsewhere."""
        if reply.kind == ERROR and reply.header.get("code") in RETRY_ELSEWHERE:
            self.rotation.mark_down(endpoint)
            self.last = reply
            return False
        return True

    def outcome(self) -> Message:
        """After every endpoint was tried: the last refusal, or NoReply."""
        if self.last is not None:
            return self.last
        spent = time.monotonic() - self.started
        raise NoReply(f"no supervisor reachable at {', '.join(self.rotation.endpoints)} "
                      f"(no connection in {spent:.2g}s of the {self.timeout:g}s timeout): "
                      "the job was never sent, so it did not run")
