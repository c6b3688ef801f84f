"""The HTTP and gRPC path's metrics, on the daemon's one /metrics.

Fronts are processes: each writes its counters to files in a directory the daemon gives it
(prometheus_client's multiprocess mode, PROMETHEUS_MULTIPROC_DIR, set before this module is
imported), and the daemon's /metrics adds them up (daemon/fronts.py). Run without that
directory (a test), the counters stay in this process.

A request counts into plain integers here, written to those files every FLUSH seconds
(and when the front stops): each write to a file value takes a lock and a getpid(2) system
call, and a request touched seven of them (measured: 7 % of a front's CPU at ~700
requests/s). Scrapes come seconds apart, so a second's delay is never seen.
"""

from __future__ import annotations

import bisect
from collections import Counter as Tally

from prometheus_client import Counter, Gauge, Histogram

from supervisor.shared import logs

log = logs.get(__name__)

FLUSH = 1.0  # seconds between writes of the tallies to the metrics files
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
           30.0)

REQUESTS = Counter("tfsupervisor_http_requests", "HTTP requests answered by the fronts, by "
                   "route template and status code.", ["route", "code"])
LATENCY = Histogram("tfsupervisor_http_request_seconds", "From a request's last byte to its "
                    "answer written, by route template.", ["route"], buckets=BUCKETS)
RECEIVED = Counter("tfsupervisor_http_received_bytes", "Request body bytes received.")
SENT = Counter("tfsupervisor_http_sent_bytes", "Response body bytes sent.")
IN_FLIGHT = Gauge("tfsupervisor_http_requests_in_flight", "Requests being answered.",
                  multiprocess_mode="livesum")
CONNECTIONS = Gauge("tfsupervisor_http_connections", "Open HTTP connections.",
                    multiprocess_mode="livesum")


class Tallies:
    """What happened since the last flush, in plain Python numbers (one process, one
    thread: the front's event loop), and what is under way now."""

    def __init__(self) -> None:
        self.in_flight = self.connections = 0  # now
        self._since()

    def _since(self) -> None:
        self.requests: Tally[tuple[str, str]] = Tally()
        self.latency: dict[str, list[int]] = {}  # per route: a count per bucket, +Inf last
        self.latency_sum: dict[str, float] = {}
        self.received = self.sent = 0

    def observe(self, route: str, status: int, seconds: float, received: int,
                sent: int) -> None:
        self.requests[route, str(status)] += 1
        if route != "-":
            counts = self.latency.get(route)
            if counts is None:
                counts = self.latency[route] = [0] * (len(BUCKETS) + 1)
            counts[bisect.bisect_left(BUCKETS, seconds)] += 1
            self.latency_sum[route] = self.latency_sum.get(route, 0.0) + seconds
        self.received += received
        self.sent += sent

    def flush(self) -> None:
        """Into the metrics files, and count afresh."""
        for (route, code), count in self.requests.items():
            REQUESTS.labels(route, code).inc(count)
        for route, counts in self.latency.items():
            # A histogram keeps one value per bucket (the cumulative counts are made when
            # it is collected) and a sum: each gets this second's total in one write.
            child = LATENCY.labels(route)
            for value, count in zip(child._buckets, counts, strict=True):
                if count:
                    value.inc(count)
            child._sum.inc(self.latency_sum[route])
        if self.received:
            RECEIVED.inc(self.received)
        if self.sent:
            SENT.inc(self.sent)
        IN_FLIGHT.set(self.in_flight)
        CONNECTIONS.set(self.connections)
        self._since()


TALLIES = Tallies()
observe = TALLIES.observe


def log_failure(exc: Exception) -> None:
    log.error("http_handler_failed", error=f"{type(exc).__name__}: {exc}", exc_info=exc)
