"""Leaking workers under load in a memory cgroup too small for them all plus a replacement.

An operator's trial, run for minutes: one model of three workers that
leak 64 KiB a job, four clients, a cgroup v1 limit of 300 MiB (needs root and
/sys/fs/cgroup/memory). Counted: jobs answered and failed, kernel OOM kills (the cgroup's
counter), recycles by reason, recycles that started their replacement first and those that
drained first, the cgroup's peak usage against its limit.

``--scenario`` picks another trial: ``rate`` is the fast leak of issue 46 (three workers leaking
20 MiB a job, ~130 MiB/s together, in a 1.5 GiB limit with ``max_memory`` 700 MiB and a 0.5 s
poll: a default kill buffer of one poll's growth); ``rate-fast`` the same leak about twice as
fast; ``rate-nosurge`` the first with ``surge: false``.

``--code DIR`` runs the supervisor from another checkout as well (e.g. a worktree of an
earlier commit), one after the other in fresh cgroups, so that before and after are in one
results file.

    python -m bench.container_budget [--minutes 3] [--scenario rate] [--code ../old-checkout]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.cgroups import memory_cgroup, oom_kills, read, wrapper
from bench.common import write
from supervisor.client import Client, JobError

MIB = 1024**2
LIMIT = 300 * MIB
CLIENTS = 4
CONFIG: dict[str, Any] = {
    "supervisor": {"poll_interval": "0.1s"},
    "models": {"m": {"handler": "worker.handlers:leak", "workers": 3,
                     "options": {"bytes_per_job": 64 * 1024, "delay": 0.005},
                     "policy": {"max_memory": "120MiB", "kill_memory": "160MiB",
                                "min_lifetime": 0, "max_attempts": 1}}}}
RATE: dict[str, Any] = {
    "supervisor": {"poll_interval": "0.5s"},
    "models": {"m": {"handler": "worker.handlers:leak", "workers": 3,
                     "options": {"bytes_per_job": 20 * MIB, "delay": 0.4},
                     "policy": {"max_memory": "700MiB", "min_lifetime": 0,
                                "max_attempts": 1}}}}


def _variant(config: dict[str, Any], delay: float | None = None,
             surge: bool | None = None) -> dict[str, Any]:
    made = copy.deepcopy(config)
    model = made["models"]["m"]
    if delay is not None:
        model["options"]["delay"] = delay
    if surge is not None:
        model["policy"]["surge"] = surge
    return made


# name: (config, cgroup limit, clients, what it is)
SCENARIOS: dict[str, tuple[dict[str, Any], int, int, str]] = {
    "leak64k": (CONFIG, LIMIT, CLIENTS, "Three leaking workers (64 KiB a job) under four "
                "clients in a 300 MiB cgroup v1 limit; max_memory 120 MiB each."),
    "rate": (RATE, 1536 * MIB, 4, "Three workers leaking 20 MiB a job (~130 MiB/s together) "
             "under four clients in a 1.5 GiB cgroup v1 limit; max_memory 700 MiB, 0.5 s poll, "
             "no min_available_memory."),
    "rate-fast": (_variant(RATE, delay=0.15), 1536 * MIB, 4, "As rate, the leak about twice "
                  "as fast."),
    "rate-nosurge": (_variant(RATE, surge=False), 1536 * MIB, 4, "As rate, surge: false."),
}


def run(code: Path, minutes: float, scenario: str = "leak64k") -> dict[str, Any]:
    from supervisor.testing import start_supervisor

    config, limit, clients, _ = SCENARIOS[scenario]
    with memory_cgroup(limit) as cgroup:
        cwd = os.getcwd()
        os.chdir(code)  # `python -m supervisor` imports the checkout it runs in
        try:
            sup = start_supervisor(config, wrapper=wrapper(cgroup),
                                   env={"PYTHONPATH": str(code)})
        finally:
            os.chdir(cwd)
        try:
            sup.wait_ready(120)
            answered, failed = [0], [0]
            stop = threading.Event()

            def load() -> None:
                with Client(sup.endpoint, timeout=30.0) as client:
                    while not stop.is_set():
                        try:
                            client.infer("m", {"x": np.ones((1, 4), np.float32)})
                            answered[0] += 1
                        except JobError:
                            failed[0] += 1

            threads = [threading.Thread(target=load) for _ in range(clients)]
            started = time.monotonic()
            for thread in threads:
                thread.start()
            time.sleep(minutes * 60)  # a bench measures a duration; no test waits on this
            stop.set()
            for thread in threads:
                thread.join(60)
            seconds = time.monotonic() - started
            status = sup.status()
            events = [json.loads(line) for line in sup.log().splitlines()
                      if line.startswith("{")]
        finally:
            sup.stop()
        recycles = [e for e in events if e.get("event") == "worker_recycling"]
        return {
            "scenario": scenario, "code": str(code), "commit": _commit(code),
            "seconds": round(seconds),
            "answered": answered[0],
            "failed": failed[0], "kernel_oom_kills": oom_kills(cgroup),
            "peak_mib": round(read(cgroup, "memory.max_usage_in_bytes") / MIB, 1),
            "limit_mib": limit // MIB,
            "failcnt": read(cgroup, "memory.failcnt"),
            "recycles": status["models"]["m"]["recycles"],
            "exits": status["models"]["m"]["exits"],
            "replacement_first": sum(1 for e in recycles if e.get("replacement_first")),
            "drained_first": sum(1 for e in recycles if "room" in e
                                 and not e["replacement_first"]),
            "drained_early_for_room": sum(1 for e in events
                                          if e.get("event") == "worker_draining_first"),
        }


def _commit(code: Path) -> str:
    found = subprocess.run(["git", "-C", str(code), "rev-parse", "--short", "HEAD"],
                           capture_output=True, text=True, check=False)
    return found.stdout.strip() or code.name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), action="append",
                        help="the trial(s) to run (repeatable; default leak64k)")
    parser.add_argument("--out", default="container_budget",
                        help="the results file's name under bench/results/")
    parser.add_argument("--code", type=Path, action="append", default=[],
                        help="another checkout to run the supervisor from (repeatable)")
    args = parser.parse_args()
    here = Path(__file__).resolve().parent.parent
    scenarios = args.scenario or ["leak64k"]
    runs = [run(path.resolve(), args.minutes, scenario) for scenario in scenarios
            for path in [*args.code, here]]
    table = [["scenario", "commit", "seconds", "answered", "failed", "kernel OOM kills",
              "limit hits (failcnt)", "killed by the supervisor", "peak / limit MiB",
              "recycles", "replacement first", "drained first (no room)",
              "drained early (pressure)"]]
    for r in runs:
        table.append([r.get("scenario", "leak64k"), r["commit"], r["seconds"], r["answered"],
                      r["failed"], r["kernel_oom_kills"], r.get("failcnt"),
                      r["exits"].get("killed_over_limit", 0),
                      f"{r['peak_mib']} / {r['limit_mib']}",
                      ", ".join(f"{k}={v}" for k, v in sorted(r["recycles"].items())),
                      r["replacement_first"], r["drained_first"],
                      r["drained_early_for_room"]])
    path = write(args.out, {"runs": runs, "scenarios": {
        name: {"config": SCENARIOS[name][0], "limit": SCENARIOS[name][1],
               "clients": SCENARIOS[name][2]} for name in scenarios}},
        table, notes=" ".join(f"{name}: {SCENARIOS[name][3]}" for name in scenarios))
    print(path.read_text())


if __name__ == "__main__":
    sys.exit(main())
