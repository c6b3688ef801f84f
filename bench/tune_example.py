"""The worked example of docs/policy.md, "Tuning from traffic": a real run, then
`tfsupervisor tune` on it, then the plot.

One supervisor serves two SavedModels, one worker each, for ``--seconds`` of traffic: the
demo MLP (batches of 1 to 16 rows, mostly small) and an embedding over ``input_ids`` of
varying length (log-normal, 4 to 160; compiled by XLA, which keeps one executable per
length, so its memory ramps until every length has been seen). Then `tfsupervisor tune
--save` records the daemon's history and prints its suggestions. Writes, under ``--out``:
``tune_example.md`` (the command and its output), ``tune_example_history.json`` (the saved
history: ``tfsupervisor tune --history`` reproduces the output from it) and the plot
``tune_example.png`` (also drawn again from the JSON alone with ``--plot-only``).

    python bench/tune_example.py --seconds 150 --out bench/results --png docs/img/tune.png
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

MiB = 1024**2
ROOT = Path(__file__).resolve().parent.parent


def build_models(where: Path) -> None:
    """The models, built in child processes (this script never imports TensorFlow)."""
    subprocess.run([sys.executable, "-m", "supervisor", "demo-model", str(where / "demo")],
                   check=True, cwd=ROOT)
    # XLA keeps one executable per input length (~0.3 MB each on CPU): memory ramps while
    # new lengths arrive, then levels off, as a text model's does
    subprocess.run([sys.executable, "-c", "import sys; from bench.leak_handlers import "
                    "save_embedding_model; save_embedding_model(sys.argv[1], "
                    "jit_compile=True)", str(where / "text")], check=True, cwd=ROOT)


def config(where: Path) -> dict[str, Any]:
    threads = {"intra_op_threads": 1, "inter_op_threads": 1}
    policy = {"trend_window": 30}  # 15 s of 0.5 s polls: time scaled for a short run
    return {"supervisor": {"poll_interval": "0.5s"}, "models": {
        "demo": {"saved_model": str(where / "demo"), "workers": 1, "tf": threads,
                 "batching": {"max_batch_size": 16, "batch_timeout_ms": 2},
                 "policy": policy},
        "text": {"saved_model": str(where / "text"), "workers": 1, "tf": threads,
                 "batching": {"max_batch_size": 8}, "policy": policy}}}


def demo_load(endpoint: str, stop: threading.Event, seed: int) -> None:
    from supervisor.client import Client, JobError

    rng = np.random.default_rng(seed)
    with Client(endpoint, timeout=60) as client:
        while not stop.is_set():
            rows = int(rng.choice([1, 1, 1, 2, 2, 3, 4, 6, 8, 16]))
            with contextlib.suppress(JobError):
                client.infer("demo", {"features": rng.random((rows, 64), dtype=np.float32)})


def text_load(endpoint: str, stop: threading.Event) -> None:
    from supervisor.client import Client, JobError

    rng = np.random.default_rng(3)
    with Client(endpoint, timeout=60) as client:
        while not stop.is_set():
            length = int(np.clip(rng.lognormal(3.8, 0.5), 4, 160))
            with contextlib.suppress(JobError):
                client.infer("text", {"input_ids": rng.integers(0, 1000, (1, length),
                                                                 dtype=np.int32)})


def run(seconds: float, out: Path, png: Path) -> None:
    from supervisor.testing import short_tmpdir, start_supervisor

    where = short_tmpdir()
    build_models(where)
    sup = start_supervisor(config(where), workdir=where)
    try:
        sup.wait_ready(300)
        stop = threading.Event()
        threads = [threading.Thread(target=demo_load, args=(sup.endpoint, stop, s))
                   for s in range(2)] + [threading.Thread(target=text_load,
                                                          args=(sup.endpoint, stop))]
        for t in threads:
            t.start()
        time.sleep(seconds)  # the traffic's duration, by design (not waiting on a result)
        history = out / "tune_example_history.json"
        command = [sys.executable, "-m", "supervisor", "tune", "-c", str(sup.config_path),
                   "--save", str(history), "--overwrite"]
        done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, check=True)
        stop.set()
        for t in threads:
            t.join(60)
    finally:
        sup.stop()
    text = done.stdout.replace(str(sup.config_path), "config.yaml").replace(
        str(history), "history.json")
    (out / "tune_example.md").write_text(
        f"# `tfsupervisor tune`: the worked example\n\nA real run of `bench/tune_example.py "
        f"--seconds {seconds:g}` (2 CPU cores): the demo MLP and an embedding model, one "
        "worker each, 0.5 s polls, `trend_window: 30`. Then:\n\n```\n$ tfsupervisor tune "
        "-c config.yaml --save history.json\n" + text + "```\n")
    plot(history, png)


def plot(history: Path, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from supervisor.config.loading import parse_config
    from supervisor.config.units import parse_duration, parse_size
    from supervisor.core.tuning import Options, parse_history, tune_model

    raw = json.loads(history.read_text())
    recorded = parse_history(raw)
    models = parse_config(json.dumps({"models": {
        "demo": {"handler": "a:b", "batching": {"max_batch_size": 16},
                 "policy": {"trend_window": 30}},
        "text": {"handler": "a:b", "batching": {"max_batch_size": 8},
                 "policy": {"trend_window": 30}}}})).models
    demo = tune_model("demo", recorded.models["demo"], models["demo"], recorded, Options())
    text = tune_model("text", recorded.models["text"], models["text"], recorded, Options())
    found = {f.path: f.value for f in text.findings}
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ax = axes[0]
    for w in raw["models"]["text"]["workers"]:
        points = sorted({p[0]: p for p in w["life"] + w["recent"]}.values())
        t = np.array([p[0] for p in points]) - w["ready_at"]
        ax.plot(t, np.array([p[2] for p in points]) / MiB, ".-", ms=3, lw=0.8,
                label=f"{w['id']} memory (RSS)")
    if found.get(("policy", "max_memory")):
        ax.axhline(parse_size(found[("policy", "max_memory")]) / MiB, color="C3", ls="--",
                   label=f"tuned max_memory {found[('policy', 'max_memory')]}")
    if found.get(("policy", "warmup_seconds")):
        ax.axvline(parse_duration(found[("policy", "warmup_seconds")]), color="C2", ls=":",
                   label=f"tuned warmup_seconds {found[('policy', 'warmup_seconds')]}")
    ax.set(xlabel="seconds since ready", ylabel="MiB", title="text: its worker's memory")
    ax.legend(fontsize=8, loc="lower right")
    ax = axes[1]
    rows = raw["models"]["demo"]["traffic"]["batch_rows"]
    ax.bar([r for r, _ in rows], [n for _, n in rows], color="C0")
    sizes = next((f.value for f in demo.findings if f.path[0] == "batching"), None) or []
    for s in sizes:
        ax.axvline(s + 0.5, color="C3", ls="--", lw=1)
    ax.set(xlabel="rows per batch (before padding)", ylabel="batches",
           title=f"demo: batch sizes; tuned allowed_batch_sizes {sizes}")
    ax = axes[2]
    buckets = raw["models"]["text"]["traffic"]["lengths"]["input_ids:1"]["buckets"]
    # each bucket drawn over the lengths it saw, as jobs per length
    ax.bar([b[0] for b in buckets], [b[2] / (b[1] - b[0] + 1) for b in buckets],
           width=[b[1] - b[0] + 1 for b in buckets], align="edge", color="C1")
    lengths = next((f.value for f in text.findings if f.path[0] == "padding"), None) or []
    for s in lengths:
        ax.axvline(s + 0.5, color="C3", ls="--", lw=1)
    ax.set(xlabel="input_ids length", ylabel="jobs per length",
           title=f"text: lengths; {len(lengths)} padding sizes (<= 10% padded)")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=150.0)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--png", type=Path, default=ROOT / "docs" / "img" / "tune.png")
    parser.add_argument("--plot-only", action="store_true",
                        help="draw the PNG again from OUT/tune_example_history.json")
    args = parser.parse_args()
    if args.plot_only:
        plot(args.out / "tune_example_history.json", args.png)
    else:
        run(args.seconds, args.out, args.png)


if __name__ == "__main__":
    main()
