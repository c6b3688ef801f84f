"""The HTTP path's metrics, on the daemon's one /metrics.

Fronts are processes: each writes its counters to files in a directory the daemon gives it
(prometheus_client's multiprocess mode, PROMETHEUS_MULTIPROC_DIR, set before this module is
imported), and the daemon's /metrics adds them up (daemon/fronts.py). Run without that
directory (a test), the counters stay in this process.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from supervisor.shared import logs

log = logs.get(__name__)

REQUESTS = Counter("tfsupervisor_http_requests", "HTTP requests answered by the fronts, by "
                   "route template and status code.", ["route", "code"])
LATENCY = Histogram("tfsupervisor_http_request_seconds", "From a request's last byte to its "
                    "answer written, by route template.", ["route"],
                    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                             2.5, 5.0, 10.0, 30.0))
RECEIVED = Counter("tfsupervisor_http_received_bytes", "Request body bytes received.")
SENT = Counter("tfsupervisor_http_sent_bytes", "Response body bytes sent.")
IN_FLIGHT = Gauge("tfsupervisor_http_requests_in_flight", "Requests being answered.",
                  multiprocess_mode="livesum")
CONNECTIONS = Gauge("tfsupervisor_http_connections", "Open HTTP connections.",
                    multiprocess_mode="livesum")


def observe(route: str, status: int, seconds: float, received: int, sent: int) -> None:
    REQUESTS.labels(route, str(status)).inc()
    if route != "-":
        LATENCY.labels(route).observe(seconds)
    RECEIVED.inc(received)
    SENT.inc(sent)


def log_failure(exc: Exception) -> None:
    log.error("http_handler_failed", error=f"{type(exc).__name__}: {exc}", exc_info=exc)
