"""Side by side on a text workload: the demo text encoder on variable-length token ids.

The same SavedModel (``tfsupervisor demo-model --text``: 4 layers, width 128; token ids and
attention mask of any length in, a pooled embedding out), TF 1 thread per op, 2 workers,
batches up to 32 rows and a 5 ms wait wherever a server batches, served by:

- tfsupervisor: examples/text.yaml (jobs padded up to 16/32/64/128/256 tokens with a
  generated attention mask, every size warmed at 1 and 32 rows) with the same 5 ms wait,
  and (``tfsupervisor-adaptive``) as the example has it: the wait unset, so it adapts;
- mosec: 2 workers, ``max_batch_size=32``; each batch padded to its longest sequence (how a
  mosec user writes it); raw int32 ids in, raw float32 embedding out;
- LitServe: 2 workers, the same padding, JSON in and out, ``fast_queue=True``;
- the common per-request service: gunicorn, 2 sync workers, a WSGI app calling the loaded
  SavedModel once per request on the request's own shape (how such a service is commonly written);
- the compute ceiling: the same model in a tight loop, 2 processes, on full 32-row batches
  of the same traffic, each batch one padding size (no server, no client).

Traffic: batch-1 requests, lengths drawn from a skewed (log-normal) distribution, median 28
tokens, 4..256 (``lengths``). Two loads per server and round:

- closed loop: 32 clients (4 forked processes of 8 threads) for ``--seconds``, after a
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
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import yaml

from bench.common import write
from bench.mlp import free_port
from bench.peers import (
    LITSERVE_SERVER,
    LOAD,
    MOSEC_SERVER,
    Peer,
    cpu_between,
    fork_clients,
    installed,
    settle,
    stop_group,
    stopper,
    tail,
    tree,
    tree_cpu,
)
from supervisor.client import Client
from supervisor.testing import Supervisor, short_tmpdir, start_supervisor

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "text.yaml"
VOCAB = 8192
WIDTH = 128
MAX_LENGTH = 256
SIZES = (16, 32, 64, 128, 256)
CLIENTS, PROCESSES = 32, 4
OPEN_THREADS = 16  # per client process: at most 64 requests in flight
WAIT_MS = 5
BATCH = 32
START_TIMEOUT = 300.0
DRAIN_S = 30.0
MIB = 2**20


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


@dataclass
class Server:
    """A started server: its root process, how clients reach it, how to stop it."""

    name: str
    pid: int
    target: tuple[str, Any]  # ("tfsupervisor", endpoint) | ("raw" | "json", (port, path))
    stop: Callable[[], None]
    # (sent, rows, the share of rows computed that were padding) so far
    batches: Callable[[], tuple[int, float, float | None]] | None = None


PEERS: dict[str, Peer] = {p.name: p for p in (
    Peer("mosec", "mosec 2 workers, batch 32, padded to the batch's longest (raw bytes)",
         ("mosec",), MOSEC_SERVER, ("--address", "127.0.0.1", "--port", "{port}",
                                    "--log-level", "warning", "--timeout", "60000"),
         "/inference"),
    Peer("tfsupervisor", "tfsupervisor, examples/text.yaml (5 padding sizes, batch 32)", ()),
    Peer("tfsupervisor-adaptive", "tfsupervisor, the same without batch_timeout_ms (the "
         "wait adapts)", ()),
    Peer("litserve", "LitServe 2 workers, batch 32, padded to the batch's longest (JSON)",
         ("litserve",), LITSERVE_SERVER, path="/predict", body="json"),
    Peer("per_request", "gunicorn 2 sync workers, one model call per request",
         ("gunicorn",), WSGI_APP),
    Peer("ceiling", "compute ceiling: the model in a loop, 2 processes, full 32-row batches",
         ()),
)}


def env_for(model: Path, port: int = 0) -> dict[str, str]:
    return {**os.environ, "PEERS_MODEL": str(model), "PEERS_PORT": str(port),
            "PEERS_WAIT_MS": f"{WAIT_MS:g}", "PEERS_SIZES": json.dumps(SIZES),
            "PEERS_INPUTS": "input_ids,attention_mask", "PEERS_OUTPUT": "pooled",
            "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}


def example_config(model: Path, adaptive: bool = False) -> dict[str, Any]:
    """examples/text.yaml's model section on ``model``, as a user would serve it: with the
    peers' batch wait, or (``adaptive``) none set, so the wait adapts to the load."""
    text: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())["models"]["text"]
    text = {**text, "saved_model": str(model), "workers": 2}
    batching = {**text["batching"], "max_batch_size": BATCH, "batch_timeout_ms": WAIT_MS}
    if adaptive:
        del batching["batch_timeout_ms"]
    text["batching"] = batching
    return {"supervisor": {"poll_interval": "1s"}, "models": {"text": text}}


def start_tfsupervisor(model: Path, adaptive: bool) -> Server:
    sup: Supervisor = start_supervisor(example_config(model, adaptive))
    stop = stopper(sup)

    def batches() -> tuple[int, float, float | None]:
        sent = sup.status()["models"]["text"]["batches"]
        return sent["sent"], (sent["mean_rows"] or 0.0) * sent["sent"], sent["padding_share"]

    try:
        sup.wait_ready(timeout=START_TIMEOUT)
    except BaseException:
        stop()
        raise
    return Server("tfsupervisor", sup.process.pid, ("tfsupervisor", sup.endpoint), stop,
                  batches)


def start_script(peer: Peer, model: Path, workdir: Path) -> Server:
    """Write the peer's script, run it in its own process group, wait for a real answer."""
    module = f"text_{peer.name}"
    (workdir / f"{module}.py").write_text(textwrap.dedent(LOAD_MODEL)
                                          + textwrap.dedent(peer.script))
    port = free_port()
    if peer.name == "per_request":
        command = [str(Path(sys.executable).parent / "gunicorn"), "--workers", "2",
                   "--worker-class", "sync", "--bind", f"127.0.0.1:{port}", "--timeout", "120",
                   "--backlog", "2048", f"{module}:app"]
    else:
        command = [sys.executable, f"{module}.py", *(a.format(port=port) for a in peer.args)]
    log = workdir / f"{module}.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(command, cwd=workdir, env=env_for(model, port), stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    server = Server(peer.name, proc.pid, (peer.body, (port, peer.path)),
                    lambda: stop_group(proc))
    call = caller(server.target)
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{peer.name} exited {proc.returncode}: {tail(log)}")
        try:
            call(np.ones((1, 8), np.int32))
            return server
        except (OSError, RuntimeError, http.client.HTTPException, ValueError):
            if time.monotonic() > deadline:
                server.stop()
                raise RuntimeError(f"{peer.name} not answering: {tail(log)}") from None
            time.sleep(0.5)


# --- clients ----------------------------------------------------------------------------------

def caller(target: tuple[str, Any]) -> Callable[[np.ndarray], None]:
    """One request per call (a thread-local connection each); raises unless the answer is
    one embedding of the model's width."""
    kind, address = target
    local = threading.local()
    if kind == "tfsupervisor":
        def infer(ids: np.ndarray) -> None:
            client = getattr(local, "client", None) or Client(address, timeout=60)
            local.client = client
            out = client.infer("text", {"input_ids": ids})["pooled"]
            if out.shape != (1, WIDTH):
                raise RuntimeError(f"output shape {out.shape}")
        return infer
    port, path = address
    headers = {"Content-Type": "application/json" if kind == "json"
               else "application/octet-stream"}

    def post(ids: np.ndarray) -> None:
        conn = getattr(local, "conn", None) or http.client.HTTPConnection("127.0.0.1", port,
                                                                          timeout=60)
        local.conn = conn
        body = json.dumps({"input_ids": ids[0].tolist()}) if kind == "json" else ids.tobytes()
        try:
            conn.request("POST", path, body=body, headers=headers)
            response = conn.getresponse()
            data = response.read()
        except BaseException:
            conn.close()
            local.conn = None
            raise
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {data[:200]!r}")
        size = len(json.loads(data)["pooled"]) if kind == "json" else len(data) // 4
        if size != WIDTH:
            raise RuntimeError(f"answer of {size} values")
    return post


def requests(seed: int) -> Iterator[np.ndarray]:
    """An endless stream of one-row requests of the skewed lengths."""
    rng = np.random.default_rng(seed)
    while True:
        for n in lengths(1000, int(rng.integers(2**31))):
            yield rng.integers(1, VOCAB, (1, n)).astype(np.int32)


@dataclass
class Tally:
    latencies: list[float] = field(default_factory=list)
    failures: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, seconds: float | None) -> None:
        with self.lock:
            if seconds is None:
                self.failures += 1
            else:
                self.latencies.append(seconds)


def _closed(target: tuple[str, Any], seconds: float, threads: int, seed: int,
            out: Any) -> None:
    call, tally = caller(target), Tally()
    deadline = time.monotonic() + seconds

    def loop(stream: Iterator[np.ndarray]) -> None:
        for ids in stream:
            if time.monotonic() >= deadline:
                return
            start = time.perf_counter()
            try:
                call(ids)
                tally.add(time.perf_counter() - start)
            except Exception:
                tally.add(None)

    run_threads([threading.Thread(target=loop, args=(requests(seed * 100 + i),))
                 for i in range(threads)])
    out.put((tally.latencies, tally.failures))


def _open(target: tuple[str, Any], seconds: float, rate: float, seed: int, out: Any) -> None:
    """Poisson sends at ``rate``/s for ``seconds``; latency from each scheduled send."""
    call, tally = caller(target), Tally()
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate, int(rate * seconds * 2) + 10)
    offsets = np.cumsum(gaps)
    offsets = offsets[offsets < seconds]
    stream = requests(seed)
    schedule = iter([(float(t), next(stream)) for t in offsets])
    lock = threading.Lock()
    start = time.perf_counter() + 0.2
    drain_by = start + seconds + DRAIN_S

    def sender() -> None:
        while True:
            with lock:
                item = next(schedule, None)
            if item is None:
                return
            due, ids = start + item[0], item[1]
            if (ahead := due - time.perf_counter()) > 0:
                time.sleep(ahead)  # the schedule itself, not a wait for a condition
            if time.perf_counter() > drain_by:
                tally.add(None)
                continue
            try:
                call(ids)
                done = time.perf_counter()
                tally.add(done - due if done <= drain_by else None)
            except Exception:
                tally.add(None)

    run_threads([threading.Thread(target=sender) for _ in range(OPEN_THREADS)])
    out.put((tally.latencies, tally.failures))


def run_threads(threads: list[threading.Thread]) -> None:
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def fan_out(target_fn: Callable[..., None], args: Callable[[int], tuple[Any, ...]],
            timeout: float) -> Tally:
    """PROCESSES forked client processes' tallies, added up."""
    tally = Tally()
    for latencies, failures in fork_clients(target_fn, args, PROCESSES, timeout):
        tally.latencies += latencies
        tally.failures += failures
    return tally


def closed_loop(target: tuple[str, Any], seconds: float, seed: int) -> Tally:
    return fan_out(_closed, lambda i: (target, seconds, CLIENTS // PROCESSES, seed * 10 + i),
                   seconds + 300)


def open_loop(target: tuple[str, Any], seconds: float, rate: float, seed: int) -> Tally:
    return fan_out(_open, lambda i: (target, seconds, rate / PROCESSES, seed * 10 + i),
                   seconds + DRAIN_S + 300)


def pct(values: list[float], *qs: float) -> dict[str, float | None]:
    if not values:
        return {f"p{q:g}_ms": None for q in qs}
    array = np.array(values) * 1000
    return {f"p{q:g}_ms": round(float(np.percentile(array, q)), 1) for q in qs}


def memory(pid: int) -> dict[str, float]:
    """The tree's resident memory: all of it, and its largest process (a worker)."""
    sizes = []
    for proc in tree(pid):
        with suppress(psutil.Error):
            sizes.append(proc.memory_info().rss)
    return {"tree_mib": round(sum(sizes) / MIB, 1),
            "largest_mib": round(max(sizes, default=0) / MIB, 1)}


# --- rounds -----------------------------------------------------------------------------------

def serve_round(peer: Peer, model: Path, workdir: Path, seconds: float, open_seconds: float,
                warmup: float, rates: Callable[[float], list[float]], seed: int
                ) -> dict[str, Any]:
    server = start_tfsupervisor(model, peer.name.endswith("-adaptive")) \
        if peer.name.startswith("tfsupervisor") else start_script(peer, model, workdir)
    try:
        start_memory = memory(server.pid)
        closed_loop(server.target, warmup, seed)
        before = tree_cpu(server.pid)
        sent = server.batches() if server.batches else None
        tally = closed_loop(server.target, seconds, seed + 1)
        cpu = cpu_between(before, tree_cpu(server.pid))
        rows = len(tally.latencies)
        row: dict[str, Any] = {
            "rows": rows, "rows_s": round(rows / seconds, 1), "failures": tally.failures,
            **pct(tally.latencies, 50, 99), "cpu_s": round(cpu, 2),
            "rows_per_cpu_s": round(rows / cpu, 1) if cpu else None,
            "memory_start": start_memory}
        if sent and server.batches:
            now = server.batches()
            row["mean_rows_per_batch"] = round((now[1] - sent[1]) / max(1, now[0] - sent[0]), 2)
            row["padding_share"] = now[2]  # since the start, warm-up load included
        row["open"] = []
        for rate in rates(row["rows_s"]):
            done = open_loop(server.target, open_seconds, rate, seed + 2)
            row["open"].append({"rate": round(rate, 1), "answered": len(done.latencies),
                                "failures": done.failures,
                                **pct(done.latencies, 50, 99, 99.9)})
        row["memory_end"] = memory(server.pid)
        return row
    finally:
        server.stop()


def ceiling_round(model: Path, workdir: Path, seconds: float, seed: int) -> dict[str, Any]:
    """Two loop processes side by side (the servers' 2 workers), each on its own traffic."""
    script = workdir / "text_ceiling.py"
    script.write_text(textwrap.dedent(LOAD_MODEL) + textwrap.dedent(CEILING))
    procs = []
    for i in range(2):
        stream = workdir / f"lengths_{i}.npy"
        np.save(stream, lengths(20_000, seed * 10 + i))
        procs.append(subprocess.Popen([sys.executable, str(script), str(stream), str(seconds),
                                       str(seed + i)], cwd=workdir, env=env_for(model),
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
    peers = [PEERS[n] for n in names if not PEERS[n].modules or installed(PEERS[n])]
    skipped = [n for n in names if n not in {p.name for p in peers}]
    workdir = short_tmpdir()
    print(f"scripts, logs and the model: {workdir}", flush=True)
    model = workdir / "text_model"
    subprocess.run([sys.executable, "-m", "worker.demo_text", str(model)], check=True,
                   env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    results: dict[str, list[dict[str, Any]]] = {p.name: [] for p in peers}
    for r in range(rounds):
        rates = Rates(fractions)
        for peer in peers:
            print(f"round {r + 1}/{rounds}: {peer.name}", flush=True)
            busy = settle()
            try:
                row = ceiling_round(model, workdir, seconds, 1000 * r) \
                    if peer.name == "ceiling" else \
                    serve_round(peer, model, workdir, seconds, open_seconds, warmup, rates,
                                1000 * r)
            except Exception as exc:
                row = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
            row["machine_busy_before_pct"] = busy
            print(json.dumps(row), flush=True)
            results[peer.name].append(row)
    payload = {"rounds": results, "rounds_run": rounds, "seconds": seconds,
               "open_seconds": open_seconds, "fractions": fractions, "clients": CLIENTS,
               "wait_ms": WAIT_MS, "max_batch_size": BATCH, "sizes": SIZES,
               "skipped (not installed)": skipped, "summary": summarize(results)}
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
