"""Side by side: the demo MLP SavedModel behind tfsupervisor and behind three peer servers.

The same SavedModel (64 float32 features -> 1 probability), loaded with
``tf.saved_model.load`` and called through ``serving_default`` with TF's intra/inter-op
threads set to 1, served with 2 workers and dynamic batching up to 32 rows by:

- tfsupervisor: ``supervisor.testing.start_supervisor``, configured as bench/mlp.py does
  (batches padded to powers of two) with the same wait; clients use
  ``supervisor.client.Client``. Variants: ``tfsupervisor-nowait`` (``batch_timeout_ms`` 0),
  ``tfsupervisor-adaptive`` (not set: the wait adapts to the load), ``tfsupervisor-http``
  (the same server reached through its HTTP front, ``supervisor.http``, with the Open
  Inference Protocol v2 JSON body and the same HTTP client as the peers; skipped with a
  printed line where this tfsupervisor has no HTTP front).
- mosec: Rust HTTP broker, 2 Python workers, ``max_batch_size=32``, ``max_wait_time`` 5 ms;
  raw float32 bytes in and out.
  ``mosec-oip``: the same reading and answering the Open Inference Protocol v2 JSON, so
  that it and ``tfsupervisor-http`` get the very same HTTP requests from the same client.
- LitServe: JSON API, 2 workers on one CPU device, ``max_batch_size=32``,
  ``batch_timeout`` 5 ms, ``fast_queue=True`` (ZeroMQ between its API servers and workers,
  which its documentation advises above 100 requests/s).
- Ray Serve: 2 replicas, ``@serve.batch(max_batch_size=32, batch_wait_timeout_s=0.005)``,
  ``max_ongoing_requests=32`` per replica (Ray's default of 5 would cap batches at 5);
  raw float32 bytes in and out.

The peers' servers are scripts this benchmark writes into a temporary directory and runs
with the same Python. A peer whose package does not import is reported as ``skipped (not
installed)``; the others still run.

Load: batch-1 requests from 32 concurrent clients (4 forked client processes of 8 threads),
for ``--seconds`` per round (bench/harness: every server driven by the same load); each HTTP
client thread keeps one ``http.client.HTTPConnection`` alive, each tfsupervisor client
thread uses its ``Client``'s own socket. Before each
measured window the server is warmed up with the same load for a few seconds.

Rounds are interleaved (for each round, every server in turn), so slow drift of the machine
hits all servers alike. By default each server is started, warmed up, measured and stopped
within each round, so it has the machine to itself while measured: idle, LitServe's
processes poll for about a quarter of a core and Ray's daemons about a tenth, which on 2
cores would skew the others' windows. ``--resident`` starts every server once instead (when
the memory allows: about 2 GiB each) and records the idle servers' CPU during each window as
``others_cpu_pct``.

Per round and server: requests per second, p50/p99 latency, failed requests, server CPU per
request (user + system CPU of the server's whole process tree, read with psutil before and
after the measured window; only processes alive at both reads are counted, so a child that
starts or exits within the window is left out), and client CPU per request (user + system
CPU of the 4 client processes over the measured window).

    python -m bench.peers [--seconds 20] [--rounds 3] [--quick] [--only tfsupervisor,mosec]
                          [--resident] [--model DIR] [--out DIR] [--clients N]
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from statistics import median
from typing import Any

import psutil

from bench.common import percentiles, write
from bench.harness.load import CLIENTS, PROCESSES, Load
from bench.harness.scripts import (
    LITSERVE_SERVER,
    MOSEC_ARGS,
    MOSEC_OIP_SERVER,
    MOSEC_SERVER,
    RAY_SERVER,
)
from bench.harness.server import SETTLE_MAX_S, SETTLED_PCT, Server, cpu_between
from bench.harness.workload import Variant, failed, interleaved, skipped
from bench.mlp import MLP, build_model
from supervisor.testing import short_tmpdir

ROOT = Path(__file__).resolve().parent.parent
MAX_WAIT_MS = 5
# Rough resident memory of one server (2 TF workers and its broker); Ray's daemons more.
RESIDENT_BYTES = 2 * 2**30


PEERS: dict[str, Variant] = {v.name: v for v in (
    Variant("tfsupervisor", "tfsupervisor (ZeroMQ, batching 32, the same wait)"),
    Variant("tfsupervisor-nowait", "tfsupervisor, batch_timeout_ms 0", wait_ms=0.0),
    Variant("tfsupervisor-adaptive", "tfsupervisor, batch_timeout_ms not set (its default: "
            "adaptive)", adaptive=True),
    Variant("tfsupervisor-http", "tfsupervisor over its HTTP front (Open Inference Protocol "
            "v2 JSON), the same wait", front="http", body="oip"),
    Variant("tfsupervisor-grpc", "tfsupervisor over its gRPC front (Open Inference "
            "Protocol v2, raw tensors), the same wait", front="grpc"),
    Variant("mosec", "mosec 2 workers, batch 32 (raw bytes)", "script", modules=("mosec",),
            script=MOSEC_SERVER, args=MOSEC_ARGS, path="/inference"),
    Variant("mosec-oip", "mosec 2 workers, batch 32 (Open Inference Protocol v2 JSON, as "
            "tfsupervisor-http)", "script", modules=("mosec",), script=MOSEC_OIP_SERVER,
            args=MOSEC_ARGS, path="/inference", body="oip"),
    Variant("litserve", "LitServe 2 workers, batch 32 (JSON)", "script",
            modules=("litserve",), script=LITSERVE_SERVER, path="/predict", body="json"),
    Variant("ray", "Ray Serve 2 replicas, batch 32 (raw bytes)", "script",
            modules=("ray.serve",), script=RAY_SERVER),
)}


def variant(spec: str) -> Variant:
    """``NAME@MS``: server NAME again with its own batch wait of MS milliseconds (each
    server at the wait it does best with, beside the common one), registered in PEERS."""
    name, _, ms = spec.partition("@")
    if name not in PEERS or not ms:
        raise ValueError(f"--also takes NAME@MS with NAME one of {', '.join(PEERS)}: {spec!r}")
    wait = float(ms)
    base = PEERS[name]
    peer = replace(base, name=f"{name}@{wait:g}ms", label=f"{base.label}, wait {wait:g} ms",
                   wait_ms=wait, adaptive=False)
    PEERS[peer.name] = peer
    return peer


# --- rounds -----------------------------------------------------------------------------------

def measure(server: Server, load: Load, seconds: float, warmup: float,
            others: list[Server]) -> dict[str, Any]:
    """One measured window on a started server (after ``warmup`` seconds of the same load)."""
    load.closed(warmup)
    server_before = server.cpu()
    others_before = [o.cpu() for o in others]
    wall = time.monotonic()
    done = load.closed(seconds, seed=1)
    wall = time.monotonic() - wall
    used = cpu_between(server_before, server.cpu())
    background = sum(cpu_between(b, o.cpu()) for b, o in zip(others_before, others,
                                                            strict=True))
    n = len(done.latencies)
    return {"requests": n, "req_s": round(n / seconds, 1), "failures": done.failures,
            **percentiles(done.latencies),
            "server_cpu_us": round(used / n * 1e6, 1) if n else None,
            "client_cpu_us": round(done.cpu / n * 1e6, 1) if n else None,
            "server_cpu_s": round(used, 3), "client_cpu_s": round(done.cpu, 3),
            "server_processes": len(server_before), "window_s": round(wall, 2),
            "others_cpu_pct": round(background / wall * 100, 1) if others else None,
            "latencies": done.latencies}


def rounds_restarting(peers: list[Variant], model: Path, workdir: Path, rounds: int,
                      seconds: float, warmup: float, wait_ms: float,
                      clients: int) -> dict[str, list[dict[str, Any]]]:
    """Each round, each server in turn: start, warm up, measure, stop."""
    def one(peer: Variant, _: int) -> dict[str, Any]:
        with MLP.start(peer, model, workdir, wait_ms) as server:
            return measure(server, MLP.load(server.transport, clients), seconds, warmup, [])

    return interleaved(peers, rounds, one)


def rounds_resident(peers: list[Variant], model: Path, workdir: Path, rounds: int,
                    seconds: float, warmup: float, wait_ms: float,
                    clients: int) -> dict[str, list[dict[str, Any]]]:
    """Every server started once; each round measures them in turn while the others idle."""
    results: dict[str, list[dict[str, Any]]] = {p.name: [] for p in peers}
    with ExitStack() as stack:
        up: dict[str, Server] = {}
        for peer in peers:
            print(f"starting {peer.name}", flush=True)
            try:
                up[peer.name] = stack.enter_context(MLP.start(peer, model, workdir, wait_ms))
            except Exception as exc:
                results[peer.name] = [failed(exc)] * rounds
        for r in range(rounds):
            for name, server in up.items():
                print(f"round {r + 1}/{rounds}: {name}", flush=True)
                others = [o for o in up.values() if o is not server]
                try:
                    results[name].append(measure(server, MLP.load(server.transport, clients),
                                                 seconds, warmup, others))
                except Exception as exc:
                    results[name].append(failed(exc))
    return results


# --- report -----------------------------------------------------------------------------------

def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    measured = [r for r in rows if r.get("requests")]
    errors = sorted({r.get("error", "no request answered") for r in rows
                     if not r.get("requests")})
    if not measured:
        return {"status": "failed: " + "; ".join(errors)}
    requests = sum(r["requests"] for r in measured)
    rates = [r["req_s"] for r in measured]
    server = sum(r["server_cpu_s"] for r in measured)
    client = sum(r["client_cpu_s"] for r in measured)
    latencies = [t for r in measured for t in r["latencies"]]
    return {"status": "ok" if not errors else "partly failed: " + "; ".join(errors),
            "req_s_rounds": rates, "req_s_mean": round(sum(rates) / len(rates), 1),
            "req_s_min": min(rates), "req_s_max": max(rates),
            **percentiles(latencies),
            "server_cpu_us": round(server / requests * 1e6, 1),
            "client_cpu_us": round(client / requests * 1e6, 1),
            "failures": sum(r["failures"] for r in measured),
            "rounds_failed": len(rows) - len(measured)}


def ratios(rounds: dict[str, list[dict[str, Any]]],
           summaries: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each tfsupervisor variant's req/s over each peer's, as "OURS : PEER": of the means,
    and per round (measured minutes apart at most, so the pairs share the machine's
    state). The default configuration (``tfsupervisor-adaptive``) is what users get."""
    out = {}
    for mine, ours in summaries.items():
        if PEERS[mine].server != "tfsupervisor" or "req_s_mean" not in ours:
            continue
        for name, summary in summaries.items():
            if PEERS[name].server == "tfsupervisor" or "req_s_mean" not in summary:
                continue
            paired = [a["req_s"] / b["req_s"]
                      for a, b in zip(rounds[mine], rounds[name], strict=False)
                      if a.get("req_s") and b.get("req_s")]
            out[f"{mine} : {name}"] = {
                "mean": round(ours["req_s_mean"] / summary["req_s_mean"], 2),
                "median_round": round(median(paired), 2) if paired else None,
                "rounds": [round(p, 2) for p in paired]}
    return out


def span(values: list[float], digits: int = 0) -> str:
    low, high = f"{min(values):,.{digits}f}", f"{max(values):,.{digits}f}"
    return low if low == high else f"{low} - {high}"


def report(results: dict[str, Any], out: Path | None) -> Path:
    table: list[list[Any]] = [["server", "req/s per round", "req/s min - max", "p50 ms",
                               "p99 ms", "server CPU µs/req", "client CPU µs/req",
                               "failures"]]
    for name, s in results["servers"].items():
        label = PEERS[name].label
        if "req_s_mean" not in s:
            status = " ".join(s["status"].replace("|", "/").split())  # one table cell
            table.append([label, status[:300], *["-"] * 6])
            continue
        failures = f"{s['failures']}" + (f" ({s['status']})" if s["status"] != "ok" else "")
        table.append([label, ", ".join(f"{v:,.0f}" for v in s["req_s_rounds"]),
                      span(s["req_s_rounds"]), s["p50_ms"], s["p99_ms"],
                      s["server_cpu_us"], s["client_cpu_us"], failures])
    said = [f"{k} **{v['mean']}x**" + (f" (median round {v['median_round']}, rounds "
                                      f"{span(v['rounds'], 2)})" if len(v["rounds"]) > 1
                                      else "")
            for k, v in results["ratios"].items()]
    others = [r["others_cpu_pct"] for rows in results["rounds"].values() for r in rows
              if r.get("others_cpu_pct") is not None]
    notes = (
        f"The demo MLP SavedModel, batch-1 requests from {results['clients']} concurrent "
        f"clients in {results['processes']} client processes, {results['seconds']:g} s per "
        f"round, {results['rounds_run']} round(s) interleaved ({results['mode']}); 2 workers "
        "per server, batches up to 32, TF 1 thread per op; clients and servers share the "
        "same cores. p50/p99 over all rounds' requests. Server CPU: the whole process "
        "tree's user + system CPU (processes alive at both ends of the window). "
        "req/s ratios, of the means: " + ("; ".join(said) or "none") + ".")
    if others:
        notes += (f" Idle resident servers used up to {max(others)} % of one core during "
                  "another's window.")
    busy = [r["machine_busy_before_pct"] for rows in results["rounds"].values() for r in rows
            if r.get("machine_busy_before_pct") is not None]
    if busy:
        notes += (f" Each server was started once the machine was idle (below {SETTLED_PCT:g} "
                  f"% CPU over half a second, waited up to {SETTLE_MAX_S:g} s): at most "
                  f"{max(busy)} % at the start of a round.")
    return write("peers", results, table, out, notes)


def resolve_model(model: Path | None) -> Path:
    """``model``, else models/demo if `make run` built it, else a new demo model."""
    demo = ROOT / "models" / "demo"
    if model is None and (demo / "saved_model.pb").exists():
        return demo
    return model or build_model()


def run(seconds: float, rounds: int, only: list[str] | None = None, out: Path | None = None,
        warmup: float = 3.0, resident: bool = False, model: Path | None = None,
        wait_ms: float = MAX_WAIT_MS, clients: int = CLIENTS) -> dict[str, Any]:
    """Measure the servers named in ``only`` (default all); write peers.json and peers.md.
    ``resident``: start each server once (if the memory allows), not once per round."""
    names = only or list(PEERS)
    unknown = set(names) - set(PEERS)
    if unknown:
        raise ValueError(f"unknown server(s) {sorted(unknown)}; known: {', '.join(PEERS)}")
    peers: list[Variant] = []
    summaries: dict[str, dict[str, Any]] = {}
    for name in names:
        if why := skipped(PEERS[name]):
            print(f"{name}: {why}", flush=True)
            summaries[name] = {"status": why}
        else:
            peers.append(PEERS[name])
    if resident and psutil.virtual_memory().available < RESIDENT_BYTES * (len(peers) + 1):
        print("not enough memory for resident servers: starting them per round", flush=True)
        resident = False
    rounds_of: dict[str, list[dict[str, Any]]] = {}
    if peers:
        model = resolve_model(model)
        workdir = short_tmpdir()  # the servers' scripts and logs stay there
        print(f"servers' scripts and logs: {workdir}", flush=True)
        measure_rounds = rounds_resident if resident else rounds_restarting
        rounds_of = measure_rounds(peers, model, workdir, rounds, seconds, warmup, wait_ms,
                                   clients)
    summaries.update({p.name: summarize(rounds_of[p.name]) for p in peers})
    summaries = {name: summaries[name] for name in names}
    for rows in rounds_of.values():
        for row in rows:
            row.pop("latencies", None)
    results = {"seconds": seconds, "warmup_seconds": warmup, "rounds_run": rounds,
               "clients": clients, "processes": min(PROCESSES, clients),
               "mode": "resident servers" if resident else "servers started per round",
               "max_wait_ms": wait_ms, "servers": summaries,
               "ratios": ratios(rounds_of, summaries), "rounds": rounds_of}
    report(results, out)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20, help="measured seconds per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=float, default=3.0,
                        help="seconds of the same load before each measured window (a "
                             "server started fresh each round: what a fresh start serves)")
    parser.add_argument("--quick", action="store_true", help="5 s rounds, 2 s warm-up")
    parser.add_argument("--only", type=lambda s: [n.strip() for n in s.split(",") if n.strip()],
                        help=f"comma-separated subset of: {', '.join(PEERS)}")
    parser.add_argument("--resident", action="store_true",
                        help="start every server once, not once per round")
    parser.add_argument("--model", type=Path, default=None,
                        help="the demo model's SavedModel directory (default: models/demo "
                        "if built, else a new one in a temporary directory)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--wait-ms", type=int, default=MAX_WAIT_MS,
                        help="how long every server may wait to fill a batch (mosec's "
                        "max_wait_time, LitServe's batch_timeout, Ray's batch_wait_timeout_s, "
                        "tfsupervisor's batch_timeout_ms; tfsupervisor-nowait uses 0)")
    parser.add_argument("--also", type=lambda s: [n.strip() for n in s.split(",") if n.strip()],
                        default=[], help="NAME@MS,...: run server NAME again with its own "
                        "batch wait (e.g. mosec@1: each server at the wait it does best with)")
    parser.add_argument("--clients", type=int, default=CLIENTS,
                        help="concurrent clients (1: one caller waiting on each answer)")
    args = parser.parse_args()
    try:
        extra = [variant(spec).name for spec in args.also]
    except ValueError as exc:
        parser.error(str(exc))
    if extra:
        args.only = [*(args.only or [p for p in PEERS if p not in extra]), *extra]
    unknown = set(args.only or ()) - set(PEERS)
    if unknown:
        parser.error(f"unknown server(s) {', '.join(sorted(unknown))}; "
                     f"known: {', '.join(PEERS)}")
    seconds, warmup = (5.0, 2.0) if args.quick else (args.seconds, args.warmup)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the servers on the way out
    results = run(seconds, args.rounds, args.only, args.out, warmup, args.resident,
                  args.model, args.wait_ms, max(1, args.clients))
    for name, summary in results["servers"].items():
        print(name, json.dumps(summary))
    print("ratios", json.dumps(results["ratios"]))


if __name__ == "__main__":
    main()
