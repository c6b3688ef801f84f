"""Memory readings of real process trees."""

from __future__ import annotations

import subprocess
import time

import psutil

from supervisor.daemon.sampling import Descendants, read_memory


def test_descendants_are_found_and_counted() -> None:
    root = subprocess.Popen(["sh", "-c", "sleep 30 & sleep 30 & wait"])
    try:
        for _ in range(100):  # until both children exist
            if len(psutil.Process(root.pid).children()) == 2:
                break
            psutil.wait_procs([], timeout=0.05)
        tree = Descendants()
        tree.refresh([root.pid], now=0.0)
        children = tree.of(root.pid)
        assert len(children) == 2
        alone = read_memory(root.pid, "rss")
        together = read_memory(root.pid, "rss", children)
        assert alone is not None and together is not None and together > alone
        assert read_memory(root.pid, "uss") is not None
        tree.refresh([root.pid], now=1.0)  # not due again yet: the scan is not repeated
        assert tree.next_scan == 30.0
    finally:
        for child in psutil.Process(root.pid).children(recursive=True):
            child.kill()
        root.kill()
        root.wait()
    assert read_memory(root.pid, "rss") is None  # gone


def test_rss_is_the_figure_psutil_reports() -> None:
    proc = subprocess.Popen(["sleep", "30"])
    try:
        time.sleep(0.3)  # past exec: a sleeping process's memory holds still
        assert read_memory(proc.pid, "rss") == psutil.Process(proc.pid).memory_info().rss
    finally:
        proc.kill()
        proc.wait()
