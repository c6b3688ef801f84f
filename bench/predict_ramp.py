"""Benchmark: Keras ``model.predict()`` per job on a transformer encoder, under the defaults.

A text service written with ``predict()`` per request ramps over its first minute of mixed
lengths (Keras traces and TensorFlow caches per shape), then levels off: a ramp that levels
off is warm-up, not a leak, and the default policy must not recycle it by trend. Here one
worker serves that encoder (random weights; 6 layers, width 256, 4 heads, 30k vocabulary)
under the default policy (nothing set) at the product's default 1 s poll, with client
threads sending lengths uniform in 5..512, and every second its memory sample, job count and
age are read from ``status``.

Reported: memory at ready, after the first minute and over the rest, and the recycles the
live supervisor made (the target: none; a trend is judged on a full window only, and on
one 300 s run that gave none in 3,617 jobs: bench/HISTORY.md has the runs). The samples are
written to ``bench/results/predict_ramp_samples.json``, a real series for the
policy's tests.

    python -m bench.predict_ramp [--seconds 180] [--quick]
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import RESULTS, write
from bench.encoder_model import token_ids
from supervisor.testing import Supervisor, start_supervisor

MIB = 2**20
THREADS = 8
SAMPLES = "predict_ramp_samples.json"


def config(quick: bool) -> dict[str, Any]:
    shape = {"layers": 2, "width": 64} if quick else {"layers": 6, "width": 256}
    return {"supervisor": {"poll_interval": "1s"}, "models": {"predict": {
        "handler": "bench.leak_handlers:keras_encoder_predict", "options": shape,
        "workers": 1, "tf": {"intra_op_threads": 2, "inter_op_threads": 1},
        "batching": {"max_batch_size": 1}}}}  # predict() per job: one call each


def load(sup: Supervisor, stop: threading.Event, counts: dict[str, int], seed: int) -> None:
    rng = np.random.default_rng(seed)
    with sup.client(timeout=120) as client:
        while not stop.is_set():
            n = int(rng.integers(5, 513))
            try:
                client.infer("predict", {"input_ids": token_ids(n, int(rng.integers(1 << 30)),
                                                                vocab=30_000)})
                counts["ok"] += 1
            except Exception:  # counted, not raised: the figure says so
                counts["failed"] += 1


def record(sup: Supervisor, seconds: float) -> list[dict[str, Any]]:
    """One row per second per worker: what its last poll saw (the policy's own sample)."""
    rows = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for w in sup.status()["models"]["predict"]["workers"]:
            if w["memory"] is not None:
                rows.append({"worker": w["id"], "state": w["state"], "age": w["age"],
                             "jobs": w["jobs"], "memory": w["memory"]})
        time.sleep(1.0)
    return rows


def run(seconds: float, out: Path | None = None, quick: bool = False) -> dict[str, Any]:
    sup = start_supervisor(config(quick))
    stop = threading.Event()
    counts = {"ok": 0, "failed": 0}
    try:
        sup.wait_ready(timeout=600)
        threads = [threading.Thread(target=load, args=(sup, stop, counts, i), daemon=True)
                   for i in range(THREADS)]
        for t in threads:
            t.start()
        rows = record(sup, seconds)
        stop.set()
        for t in threads:
            t.join(120)
        recycles = sup.status()["models"]["predict"]["recycles"]
    finally:
        sup.stop()
    first = [r for r in rows if r["worker"] == rows[0]["worker"]]
    ready = first[0]["memory"]
    early = [r["memory"] for r in first if r["age"] - first[0]["age"] <= 60]
    later = [r["memory"] for r in first if r["age"] - first[0]["age"] > 60]
    result = {"seconds": seconds, "jobs": counts["ok"], "failed": counts["failed"],
              "recycles": recycles, "workers": len({r["worker"] for r in rows}),
              "ready_mib": round(ready / MIB), "first_minute_max_mib": round(max(early) / MIB),
              "later_min_mib": round(min(later) / MIB) if later else None,
              "later_max_mib": round(max(later) / MIB) if later else None,
              "encoder": config(quick)["models"]["predict"]["options"]}
    if out is not None or not quick:  # a quick pass never replaces the recorded series
        target = out or RESULTS
        target.mkdir(parents=True, exist_ok=True)
        (target / SAMPLES).write_text(json.dumps({"poll_interval": 1.0, "rows": rows}) + "\n")
    table = [["", "value"], ["jobs served (failed)", f"{counts['ok']:,} ({counts['failed']})"],
             ["memory at the first sample (MiB)", result["ready_mib"]],
             ["highest in the first minute (MiB)", result["first_minute_max_mib"]],
             ["range after the first minute (MiB)",
              f"{result['later_min_mib']}-{result['later_max_mib']}"],
             ["recycles under the default policy", recycles or "none"],
             ["worker processes", result["workers"]]]
    notes = (f"Keras encoder {result['encoder']} (4 heads, 30k vocabulary) through "
             f"model.predict() per job, lengths uniform in 5..512, {THREADS} client threads, "
             f"{seconds:.0f} s, default policy, 1 s poll. The per-second samples are in "
             f"{SAMPLES}.")
    write("predict_ramp", result, table, out=out, notes=notes)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=180.0)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    print(run(20.0 if args.quick else args.seconds, quick=args.quick))


if __name__ == "__main__":
    main()
