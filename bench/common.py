"""Shared pieces of the benchmarks: percentiles, machine description, results files."""

from __future__ import annotations

import json
import os
import platform
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from supervisor.testing import short_tmpdir

RESULTS = Path(__file__).resolve().parent / "results"


def percentiles(latencies: list[float], qs: tuple[float, ...] = (50, 99), digits: int = 3,
                mean: bool = True) -> dict[str, float | None]:
    """Percentiles ``qs`` (``p50_ms``, ...) and, with ``mean``, ``mean_ms``, of latencies in
    seconds, in milliseconds rounded to ``digits``; None each when there are none."""
    keys = [f"p{q:g}_ms" for q in qs] + (["mean_ms"] if mean else [])
    if not latencies:
        return dict.fromkeys(keys)
    values = np.array(latencies) * 1000
    figures = [*np.percentile(values, qs), *([values.mean()] if mean else [])]
    return {key: round(float(v), digits) for key, v in zip(keys, figures, strict=True)}


def cpu(process: psutil.Process) -> float:
    """Seconds of CPU (user + system, every thread) the process has used so far."""
    times = process.cpu_times()
    return float(times.user + times.system)


def machine() -> dict[str, Any]:
    return {"python": platform.python_version(), "machine": platform.machine(),
            "cpus": os.cpu_count(), "memory_gib": round(psutil.virtual_memory().total / 2**30),
            "processor": platform.processor() or platform.machine(),
            "date": time.strftime("%Y-%m-%d")}


def write(name: str, result: dict[str, Any], table: list[list[Any]], out: Path | None = None,
          notes: str = "") -> Path:
    """Write NAME.json and NAME.md (a markdown table) under ``out``."""
    out = out or RESULTS
    out.mkdir(parents=True, exist_ok=True)
    payload = {"benchmark": name, **result, "machine": machine()}
    (out / f"{name}.json").write_text(json.dumps(payload, indent=2) + "\n")
    header, *rows = table
    lines = [f"### {name}", "", f"Machine: {payload['machine']['cpus']} CPUs, "
             f"{payload['machine']['memory_gib']} GiB, Python {payload['machine']['python']}, "
             f"{payload['machine']['date']}.", "",
             "| " + " | ".join(str(h) for h in header) + " |",
             "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    if notes:
        lines += ["", notes]
    (out / f"{name}.md").write_text("\n".join(lines) + "\n")
    return out / f"{name}.json"


@contextmanager
def scratch() -> Iterator[Path]:
    """A short directory under /tmp (an ipc socket's path must stay under 107 bytes), removed
    afterwards with whatever the run left there (sockets, a supervisor's config and log)."""
    path = short_tmpdir()
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
