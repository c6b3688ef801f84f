"""Report: each leak reproduction under a real supervisor, the cause its recycle was named,
the evidence figures, and what the probes cost per job (bench/leak_scenarios.py; the same
runs tests/test_diagnosis_live.py asserts on).

    python -m bench.diagnosis
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.common import write
from bench.leak_scenarios import (
    Case,
    config,
    host_cases,
    run,
    save_sequence_model,
    tensorflow_cases,
)
from supervisor.testing import short_tmpdir, start_supervisor

ROOT = Path(__file__).resolve().parent.parent
HEARTBEAT = "1s"  # the default: what the probes cost as users run them
SLOPES = ("memory", "graphs", "shapes", "py_blocks", "native_heap")


def group(cases: list[Case]) -> list[dict[str, Any]]:
    sup = start_supervisor(config(cases, heartbeat=HEARTBEAT))
    try:
        sup.wait_ready()
        found, status, failures = run(sup, cases)
    finally:
        sup.stop()
    out = []
    for case in cases:
        event = found.get(case.name, {})
        worker = status["models"][case.name]["workers"][0]
        out.append({"case": case.name, "reproduction": case.what, "expected": case.cause,
                    "named": event.get("cause", worker.get("suspected_cause")),
                    "recycled": bool(event), "jobs": event.get("jobs", worker["jobs"]),
                    "age_seconds": event.get("age_seconds", worker["age"]),
                    "summary": event.get("summary"), "evidence": event.get("evidence", {}),
                    "failed_jobs": sum(f.startswith(f"{case.name}:") for f in failures)})
    return out


def main() -> None:
    work = short_tmpdir()
    try:
        sequence = save_sequence_model(work / "xla_sm")
        subprocess.run([sys.executable, "-m", "supervisor", "demo-model", str(work / "demo_sm")],
                       check=True, cwd=ROOT)
        rows = group(tensorflow_cases(sequence)) + group(host_cases(work / "demo_sm"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    table = [["case", "reproduction", "expected", "named", "jobs at recycle", *(
        f"{s} /1k" for s in SLOPES), "readings", "probes µs/job", "probes' share of its life",
        "failed jobs"]]
    for r in rows:
        e = r["evidence"]
        table.append([r["case"], r["reproduction"], r["expected"] or "(none)",
                      r["named"] or "(none)", r["jobs"],
                      *(_slope(s, e.get(f"{s}_per_1k_jobs")) for s in SLOPES),
                      e.get("probe_readings", "-"), e.get("probe_cost_per_job_us", "-"),
                      _share(r), r["failed_jobs"]])
    path = write("diagnosis", {"cases": rows}, table, notes=(
        "One supervisor per group (TF causes; host causes and a healthy model), one worker "
        "per model, one client each sending jobs one at a time, 2 cores shared by all; "
        "heartbeat 1 s (the default; the tests use 0.25 s); policy: warm-up 30 jobs and 2 s, "
        "trend window 32 polls of 0.25 s, 2 confirmations, "
        "max_growth_per_1k_jobs 4 MiB. Slopes are the evidence of the first worker_recycling "
        "event (bytes for memory and native heap, counts otherwise); a healthy model is "
        "judged over 2000 jobs and must not be named."))
    print(path.with_suffix(".md").read_text())


def _share(row: dict[str, Any]) -> str:
    """The probes' seconds over the worker's age: their share of a serving thread that is
    never idle here (one client sends the next job as soon as one is answered)."""
    cost = row["evidence"].get("probe_cost_per_job_us")
    if cost is None or not row["age_seconds"]:
        return "-"
    return f"{cost * row['jobs'] / 1e6 / row['age_seconds']:.2%}"


def _slope(name: str, value: float | None) -> str:
    if value is None:
        return "-"
    if name in ("memory", "native_heap"):
        return f"{value / 1e6:+.1f} MB"
    return f"{value:+,.0f}"


if __name__ == "__main__":
    main()
