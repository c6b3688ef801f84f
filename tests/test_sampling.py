"""Memory readings of real process trees."""

from __future__ import annotations

import subprocess
import time

import psutil

from supervisor.daemon.sampling import read_memory


def test_rss_is_the_figure_psutil_reports() -> None:
    proc = subprocess.Popen(["sleep", "30"])
    try:
        time.sleep(0.3)  # past exec: a sleeping process's memory holds still
        assert read_memory(proc.pid, "rss") == psutil.Process(proc.pid).memory_info().rss
    finally:
        proc.kill()
        proc.wait()
