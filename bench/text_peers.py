"""Side by side on a text workload: the demo text encoder on variable-length token ids.

The same SavedModel (``tfsupervisor demo-model --text``: 4 layers, width 128; token ids and
attention mask of any length in, a pooled embedding out), TF 1 thread per op, 2 workers,
batches up to 32 rows and a 5 ms wait wherever a server batches, served by:

- tfsupervisor: examples/text.yaml (jobs padded up to 16/32/64/128/256 tokens with a
  generated attention mask, every size warmed at 1 and 32 rows) with the same 5 ms wait,
  and (``tfsupervisor-adaptive``) as the example has it: the wait unset, so it adapts;
  and (``tfsupervisor-http``) with the 5 ms wait, reached through its HTTP front
  (``supervisor.http``, Open Inference Protocol v2 JSON) by the same HTTP client as the
  peers (skipped with a printed line where this tfsupervisor has no HTTP front);
- mosec: 2 workers, ``max_batch_size=32``; each batch padded to its longest sequence (how a
  mosec user writes it); raw int32 ids in, raw float32 embedding out;
  (``mosec-oip``) the same with Open Inference Protocol v2 JSON in and out, the very
  requests ``tfsupervisor-http`` gets;
- LitServe: 2 workers, the same padding, JSON in and out, ``fast_queue=True``;
- the common per-request service: gunicorn, 2 sync workers, a WSGI app calling the loaded
  SavedModel once per request on the request's own shape (how such a service is commonly written);
- the compute ceiling: the same model in a tight loop, 2 processes, on full 32-row batches
  of the same traffic, each batch one padding size (no server, no client).

Traffic: batch-1 requests, lengths drawn from a skewed (log-normal) distribution, median 28
tokens, 4..256 (``lengths``). Two loads per server and round:

- closed loop (bench/harness, as every load): 32 clients (4 forked processes of 8 threads)
  for ``--seconds``, after a
  warm-up of the same load: rows/s, p50/p99, rows per serving CPU-second (user + system CPU
  of the server's whole process tree);
- open loop: Poisson arrivals at fixed fractions (``--fractions``) of the round's reference
  capacity (mosec's closed-loop rows/s in that round when mosec runs, else the first
  server's): the same absolute rates for every server. Latency is counted from each
  request's *scheduled* send time, so a stalled server cannot hide its queue (no
  coordinated omission); up to 64 requests in flight. p50/p99/p99.9, failures (errors and
  answers not back ``DRAIN_S`` after the schedule ended).

Memory: every process of each server's tree at its start (ready, before any load) and at the
end of its round; the largest process is the worker figure.

Rounds are interleaved (each round, every server in turn, started and stopped within it).

    python -m bench.text_peers [--seconds 15] [--open-seconds 10] [--rounds 2]
                               [--only mosec,tfsupervisor,...] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from bench.common import percentiles, write
from bench.harness.load import CLIENTS, PROCESSES
from bench.harness.scripts import LITSERVE_SERVER, LOAD, MOSEC_ARGS, MOSEC_OIP_SERVER, MOSEC_SERVER
from bench.harness.server import START_TIMEOUT, Server, cpu_between
from bench.harness.transport import Inputs
from bench.harness.workload import Variant, Workload, interleaved, skipped
from supervisor.testing import short_tmpdir

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "text.yaml"
VOCAB = 8192
WIDTH = 128
MAX_LENGTH = 256
SIZES = (16, 32, 64, 128, 256)
WAIT_MS = 5
BATCH = 32


def lengths(n: int, seed: int) -> np.ndarray:
    """``n`` request lengths: log-normal, median 28 tokens, clipped to 4..256."""
    rng = np.random.default_rng(seed)
    return np.clip(np.rint(rng.lognormal(np.log(28), 0.8, n)), 4, MAX_LENGTH).astype(int)


# --- the peers' server scripts ------------------------------------------------------------

LOAD_MODEL = LOAD + '''

def pad_longest(rows):
    """One batch padded to its longest sequence, with its attention mask."""
    length = max(len(r) for r in rows)
    ids = np.zeros((len(rows), length), np.int32)
    mask = np.zeros((len(rows), length), np.int32)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = r
        mask[i, :len(r)] = 1
    return ids, mask


def forward_raw(call, rows):
    """A batch of raw request bodies (int32 ids) in, raw answers (float32) out."""
    return [row.tobytes() for row in predict_rows(call, [np.frombuffer(r, np.int32)
                                                         for r in rows])]


def from_json(request):
    return np.asarray(request["input_ids"], np.int32)


def predict_rows(call, rows):
    return call(*pad_longest(rows))


def to_json(output):
    return {"pooled": output.tolist()}
'''

# The common per-request service: a WSGI app (gunicorn sync workers) calling the loaded model once
# per request, on the request's own length.
WSGI_APP = '''
call = load_model()


def app(environ, start_response):
    body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
    ids = np.frombuffer(body, np.int32)[np.newaxis]
    out = call(ids, np.ones(ids.shape, np.int32))
    start_response("200 OK", [("Content-Type", "application/octet-stream")])
    return [out.tobytes()]
'''

# The compute ceiling: full batches of one padding size each, built before the clock starts.
CEILING = '''
import json
import time


def bucket(n):
    return next(s for s in SIZES if s >= n)


if __name__ == "__main__":
    SIZES = json.loads(os.environ["PEERS_SIZES"])
    call = load_model()
    stream = np.load(sys.argv[1])
    rng = np.random.default_rng(int(sys.argv[3]))
    pending, batches = {}, []
    for n in stream:
        rows = pending.setdefault(bucket(n), [])
        rows.append(n)
        if len(rows) == BATCH:
            size = bucket(n)
            ids = np.zeros((BATCH, size), np.int32)
            mask = np.zeros((BATCH, size), np.int32)
            for i, m in enumerate(rows):
                ids[i, :m] = rng.integers(1, VOCAB, m)
                mask[i, :m] = 1
            batches.append((ids, mask))
            pending[size] = []
    for size in SIZES:  # warm every shape, as the servers are warmed
        call(np.ones((BATCH, size), np.int32), np.ones((BATCH, size), np.int32))
    seconds = float(sys.argv[2])
    cpu, wall, rows, i = time.process_time(), time.monotonic(), 0, 0
    while time.monotonic() - wall < seconds:
        call(*batches[i % len(batches)])
        rows += BATCH
        i += 1
    print(json.dumps({"rows": rows, "cpu_s": time.process_time() - cpu,
                      "wall_s": time.monotonic() - wall}))
'''.replace("BATCH", str(BATCH)).replace("VOCAB", str(VOCAB))


# --- the workload: one row of token ids of a skewed length per request ----------------------

def requests(seed: int) -> Iterator[Inputs]:
    """An endless stream of one-row requests of the skewed lengths."""
    rng = np.random.default_rng(seed)
    while True:
        for n in lengths(1000, int(rng.integers(2**31))):
            yield {"input_ids": rng.integers(1, VOCAB, (1, n)).astype(np.int32)}


def check(values: np.ndarray) -> None:
    if values.size != WIDTH:
        raise RuntimeError(f"an answer of {values.size} values, not one embedding")


def example_config(model: Path, wait_ms: float = WAIT_MS,
                   adaptive: bool = False) -> dict[str, Any]:
    """examples/text.yaml's model section on ``model``, as a user would serve it: with the
    peers' batch wait, or (``adaptive``) none set, so the wait adapts to the load."""
    text: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())["models"]["text"]
    text = {**text, "saved_model": str(model), "workers": 2}
    batching = {**text["batching"], "max_batch_size": BATCH, "batch_timeout_ms": wait_ms}
    if adaptive:
        del batching["batch_timeout_ms"]
    text["batching"] = batching
    return {"supervisor": {"poll_interval": "1s"}, "models": {"text": text}}


TEXT = Workload("text", "pooled", requests, check, {"input_ids": np.ones((1, 8), np.int32)},
                LOAD_MODEL, example_config, json_in="input_ids", json_out="pooled",
                env={"PEERS_SIZES": json.dumps(SIZES),
                     "PEERS_INPUTS": "input_ids,attention_mask", "PEERS_OUTPUT": "pooled"})

PEERS: dict[str, Variant] = {v.name: v for v in (
    Variant("mosec", "mosec 2 workers, batch 32, padded to the batch's longest (raw bytes)",
            "script", modules=("mosec",), script=MOSEC_SERVER, args=MOSEC_ARGS,
            path="/inference"),
    Variant("tfsupervisor", "tfsupervisor, examples/text.yaml (5 padding sizes, batch 32)"),
    Variant("tfsupervisor-adaptive", "tfsupervisor, the same without batch_timeout_ms (the "
            "wait adapts)", adaptive=True),
    Variant("tfsupervisor-http", "tfsupervisor, examples/text.yaml over its HTTP front (Open "
            "Inference Protocol v2 JSON)", front="http", body="oip"),
    Variant("tfsupervisor-grpc", "tfsupervisor, examples/text.yaml over its gRPC front "
            "(Open Inference Protocol v2, raw tensors)", front="grpc"),
    Variant("mosec-oip", "mosec 2 workers, batch 32, padded to the batch's longest (Open "
            "Inference Protocol v2 JSON, as tfsupervisor-http)", "script", modules=("mosec",),
            script=MOSEC_OIP_SERVER, args=MOSEC_ARGS, path="/inference", body="oip"),
    Variant("litserve", "LitServe 2 workers, batch 32, padded to the batch's longest (JSON)",
            "script", modules=("litserve",), script=LITSERVE_SERVER, path="/predict",
            body="json"),
    Variant("per_request", "gunicorn 2 sync workers, one model call per request",
            "script", modules=("gunicorn",), script=WSGI_APP,
            command=("{bin}/gunicorn", "--workers", "2", "--worker-class", "sync", "--bind",
                     "127.0.0.1:{port}", "--timeout", "120", "--backlog", "2048",
                     "{module}:app")),
    Variant("ceiling", "compute ceiling: the model in a loop, 2 processes, full 32-row batches",
            "ceiling"),
)}


# --- rounds -----------------------------------------------------------------------------------

def batches(server: Server) -> tuple[int, float, float | None] | None:
    """tfsupervisor's (batches sent, rows, the share of rows computed that were padding)."""
    if server.status is None:
        return None
    sent = server.status()["models"]["text"]["batches"]
    return sent["sent"], (sent["mean_rows"] or 0.0) * sent["sent"], sent["padding_share"]


def serve_round(peer: Variant, model: Path, workdir: Path, seconds: float, open_seconds: float,
                warmup: float, rates: Rates, seed: int) -> dict[str, Any]:
    with TEXT.start(peer, model, workdir, WAIT_MS) as server:
        load = TEXT.load(server.transport, CLIENTS, PROCESSES)
        start_memory = server.memory()
        load.closed(warmup, seed)
        before = server.cpu()
        sent = batches(server)
        tally = load.closed(seconds, seed + 1)
        cpu = cpu_between(before, server.cpu())
        rows = len(tally.latencies)
        row: dict[str, Any] = {
            "rows": rows, "rows_s": round(rows / seconds, 1), "failures": tally.failures,
            **percentiles(tally.latencies, digits=1, mean=False), "cpu_s": round(cpu, 2),
            "rows_per_cpu_s": round(rows / cpu, 1) if cpu else None,
            "memory_start": start_memory}
        if sent and (now := batches(server)):
            row["mean_rows_per_batch"] = round((now[1] - sent[1]) / max(1, now[0] - sent[0]), 2)
            row["padding_share"] = now[2]  # since the start, warm-up load included
        row["open"] = []
        for rate in rates(row["rows_s"]):
            done = load.open(open_seconds, rate, seed + 2)
            row["open"].append({"rate": round(rate, 1), "answered": len(done.latencies),
                                "failures": done.failures,
                                **percentiles(done.latencies, (50, 99, 99.9), 1, mean=False)})
        row["memory_end"] = server.memory()
        return row


def ceiling_round(model: Path, workdir: Path, seconds: float, seed: int) -> dict[str, Any]:
    """Two loop processes side by side (the servers' 2 workers), each on its own traffic."""
    script = TEXT.write_script(workdir, "text_ceiling", CEILING)
    procs = []
    for i in range(2):
        stream = workdir / f"lengths_{i}.npy"
        np.save(stream, lengths(20_000, seed * 10 + i))
        procs.append(subprocess.Popen([sys.executable, str(script), str(stream), str(seconds),
                                       str(seed + i)], cwd=workdir, env=TEXT.script_env(model),
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL))
    results = []
    for proc in procs:
        out, _ = proc.communicate(timeout=seconds + START_TIMEOUT)
        if proc.returncode != 0:
            raise RuntimeError(f"ceiling loop exited {proc.returncode}")
        results.append(json.loads(out.decode().strip().splitlines()[-1]))
    rows = sum(r["rows"] for r in results)
    cpu = sum(r["cpu_s"] for r in results)
    return {"rows": rows, "rows_s": round(sum(r["rows"] / r["wall_s"] for r in results), 1),
            "cpu_s": round(cpu, 2), "rows_per_cpu_s": round(rows / cpu, 1),
            "mean_rows_per_batch": BATCH}


class Rates:
    """A round's open-loop rates: fractions of the closed-loop rows/s of the round's first
    server (mosec when it runs), the same for every server after it."""

    def __init__(self, fractions: list[float]) -> None:
        self.fractions, self.reference = fractions, 0.0

    def __call__(self, own: float) -> list[float]:
        self.reference = self.reference or own
        return [f * self.reference for f in self.fractions]


def run(names: list[str], rounds: int, seconds: float, open_seconds: float, warmup: float,
        fractions: list[float], out: Path | None) -> dict[str, Any]:
    peers: list[Variant] = []
    skips: dict[str, str] = {}
    for name in names:
        if why := skipped(PEERS[name]):
            print(f"{name}: {why}", flush=True)
            skips[name] = why
        else:
            peers.append(PEERS[name])
    workdir = short_tmpdir()
    print(f"scripts, logs and the model: {workdir}", flush=True)
    model = workdir / "text_model"
    subprocess.run([sys.executable, "-m", "worker.demo_text", str(model)], check=True,
                   env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    rates: list[Rates] = []

    def one(peer: Variant, r: int) -> dict[str, Any]:
        if len(rates) <= r:
            rates.append(Rates(fractions))
        row = ceiling_round(model, workdir, seconds, 1000 * r) if peer.server == "ceiling" \
            else serve_round(peer, model, workdir, seconds, open_seconds, warmup, rates[r],
                             1000 * r)
        print(json.dumps(row), flush=True)
        return row

    results = interleaved(peers, rounds, one)
    payload = {"rounds": results, "rounds_run": rounds, "seconds": seconds,
               "open_seconds": open_seconds, "fractions": fractions, "clients": CLIENTS,
               "wait_ms": WAIT_MS, "max_batch_size": BATCH, "sizes": SIZES,
               "skipped": skips, "summary": summarize(results)}
    report(payload, out)
    shutil.rmtree(workdir, ignore_errors=True)
    return payload


def median(values: list[float]) -> float | None:
    return round(float(np.median(values)), 2) if values else None


def summarize(results: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Medians over rounds, and per-round ratios to mosec and to the ceiling."""
    out: dict[str, Any] = {}
    for name, rows in results.items():
        ok = [r for r in rows if "rows" in r]
        entry: dict[str, Any] = {"rounds_ok": len(ok), "rows_s": median([r["rows_s"] for r in ok]),
                                 "rows_per_cpu_s": median([r["rows_per_cpu_s"] for r in ok
                                                           if r.get("rows_per_cpu_s")])}
        for other in ("mosec", "per_request", "ceiling"):
            if other == name or other not in results:
                continue
            for key in ("rows_s", "rows_per_cpu_s"):
                pairs = [a[key] / b[key] for a, b in zip(rows, results[other], strict=False)
                         if a.get(key) and b.get(key)]
                if pairs:
                    entry[f"{key}_vs_{other}"] = [round(p, 2) for p in pairs]
        out[name] = entry
    return out


def _rows_per_batch(row: dict[str, Any]) -> str:
    """Mean rows per batch, and for tfsupervisor the share of rows computed as padding."""
    mean = row.get("mean_rows_per_batch", "-")
    share = row.get("padding_share")
    return f"{mean} ({share:.0%} padding)" if share is not None else str(mean)


def report(payload: dict[str, Any], out: Path | None) -> None:
    table: list[list[Any]] = [["server", "round", "rows/s", "rows per CPU-s", "p50 / p99 ms",
                               "rows/batch", "open loop: rate -> p50 / p99 / p99.9 ms (failed)",
                               "memory start -> end, largest process MiB (tree)"]]
    for name, rows in payload["rounds"].items():
        for i, r in enumerate(rows, 1):
            if "rows" not in r:
                table.append([PEERS[name].label, i, r.get("error", "?")[:200], *["-"] * 5])
                continue
            opened = "; ".join(f"{o['rate']:g}/s -> {o['p50_ms']} / {o['p99_ms']} / "
                               f"{o['p99.9_ms']} ({o['failures']})" for o in r.get("open", []))
            mem = ""
            if "memory_start" in r:
                a, b = r["memory_start"], r["memory_end"]
                mem = (f"{a['largest_mib']:.0f} -> {b['largest_mib']:.0f} "
                       f"({a['tree_mib']:.0f} -> {b['tree_mib']:.0f})")
            table.append([PEERS[name].label, i, r["rows_s"], r["rows_per_cpu_s"],
                          f"{r.get('p50_ms', '-')} / {r.get('p99_ms', '-')}",
                          _rows_per_batch(r), opened or "-", mem or "-"])
    for name, why in payload.get("skipped", {}).items():
        table.append([PEERS[name].label, "-", why, *["-"] * 5])
    notes = (f"The demo text encoder (`tfsupervisor demo-model --text`), batch-1 requests of "
             f"log-normal lengths (median 28, 4..256 tokens); closed loop: {CLIENTS} clients, "
             f"{payload['seconds']:g} s per round; open loop: Poisson arrivals at "
             f"{', '.join(f'{f:g}' for f in payload['fractions'])} of the round's first "
             f"server's closed-loop rows/s (mosec's), {payload['open_seconds']:g} s each, "
             "latency from the scheduled send. 2 workers, batches up to 32, 5 ms wait, TF 1 "
             "thread per op; clients and servers share the cores. Rows per CPU-s: the "
             "server's whole process tree. Summary (medians, per-round ratios): "
             + json.dumps(payload["summary"]))
    write("text_peers", payload, table, out, notes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--open-seconds", type=float, default=10)
    parser.add_argument("--warmup", type=float, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--fractions", type=lambda s: [float(f) for f in s.split(",")],
                        default=[0.5, 0.8, 0.95])
    parser.add_argument("--only", type=lambda s: [n.strip() for n in s.split(",")],
                        default=list(PEERS), help=f"subset of: {', '.join(PEERS)}")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if unknown := set(args.only) - set(PEERS):
        parser.error(f"unknown server(s) {sorted(unknown)}; known: {', '.join(PEERS)}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the servers on the way out
    payload = run(args.only, args.rounds, args.seconds, args.open_seconds, args.warmup,
                  args.fractions, args.out)
    print(json.dumps(payload["summary"], indent=1))


if __name__ == "__main__":
    main()
