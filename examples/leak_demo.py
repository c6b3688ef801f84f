"""A leak, caught, in about a minute: the daemon serving a leaking model under load, its
`status` every few seconds (memory climbing, then the trend per 1,000 jobs), the recycle
with its reason and suspected cause as the daemon logs it, and the count of jobs sent,
answered and failed. Run from the repository's directory:

    .venv/bin/python examples/leak_demo.py

It starts `tfsupervisor run -c examples/leak.yaml` (TF-free: worker.handlers:leak keeps
160 KiB a job), four client threads sending jobs, and stops it all once both workers have
been replaced and have served on their replacements for a few seconds. Exit status 0 when
the leak was recycled and no job was lost, else 1.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from supervisor.cli.render import render_status
from supervisor.client import Client, JobError, NoReply, control

HERE = Path(__file__).resolve().parent
SHOWN = {"worker_ready", "worker_recycling", "worker_exited", "worker_killed", "worker_died",
         "worker_boot_failed", "model_unavailable"}


class Load(threading.Thread):
    """One client thread sending one-row jobs until told to stop, counting what came back."""

    def __init__(self, client: Client, model: str) -> None:
        super().__init__(daemon=True)
        self.client, self.model = client, model
        self.sent = self.answered = 0
        self.failed: list[str] = []
        self.halt = threading.Event()

    def run(self) -> None:
        x = np.ones((1, 4), dtype=np.float32)
        while not self.halt.is_set():
            self.sent += 1
            try:
                self.client.infer(self.model, {"x": x})
                self.answered += 1
            except (JobError, NoReply) as exc:
                self.failed.append(str(exc))


def events(stream: Any, seen: list[dict[str, Any]], started: float) -> None:
    """The daemon's JSON log: the worker lifecycle events printed as they happen."""
    for line in stream:
        if not line.startswith("{"):
            continue
        event = json.loads(line)
        seen.append(event)
        if event.get("event") in SHOWN:
            keep = ("worker", "reason", "detail", "jobs", "in_flight", "cause", "summary",
                    "exit", "error")
            told = ", ".join(f"{k}={event[k]}" for k in keep if event.get(k) is not None)
            print(f"[{time.monotonic() - started:5.1f}s] {event['event']}: {told}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-c", "--config", default=str(HERE / "leak.yaml"))
    parser.add_argument("--every", type=float, default=3.0, help="seconds between statuses")
    parser.add_argument("--limit", type=float, default=120.0,
                        help="give up (exit 1) after this many seconds")
    args = parser.parse_args(argv)
    started = time.monotonic()
    runtime = Path(args.config).resolve().parent / "run"
    control_endpoint = f"ipc://{runtime}/control.sock"

    def status_of() -> dict[str, Any]:
        return control(control_endpoint, "status", timeout=10)  # type: ignore[no-any-return]

    if _answers(status_of):
        print(f"a supervisor already serves {args.config}: stop it first", file=sys.stderr)
        return 1
    daemon = subprocess.Popen([sys.executable, "-m", "supervisor", "run", "-c", args.config,
                               "--log-format", "json"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: list[dict[str, Any]] = []
    reader = threading.Thread(target=events, args=(daemon.stdout, seen, started), daemon=True)
    reader.start()
    loads: list[Load] = []
    try:
        with Client(f"ipc://{runtime}/frontend.sock", timeout=30) as client:
            while not _ready(status_of):
                if daemon.poll() is not None or time.monotonic() - started > 30:
                    print("the daemon did not start: see the lines above", file=sys.stderr)
                    return 1
                time.sleep(0.2)
            loads = [Load(client, "leaky") for _ in range(4)]
            for load in loads:
                load.start()
            final = watch(args, status_of, started, seen)
            for load in loads:
                load.halt.set()
            for load in loads:
                load.join(60)
    finally:
        for load in loads:
            load.halt.set()
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(60)
        reader.join(5)
    model = final["models"]["leaky"]
    print(f"\n--- final status ---\n{render_status(final)}")
    sent = sum(load.sent for load in loads)
    answered = sum(load.answered for load in loads)
    failed = [f for load in loads for f in load.failed]
    recycles = model["recycles"]
    print(f"\njobs: {sent} sent, {answered} answered, {len(failed)} failed; "
          f"recycles: {recycles or 'none'}; daemon exit {daemon.returncode}")
    for failure in failed[:5]:
        print(f"  failed: {failure}")
    return 0 if recycles and not failed and sent == answered else 1


def watch(args: argparse.Namespace, status_of: Any, started: float,
          seen: list[dict[str, Any]]) -> dict[str, Any]:
    """`status` every ``args.every`` seconds, and at once when the daemon decides a recycle
    (so the trend and cause it acted on are on screen whatever the timing), until both
    workers have been replaced and served on a little (or ``args.limit`` has passed); the
    last status."""
    done_at: float | None = None
    next_status = 0.0
    recycles_shown = 0
    while True:
        recycles = sum(event.get("event") == "worker_recycling" for event in list(seen))
        status: dict[str, Any] = status_of()
        now = time.monotonic()
        if now >= next_status or recycles > recycles_shown:
            print(f"\n--- status at {now - started:.0f}s "
                  f"(tfsupervisor status -c {args.config}) ---")
            print(render_status(status), flush=True)
            next_status = now + args.every
            recycles_shown = recycles
        if done_at is None and _replaced(status["models"]["leaky"]):
            done_at = now + 3.0
        if (done_at is not None and now >= done_at) or now - started > args.limit:
            return status
        time.sleep(0.2)


def _answers(status_of: Any) -> bool:
    try:
        status_of()
    except (JobError, NoReply):
        return False
    return True


def _ready(status_of: Any) -> bool:
    try:
        status = status_of()
    except (JobError, NoReply):
        return False
    workers = status["models"]["leaky"]["workers"]
    return len(workers) == 2 and all(w["state"] == "ready" for w in workers)


def _replaced(model: dict[str, Any]) -> bool:
    """Both workers recycled once (or more), and the pool back to two ready workers."""
    workers = model["workers"]
    return sum(model["recycles"].values()) >= 2 and len(workers) == 2 and \
        all(w["state"] == "ready" and not w.get("recycle_reason") for w in workers)


if __name__ == "__main__":
    sys.exit(main())
