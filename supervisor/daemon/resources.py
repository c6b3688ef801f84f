"""The daemon's own resources as the outside sees them: log lines it could not write (and,
with daemon/descriptors.py, its file descriptors), in `status` and in metrics."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from supervisor.shared import logs


class Resources(Collector):
    """Read at `status` and at scrape time: nothing is kept here that could drift."""

    def facts(self) -> dict[str, Any]:
        sink = logs.sink()
        return {"log_lines_dropped": sink.dropped, "log_error": sink.last_error}

    def collect(self) -> Iterable[Metric]:
        dropped = CounterMetricFamily(
            "tfsupervisor_log_lines_dropped", "Log lines the supervisor could not write (a "
            "full disk, a closed pipe, an I/O error): dropped, never retried.")
        dropped.add_metric([], logs.sink().dropped)
        return [dropped]
