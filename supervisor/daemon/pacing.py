"""What one caller may take of the loop through the control (status) endpoint.

Raw `status` requests from 6 threads (1,000-1,800 a second, each ~378 µs of the loop) tripled
the jobs' p99 (issue 47). Status is answered from a snapshot (control.py), and each
connection is paced by a token bucket (listener.py's Pace, as /metrics is): CONTROL_RATE
requests a second, a burst of CONTROL_BURST; and all of them together by another
(CONTROL_TOTAL_RATE), since a caller that opens a new connection for each request has a
fresh bucket each time (measured: 1,900 statuses a second that way still doubled the jobs'
p99). A request past that waits its turn (delayed: held here, answered when the buckets
allow, so a closed-loop caller slows to the rate); past HELD_PER_CALLER waiting on one
connection, or MAX_HELD on all, the next is refused at once with an error that says so.
The main loop alone calls this (the scrape thread reads the two counts).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from supervisor.daemon.listener import Pace
from supervisor.shared.wire import Frame

CONTROL_RATE = 20.0  # requests a second per connection (`top` asks once a second)
CONTROL_BURST = 20
CONTROL_TOTAL_RATE = 200.0  # requests a second, all connections together
CONTROL_TOTAL_BURST = 200
HELD_PER_CALLER = 8  # requests one connection may have waiting; past that, refused
MAX_HELD = 1024  # requests waiting, all connections together
SATURATED_FOR = 1.0  # seconds after a request last had to wait: the endpoint is flooded
MAX_CALLERS = 4096  # connections whose buckets are remembered (the oldest idle one goes)


class Pacer(Collector):
    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.buckets: OrderedDict[bytes, Pace] = OrderedDict()
        self.held: dict[bytes, deque[list[Frame]]] = {}
        self.holding = 0  # requests held, all connections together
        self.total = Pace(CONTROL_TOTAL_RATE, CONTROL_TOTAL_BURST, clock)
        self.delayed = 0  # requests that waited their turn
        self.last_delayed = float("-inf")  # when the last one began to wait
        self.refused = 0  # requests refused: too many waiting on their connection

    def admit(self, caller: bytes, frames: list[Frame]) -> str:
        """"now" (answer it), "held" (pacer keeps it: due() gives it back) or "refused"."""
        waiting = self.held.get(caller)
        if waiting is None and self._allow(self._bucket(caller)):
            return "now"
        if self.holding >= MAX_HELD or (waiting is not None and
                                        len(waiting) >= HELD_PER_CALLER):
            self.refused += 1
            return "refused"
        if waiting is None:
            waiting = self.held[caller] = deque()
        waiting.append(frames)
        self.holding += 1
        self.delayed += 1
        self.last_delayed = self.clock()
        return "held"

    def due(self) -> list[list[Frame]]:
        """The held requests whose turn has come, in their order (connections in the
        order they began to wait)."""
        ready = []
        for caller in list(self.held):
            waiting, bucket = self.held[caller], self._bucket(caller)
            while waiting and self._allow(bucket):
                ready.append(waiting.popleft())
                self.holding -= 1
            if not waiting:
                del self.held[caller]
        return ready

    def next_due(self) -> float | None:
        """When the first held request's turn comes (None: nothing held)."""
        if not self.held:
            return None
        first = min(self._bucket(caller).wait() for caller in self.held)
        return self.clock() + max(first, self.total.wait())

    def saturated(self) -> bool:
        """Requests waited their turn in the last second: the endpoint is flooded."""
        return self.clock() - self.last_delayed < SATURATED_FOR

    def facts(self) -> dict[str, Any]:
        return {"delayed": self.delayed, "refused": self.refused,
                "limit": f"{CONTROL_RATE:g}/s per connection, burst {CONTROL_BURST}; "
                f"{CONTROL_TOTAL_RATE:g}/s in all"}

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(
            "tfsupervisor_control_requests_paced", "Requests on the control (status) "
            "endpoint paced per connection: delayed (answered when the connection's turn "
            "came) or refused (too many waiting on it).", labels=["outcome"])
        family.add_metric(["delayed"], self.delayed)
        family.add_metric(["refused"], self.refused)
        return [family]

    def _allow(self, bucket: Pace) -> bool:
        """Both the connection's bucket and the total have a token: both are taken."""
        if bucket.wait() > 0 or self.total.wait() > 0:
            return False
        return bucket.allow() and self.total.allow()

    def _bucket(self, caller: bytes) -> Pace:
        bucket = self.buckets.get(caller)
        if bucket is None:
            bucket = self.buckets[caller] = Pace(CONTROL_RATE, CONTROL_BURST, self.clock)
            if len(self.buckets) > MAX_CALLERS:
                for old in list(self.buckets)[:len(self.buckets) - MAX_CALLERS]:
                    if old not in self.held:
                        del self.buckets[old]
        else:
            self.buckets.move_to_end(caller)
        return bucket
