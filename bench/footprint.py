"""Benchmark 6: the supervisor's own footprint with 8 workers.

RSS at start, after as many tiny jobs as fit in ``--seconds`` (default 600), and CPU while
idle. Targets: <= 80 MB, <= +5 MB growth, idle CPU <= 1 %.

    python -m bench.footprint [--seconds 600] [--quick]
"""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from bench.common import write
from supervisor.client import Client
from supervisor.testing import start_supervisor

MB = 1024**2


def load(endpoint: str, seconds: float, counter: list[int]) -> None:
    x = {"x": np.ones((1, 4), np.float32)}
    deadline = time.monotonic() + seconds
    with Client(endpoint, timeout=30) as client:
        while time.monotonic() < deadline:
            client.infer("echo", x)
            counter[0] += 1


def run(seconds: float, idle_seconds: float, out: Path | None = None) -> dict[str, Any]:
    # The product's default poll interval (the test harness polls 5x as often).
    sup = start_supervisor({"supervisor": {"poll_interval": "1s"},
                            "models": {"echo": {"handler": "worker.handlers:echo",
                                                "workers": 8}}})
    try:
        sup.wait_ready()
        proc = psutil.Process(sup.process.pid)
        time.sleep(2)
        start_rss = proc.memory_info().rss
        before = proc.cpu_times()
        time.sleep(idle_seconds)
        after = proc.cpu_times()
        idle_cpu = (after.user + after.system - before.user - before.system) / idle_seconds
        counters = [[0] for _ in range(4)]
        threads = [threading.Thread(target=load, args=(sup.endpoint, seconds, c))
                   for c in counters]
        for t in threads:
            t.start()
        peak = start_rss
        while any(t.is_alive() for t in threads):
            peak = max(peak, proc.memory_info().rss)
            time.sleep(1)
        time.sleep(2)
        end_rss = proc.memory_info().rss
    finally:
        sup.stop()
    jobs = sum(c[0] for c in counters)
    result = {"workers": 8, "load_seconds": seconds, "jobs": jobs,
              "rss_start_mb": round(start_rss / MB, 1), "rss_end_mb": round(end_rss / MB, 1),
              "rss_peak_mb": round(peak / MB, 1),
              "rss_growth_mb": round((end_rss - start_rss) / MB, 2),
              "idle_cpu_percent": round(100 * idle_cpu, 2),
              "targets": {"rss_mb": 80, "growth_mb": 5, "idle_cpu_percent": 1}}
    write("footprint", result, [
        ["8 workers", "RSS start", "RSS after", "growth", "idle CPU", "jobs"],
        ["tfsupervisor", f"{result['rss_start_mb']} MB", f"{result['rss_end_mb']} MB",
         f"{result['rss_growth_mb']} MB", f"{result['idle_cpu_percent']} %", jobs],
        ["target", "<= 80 MB", "", "<= +5 MB", "<= 1 %", ""]], out,
        f"Idle CPU over {idle_seconds:g} s with 8 ready workers (heartbeats every 1 s, polls "
        f"every 1 s: the defaults); then tiny echo jobs from 4 client threads for "
        f"{seconds:g} s.")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    print(run(3 if args.quick else args.seconds, 2 if args.quick else 30, args.out))


if __name__ == "__main__":
    main()
