"""The daemon's own resources as the outside sees them: log lines it could not write and its
file descriptors (daemon/descriptors.py), in `status` and in metrics."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from supervisor.config import fingerprint
from supervisor.daemon.descriptors import Gate
from supervisor.shared import logs


class Resources(Collector):
    """Read at `status` and at scrape time: nothing is kept here that could drift."""

    def __init__(self, gate: Gate) -> None:
        self.gate = gate

    def facts(self) -> dict[str, Any]:
        sink = logs.sink()
        return {"log_lines_dropped": sink.dropped, "log_error": sink.last_error,
                "descriptors": self.gate.facts(),
                "code_bounded": fingerprint.bounded()}

    def collect(self) -> Iterable[Metric]:
        dropped = CounterMetricFamily(
            "tfsupervisor_log_lines_dropped", "Log lines the supervisor could not write (a "
            "full disk, a closed pipe, an I/O error): dropped, never retried.")
        dropped.add_metric([], logs.sink().dropped)
        gate, counts = self.gate, self.gate.counts
        connections = GaugeMetricFamily(
            "tfsupervisor_client_connections", "Client connections open on the frontend and "
            "control endpoints.", value=counts.connections)
        accepting = GaugeMetricFamily(
            "tfsupervisor_accepting_connections", "0 while new client connections are paused "
            "because descriptors run short (open >= limit - reserve).",
            value=0 if counts.paused else 1)
        reserve = GaugeMetricFamily(
            "tfsupervisor_descriptor_reserve", "Descriptors kept for the supervisor's own "
            "work, out of tfsupervisor_process_max_fds.", value=gate.reserve)
        pauses = CounterMetricFamily(
            "tfsupervisor_connection_pauses", "Times new client connections were paused for "
            "lack of descriptors.", value=counts.pauses)
        return [dropped, connections, accepting, reserve, pauses]
