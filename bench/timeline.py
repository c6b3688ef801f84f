"""Benchmark: where the time of a tiny job goes, hop by hop, at one job in flight:
tfsupervisor beside the bare broker, in the same run.

bench/roundtrip.py gives the round trip and each process's CPU; this gives the timeline. Each
process of a run notes on the monotonic clock when it woke with a message and when it had
sent one (bench/timeline_site/sitecustomize.py, ~1 µs an event), and the sequential jobs
line up into segments that add up to the job (p50 over the jobs, µs):

- hops: from the sender's call to send to the receiving process awake with the message
  (the send call, which wakes ZeroMQ's I/O thread, the kernel, the receiver's I/O thread,
  the scheduler); the receiver may wake before the sender's call returns;
- the middle's turns (supervisor or broker: from its wake to its call to send), one for the
  request and one for the answer; the worker's turn between them;
- the client: from its wake with the reply to its next send (reading the reply, making the
  next request).

Each process's send calls are timed too (within their hops, not added to the total).

Same paths as bench/roundtrip.py: the project's Client -> supervisor -> echo worker and back,
against a bare DEALER -> zguide's load-balancing broker -> a bare echo worker, rounds
alternating.

    python -m bench.timeline [--jobs 3000] [--rounds 3] [--quick]
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from array import array
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import write

ROOT = Path(__file__).resolve().parent.parent
SITE = Path(__file__).resolve().parent / "timeline_site"
PATHS = {"bare_broker": "bare broker (bare DEALER, zguide lbbroker, bare echo worker)",
         "tfsupervisor": "tfsupervisor (Client, supervisor, echo worker)"}
# A hop: from the sender's call to send to the receiver awake with the message (the send call,
# which wakes ZeroMQ's I/O thread, the kernel, the receiver's I/O thread and its wake). The
# receiver may wake before the sender's call returns, so a hop starts at the call.
SEGMENTS = ["hop client -> middle", "middle: request turn", "hop middle -> worker",
            "worker: turn", "hop worker -> middle", "middle: answer turn",
            "hop middle -> client", "client: read reply, make next request"]
# How long each process's send calls took (within its hop above, not added to the total).
SENDS = ["client: send call", "middle: send call", "worker: send call"]
# The jobs read, counted from the end (the first ones warm up).
KEPT = 0.8

Event = tuple[str, int, int]


def _after(times: list[int], t: int) -> int | None:
    i = bisect.bisect_right(times, t)
    return times[i] if i < len(times) else None


def segments(client: Sequence[Event], middle: Sequence[Event],
             worker: Sequence[Event]) -> dict[str, list[float]]:
    """Each job's segments in µs, from three processes' events; they add up to its total (a
    client send's start to the next one's). Each next step is the first event of its kind
    after the previous one: a wake (its end), a send (its start). A job whose steps do not
    all fall before the client's next send (a heartbeat or housekeeping in between, the last
    job) is left out."""
    def wakes(events: Sequence[Event]) -> list[int]:
        return sorted(end for kind, _, end in events if kind == "W")

    def sends(events: Sequence[Event]) -> list[int]:
        return sorted(start for kind, start, _ in events if kind == "S")

    c_send, c_wake = sends(client), wakes(client)
    m_wake, m_send, w_wake, w_send = wakes(middle), sends(middle), wakes(worker), sends(worker)
    out: dict[str, list[float]] = {name: [] for name in [*SEGMENTS, "total"]}
    for start, next_start in itertools.pairwise(c_send):
        steps = [start]
        for times in (m_wake, m_send, w_wake, w_send, m_wake, m_send, c_wake):
            step = _after(times, steps[-1])
            if step is None or step > next_start:
                break
            steps.append(step)
        else:
            spans = [b - a for a, b in itertools.pairwise([*steps, next_start])]
            for name, span in zip([*SEGMENTS, "total"], [*spans, next_start - start],
                                  strict=True):
                out[name].append(span / 1000)
    for name, events in zip(SENDS, (client, middle, worker), strict=True):
        out[name] = [(end - begin) / 1000 for kind, begin, end in events if kind == "S"]
    return out


def roles(dumps: list[dict[str, Any]], client_pid: int) -> tuple[list[Event], ...]:
    """(client, middle, worker) events: the client is the process we ran; of the other two,
    the middle sends twice a job, the worker once."""
    client = next(d for d in dumps if d["pid"] == client_pid)
    others = sorted((d for d in dumps if d["pid"] != client_pid),
                    key=lambda d: sum(1 for e in d["events"] if e[0] == "S"))
    if len(others) != 2:
        raise RuntimeError(f"expected a middle and a worker, found {len(others)} other processes")
    worker, middle = others
    return client["events"], middle["events"], worker["events"]


def measure(path: str, jobs: int) -> dict[str, list[float]]:
    """One run of ``path`` (bare_broker or tfsupervisor) in a child process whose every
    process notes its events; the jobs' segments."""
    with tempfile.TemporaryDirectory(prefix="tfs-timeline-") as tmp:
        paths = [str(SITE), str(ROOT), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
        env = {**os.environ, "TFS_TIMELINE_OUT": tmp,
               "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
        # Its own session: a run that hangs is taken down whole, its servers with it.
        child = subprocess.Popen([sys.executable, "-m", "bench.timeline", "--run", path,
                                  "--jobs", str(jobs)], env=env, cwd=ROOT,
                                 start_new_session=True)
        try:
            code = child.wait(timeout=600)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
        if code != 0:
            raise RuntimeError(f"the {path} run failed (exit {code})")
        dumps = [_read(p) for p in Path(tmp).glob("*.json")]
    try:
        found = segments(*roles(dumps, child.pid))
    except RuntimeError as exc:
        raise RuntimeError(f"the {path} run: {exc}") from None
    return {name: spans[len(spans) - int(len(spans) * KEPT):] for name, spans in found.items()}


def _read(path: Path) -> dict[str, Any]:
    """A process's notes (bench/timeline_site): who it is, and its events."""
    found: dict[str, Any] = json.loads(path.read_text())
    slots = array("q", path.with_suffix(".bin").read_bytes())
    found["events"] = [(chr(slots[at]), slots[at + 1], slots[at + 2])
                       for at in range(1, 1 + 3 * slots[0], 3)]
    return found


def _run_path(path: str, jobs: int) -> None:
    from bench import roundtrip  # in the child: its processes carry the instrumentation
    if path == "bare_broker":
        roundtrip.bare_broker(jobs)
    else:
        roundtrip.supervised(jobs)


def run(jobs: int, rounds: int, out: Path | None = None) -> dict[str, Any]:
    spans: dict[str, dict[str, list[float]]] = {p: {} for p in PATHS}
    for _ in range(rounds):
        for path in PATHS:
            for name, values in measure(path, jobs).items():
                spans[path].setdefault(name, []).extend(values)
    p50 = {path: {name: round(statistics.median(v), 1) if v else None
                  for name, v in found.items()} for path, found in spans.items()}
    result = {"jobs": jobs, "rounds": rounds, "p50_us": p50,
              "jobs_lined_up": {path: len(found["total"]) for path, found in spans.items()}}
    table: list[list[Any]] = [["segment (p50, µs)", *PATHS.values(), "difference"]]
    for name in [*SEGMENTS, "total", *SENDS]:
        bare, ours = p50["bare_broker"][name], p50["tfsupervisor"][name]
        gap = round(ours - bare, 1) if ours is not None and bare is not None else ""
        table.append([name, bare, ours, gap])
    write("timeline", result, table, out,
          f"{jobs} sequential jobs a run, {rounds} rounds alternating; the last "
          f"{int(KEPT * 100)} % of each run's jobs. A hop runs from the sender's call to send "
          "to the receiver awake with the message; the send calls' own durations, below the "
          "total, lie within their hops. Segments are medians taken one by one, so they need "
          "not add up to the median total.")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--run", choices=sorted(PATHS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        _run_path(args.run, args.jobs)
        return
    print(run(200 if args.quick else args.jobs, 1 if args.quick else args.rounds, args.out))


if __name__ == "__main__":
    main()
