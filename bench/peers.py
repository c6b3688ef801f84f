"""Side by side: the demo MLP SavedModel behind tfsupervisor and behind three peer servers.

The same SavedModel (64 float32 features -> 1 probability), loaded with
``tf.saved_model.load`` and called through ``serving_default`` with TF's intra/inter-op
threads set to 1, served with 2 workers and dynamic batching up to 32 rows by:

- tfsupervisor: ``supervisor.testing.start_supervisor``, configured as bench/mlp.py does
  (batches padded to powers of two, no added wait); clients use ``supervisor.client.Client``.
- mosec: Rust HTTP broker, 2 Python workers, ``max_batch_size=32``, ``max_wait_time`` 5 ms;
  raw float32 bytes in and out.
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
for ``--seconds`` per round; each HTTP client thread keeps one ``http.client.HTTPConnection``
alive, each tfsupervisor client thread uses its ``Client``'s own socket. Before each
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
import http.client
import importlib.util
import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from bench.common import percentiles, write
from bench.mlp import CLIENTS, PROCESSES, build_model, drive, free_port, supervisor_config
from supervisor.client import Client
from supervisor.testing import Supervisor, short_tmpdir, start_supervisor

ROOT = Path(__file__).resolve().parent.parent
FEATURES = 64
MAX_WAIT_MS = 5
START_TIMEOUT = 300.0
SKIPPED = "skipped (not installed)"
CONCURRENT = CLIENTS  # concurrent clients (--clients)
# Rough resident memory of one server (2 TF workers and its broker); Ray's daemons more.
RESIDENT_BYTES = 2 * 2**30

# --- the peers' server scripts ------------------------------------------------------------

# Every peer loads and calls the model as tfsupervisor's worker does (worker/runners.py):
# its inputs, in order, and the output it answers with are $PEERS_INPUTS and $PEERS_OUTPUT
# (the MLP's by default; bench/text_peers.py serves the text encoder with the same loader).
LOAD = '''
import os
import signal
import sys
import time

import numpy as np


def load_model():
    """serving_default of the SavedModel at $PEERS_MODEL, called on one batch per input."""
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    loaded = tf.saved_model.load(os.environ["PEERS_MODEL"])
    fn = loaded.signatures["serving_default"]
    names = os.environ.get("PEERS_INPUTS", "features").split(",")
    output = os.environ.get("PEERS_OUTPUT", "output_0")

    def call(*arrays):
        return fn(**{n: tf.constant(a) for n, a in zip(names, arrays)})[output].numpy()

    call.keepalive = loaded  # the signature's variables live as long as the object
    return call
'''

LOAD_MODEL = LOAD + '''

def forward_raw(call, rows):
    """A batch of raw request bodies (float32 rows) in, raw answers (float32) out."""
    x = np.frombuffer(b"".join(rows), np.float32).reshape(len(rows), -1)
    return [row.tobytes() for row in call(x)]


def from_json(request):
    return np.asarray(request["features"], np.float32)


def predict_rows(call, rows):
    return call(np.stack(rows))


def to_json(output):
    return {"probability": float(output[0])}
'''

# Shared with bench/text_peers.py, whose LOAD_MODEL defines its own forward_raw, from_json,
# predict_rows and to_json. Each script defines ``Model``.
MOSEC_MAIN = '''

if __name__ == "__main__":
    server = Server()
    server.append_worker(Model, num=2, max_batch_size=32,
                         max_wait_time=int(float(os.environ["PEERS_WAIT_MS"])))
    server.run()
'''

LITSERVE_MAIN = '''

if __name__ == "__main__":
    api = Model(max_batch_size=32, batch_timeout=float(os.environ["PEERS_WAIT_MS"]) / 1000)
    server = ls.LitServer(api, accelerator="cpu", devices=1, workers_per_device=2, timeout=60,
                          fast_queue=True)
    server.run(host="127.0.0.1", port=int(os.environ["PEERS_PORT"]), log_level="warning",
               generate_client_file=False)
'''

MOSEC_SERVER = '''
from mosec import Server, Worker


class Model(Worker):
    resp_mime_type = "application/octet-stream"

    def __init__(self):
        super().__init__()
        self.call = load_model()

    def deserialize(self, data):
        return data

    def serialize(self, data):
        return data

    def forward(self, data):
        return forward_raw(self.call, data)

''' + MOSEC_MAIN

LITSERVE_SERVER = '''
import litserve as ls


class Model(ls.LitAPI):
    def setup(self, device):
        self.call = load_model()

    def decode_request(self, request):
        return from_json(request)

    def batch(self, inputs):
        return inputs

    def predict(self, rows):
        return predict_rows(self.call, rows)

    def unbatch(self, output):
        return list(output)

    def encode_response(self, output):
        return to_json(output)

''' + LITSERVE_MAIN

RAY_SERVER = '''
import ray
from ray import serve
from starlette.requests import Request
from starlette.responses import Response


@serve.deployment(num_replicas=2, max_ongoing_requests=32, ray_actor_options={"num_cpus": 0})
class MLP:
    def __init__(self):
        self.call = load_model()

    @serve.batch(max_batch_size=32,
                 batch_wait_timeout_s=float(os.environ["PEERS_WAIT_MS"]) / 1000)
    async def infer(self, rows):
        x = np.frombuffer(b"".join(rows), np.float32).reshape(len(rows), -1)
        return [row.tobytes() for row in self.call(x)]

    async def __call__(self, request: Request) -> Response:
        return Response(await self.infer(await request.body()),
                        media_type="application/octet-stream")


def stop(*_):
    raise SystemExit(0)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, stop)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             object_store_memory=200 * 2**20)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": int(os.environ["PEERS_PORT"])})
        serve.run(MLP.bind(), route_prefix="/")
        while True:
            time.sleep(3600)
    finally:
        serve.shutdown()
        ray.shutdown()
'''


# --- servers --------------------------------------------------------------------------------

@dataclass
class Peer:
    """One server under test: what it needs to import, and how to run and reach it."""

    name: str
    label: str
    modules: tuple[str, ...]  # all must import (as must tensorflow, for every server)
    script: str = ""  # a peer's server script (after LOAD_MODEL); "" for tfsupervisor
    args: tuple[str, ...] = ()  # the script's arguments; {port} is substituted
    path: str = "/"  # HTTP route
    body: str = "raw"  # "raw": float32 bytes in and out; "json": {"features": [...]}
    wait_ms: float | None = None  # its batch wait; None: the run's --wait-ms


def variant(spec: str) -> Peer:
    """``NAME@MS``: server NAME again with its own batch wait of MS milliseconds (each
    server at the wait it does best with, beside the common one), registered in PEERS."""
    name, _, ms = spec.partition("@")
    if name not in PEERS or not ms:
        raise ValueError(f"--also takes NAME@MS with NAME one of {', '.join(PEERS)}: {spec!r}")
    wait = float(ms)
    base = PEERS[name]
    peer = replace(base, name=f"{name}@{wait:g}ms", label=f"{base.label}, wait {wait:g} ms",
                   wait_ms=wait)
    PEERS[peer.name] = peer
    return peer


def wait_of(peer: Peer) -> float:
    if peer.wait_ms is not None:
        return peer.wait_ms
    return 0.0 if peer.name.endswith("-nowait") else float(MAX_WAIT_MS)


PEERS: dict[str, Peer] = {p.name: p for p in (
    Peer("tfsupervisor", "tfsupervisor (ZeroMQ, batching 32, the same wait)", ()),
    Peer("tfsupervisor-nowait", "tfsupervisor, batch_timeout_ms 0", ()),
    Peer("tfsupervisor-default", "tfsupervisor, batch_timeout_ms not set (its default: "
         "adaptive)", ()),
    Peer("mosec", "mosec 2 workers, batch 32 (raw bytes)", ("mosec",),
         MOSEC_SERVER, ("--address", "127.0.0.1", "--port", "{port}", "--log-level",
                        "warning", "--timeout", "60000"), "/inference"),
    Peer("litserve", "LitServe 2 workers, batch 32 (JSON)", ("litserve",),
         LITSERVE_SERVER, path="/predict", body="json"),
    Peer("ray", "Ray Serve 2 replicas, batch 32 (raw bytes)", ("ray.serve",),
         RAY_SERVER),
)}


def installed(peer: Peer) -> bool:
    """Whether TensorFlow is installed and the peer's packages import (in a subprocess: the
    bench itself imports none of them, and the servers run with the same Python)."""
    if importlib.util.find_spec("tensorflow") is None:
        return False
    if not peer.modules:
        return True
    code = "import importlib, sys\nfor m in sys.argv[1:]: importlib.import_module(m)"
    try:
        done = subprocess.run([sys.executable, "-c", code, *peer.modules],
                              capture_output=True, timeout=180)
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0


@dataclass
class Running:
    """A started server: its root process, what clients connect to, how to stop it."""

    peer: Peer
    pid: int
    target: tuple[str, Any]
    stop: Callable[[], None]
    log: Path


def tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def tree_cpu(pid: int) -> dict[tuple[int, float], float]:
    """User + system CPU seconds of each live process of the tree, keyed by (pid, start)."""
    seconds = {}
    for proc in tree(pid):
        try:
            with proc.oneshot():
                times = proc.cpu_times()
                seconds[proc.pid, proc.create_time()] = times.user + times.system
        except psutil.Error:
            pass
    return seconds


def cpu_between(before: dict[tuple[int, float], float],
                after: dict[tuple[int, float], float]) -> float:
    """CPU seconds spent between two reads by the processes present in both."""
    return sum(after[key] - before[key] for key in before.keys() & after.keys())


def kill_leftovers(family: list[psutil.Process]) -> None:
    for proc in family:
        with suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(family, timeout=10)


def stop_group(proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    """SIGTERM the server, then SIGKILL its process group after ``timeout`` (or at once if
    it exited), and any descendant that left the group (a daemon calling setsid)."""
    family = tree(proc.pid)[1:]
    if proc.poll() is None:
        proc.terminate()
        with suppress(subprocess.TimeoutExpired):
            proc.wait(timeout)
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    kill_leftovers(family)


def stopper(sup: Supervisor) -> Callable[[], None]:
    """Stops the supervisor, then kills whatever of its process tree is left."""
    def stop() -> None:
        family = tree(sup.process.pid)[1:]
        try:
            sup.stop(timeout=30)
        finally:
            kill_leftovers(family)
    return stop


def start_tfsupervisor(peer: Peer, model: Path) -> Running:
    """tfsupervisor with the peers' batch wait, (``-nowait``) none, or (``-default``) its
    default: the wait adapts to the load."""
    config = supervisor_config(model, batching=True)
    # The product's default poll (start_supervisor's 0.2 s, for tests, polls and scans the
    # workers' process trees five times as often).
    config["supervisor"] = {"poll_interval": "1s"}
    if not peer.name.endswith("-default"):  # the default: not set, the wait adapts
        config["models"]["mlp"]["batching"]["batch_timeout_ms"] = wait_of(peer)
    sup: Supervisor = start_supervisor(config)
    stop = stopper(sup)
    try:
        sup.wait_ready(timeout=START_TIMEOUT)
    except BaseException:
        stop()
        raise
    return Running(peer, sup.process.pid, ("tfsupervisor", sup.endpoint),
                   stop, sup.log_path)


def start_script(peer: Peer, model: Path, workdir: Path) -> Running:
    """Write the peer's server script, run it in its own process group, wait until a real
    request is answered."""
    script = workdir / f"{peer.name}_server.py"
    script.write_text(textwrap.dedent(LOAD_MODEL) + textwrap.dedent(peer.script))
    port = free_port()
    log = workdir / f"{peer.name}.log"
    env = {**os.environ, "PEERS_MODEL": str(model), "PEERS_PORT": str(port),
           "PEERS_WAIT_MS": f"{wait_of(peer):g}", "TF_CPP_MIN_LOG_LEVEL": "2",
           "PYTHONUNBUFFERED": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    args = [a.format(port=port) for a in peer.args]
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, str(script), *args], cwd=workdir, env=env,
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    running = Running(peer, proc.pid, (peer.body, (port, peer.path)),
                      lambda: stop_group(proc), log)
    try:
        wait_answering(running, proc)
    except BaseException:
        running.stop()
        raise
    return running


def wait_answering(running: Running, proc: subprocess.Popen[bytes]) -> None:
    call = caller(running.target)
    x = np.zeros((1, FEATURES), np.float32)
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{running.peer.name} exited {proc.returncode} while starting: "
                               + tail(running.log))
        try:
            call(x)
            return
        except (OSError, RuntimeError, http.client.HTTPException, ValueError):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{running.peer.name} not answering after "
                                   f"{START_TIMEOUT:.0f} s: " + tail(running.log)) from None
            time.sleep(0.5)


def tail(log: Path, chars: int = 1500) -> str:
    text = log.read_text(errors="replace") if log.exists() else ""
    return text[-chars:].strip()


def start(peer: Peer, model: Path, workdir: Path) -> Running:
    if peer.name.startswith("tfsupervisor"):
        return start_tfsupervisor(peer, model)
    return start_script(peer, model, workdir)


# --- clients ----------------------------------------------------------------------------------

class HttpCaller:
    """POSTs one row per call on a keep-alive connection per thread (reopened after an
    error); raises unless the answer is 200 with one probability."""

    def __init__(self, port: int, path: str, body: str) -> None:
        self.port, self.path, self.json = port, path, body == "json"
        self.headers = {"Content-Type": "application/json" if self.json
                        else "application/octet-stream"}
        self.local = threading.local()

    def __call__(self, x: np.ndarray) -> float:
        conn: http.client.HTTPConnection | None = getattr(self.local, "conn", None)
        if conn is None:
            conn = self.local.conn = http.client.HTTPConnection("127.0.0.1", self.port,
                                                                timeout=60)
        body = json.dumps({"features": x[0].tolist()}) if self.json else x.tobytes()
        try:
            conn.request("POST", self.path, body=body, headers=self.headers)
            response = conn.getresponse()
            data = response.read()
        except BaseException:
            conn.close()
            self.local.conn = None
            raise
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {data[:200]!r}")
        if self.json:
            return float(json.loads(data)["probability"])
        [y] = np.frombuffer(data, np.float32)
        return float(y)


def caller(target: tuple[str, Any]) -> Callable[[np.ndarray], Any]:
    kind, address = target
    if kind == "tfsupervisor":
        client = Client(address, timeout=60)

        def infer(x: np.ndarray) -> Any:
            out = client.infer("mlp", {"features": x})["output_0"]
            if out.shape != (1, 1):
                raise RuntimeError(f"output shape {out.shape}")
            return out

        return infer
    port, path = address
    return HttpCaller(port, path, kind)


@dataclass
class Load:
    """What the client processes did in one window."""

    latencies: list[float] = field(default_factory=list)
    failures: int = 0
    cpu: float = 0.0  # the client processes' CPU seconds


def _client_process(target: tuple[str, Any], seconds: float, threads: int, out: Any) -> None:
    call = caller(target)
    me = psutil.Process()
    before = me.cpu_times()
    run = drive(call, seconds, threads)
    after = me.cpu_times()
    cpu = after.user + after.system - before.user - before.system
    out.put(([t for _, t in run.latencies], run.failures, cpu))


def load(target: tuple[str, Any], seconds: float) -> Load:
    """CONCURRENT batch-1 callers in up to PROCESSES forked client processes."""
    processes = min(PROCESSES, CONCURRENT)
    clients = CONCURRENT
    result = Load()
    for latencies, failures, cpu in fork_clients(
            _client_process, lambda _: (target, seconds, clients // processes), processes,
            seconds + 300):
        result.latencies += latencies
        result.failures += failures
        result.cpu += cpu
    return result


def fork_clients(run: Callable[..., None], args: Callable[[int], tuple[Any, ...]],
                 processes: int, timeout: float) -> list[Any]:
    """What each of ``processes`` forked processes put on its queue: process i runs
    ``run(*args(i), queue)`` (forked: the bench process never imports TensorFlow)."""
    context = mp.get_context("fork")
    out = context.Queue()
    procs = [context.Process(target=run, args=(*args(i), out)) for i in range(processes)]
    for proc in procs:
        proc.start()
    try:  # read before joining: a child blocks until its results are taken
        return [out.get(timeout=timeout) for _ in procs]
    finally:
        for proc in procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
                proc.join()


# --- rounds -----------------------------------------------------------------------------------

def measure(running: Running, seconds: float, warmup: float,
            others: list[Running]) -> dict[str, Any]:
    """One measured window on a started server (after ``warmup`` seconds of the same load)."""
    load(running.target, warmup)
    server_before = tree_cpu(running.pid)
    others_before = [tree_cpu(o.pid) for o in others]
    wall = time.monotonic()
    done = load(running.target, seconds)
    wall = time.monotonic() - wall
    server = cpu_between(server_before, tree_cpu(running.pid))
    background = sum(cpu_between(b, tree_cpu(o.pid)) for b, o in zip(others_before, others,
                                                                     strict=True))
    n = len(done.latencies)
    return {"requests": n, "req_s": round(n / seconds, 1), "failures": done.failures,
            **percentiles(done.latencies),
            "server_cpu_us": round(server / n * 1e6, 1) if n else None,
            "client_cpu_us": round(done.cpu / n * 1e6, 1) if n else None,
            "server_cpu_s": round(server, 3), "client_cpu_s": round(done.cpu, 3),
            "server_processes": len(server_before), "window_s": round(wall, 2),
            "others_cpu_pct": round(background / wall * 100, 1) if others else None,
            "latencies": done.latencies}


@contextmanager
def started(peer: Peer, model: Path, workdir: Path) -> Iterator[Running]:
    running = start(peer, model, workdir)
    try:
        yield running
    finally:
        running.stop()


def failed(exc: BaseException) -> dict[str, Any]:
    return {"error": f"{type(exc).__name__}: {exc}"[:2000]}


def rounds_restarting(peers: list[Peer], model: Path, workdir: Path, rounds: int,
                      seconds: float, warmup: float) -> dict[str, list[dict[str, Any]]]:
    """Each round, each server in turn: start, warm up, measure, stop."""
    results: dict[str, list[dict[str, Any]]] = {p.name: [] for p in peers}
    for r in range(rounds):
        for peer in peers:
            print(f"round {r + 1}/{rounds}: {peer.name}", flush=True)
            busy = settle()
            try:
                with started(peer, model, workdir) as running:
                    results[peer.name].append({**measure(running, seconds, warmup, []),
                                               "machine_busy_before_pct": busy})
            except Exception as exc:
                results[peer.name].append(failed(exc))
    return results


# The machine counts as settled once its CPU use over half a second is below this; a server
# that was just stopped (LitServe's and Ray's process trees take seconds to go) must not
# share the cores with the next one's round.
SETTLED_PCT = 15.0
SETTLE_MAX_S = 30.0


def settle() -> float:
    """Wait (at most SETTLE_MAX_S) until the whole machine is nearly idle; its CPU use over
    the last half second, in percent of all cores, is returned and kept with the round."""
    deadline = time.monotonic() + SETTLE_MAX_S
    while (busy := psutil.cpu_percent(interval=0.5)) > SETTLED_PCT and \
            time.monotonic() < deadline:
        pass
    return busy


def rounds_resident(peers: list[Peer], model: Path, workdir: Path, rounds: int,
                    seconds: float, warmup: float) -> dict[str, list[dict[str, Any]]]:
    """Every server started once; each round measures them in turn while the others idle."""
    results: dict[str, list[dict[str, Any]]] = {p.name: [] for p in peers}
    with ExitStack() as stack:
        up: dict[str, Running] = {}
        for peer in peers:
            print(f"starting {peer.name}", flush=True)
            try:
                up[peer.name] = stack.enter_context(started(peer, model, workdir))
            except Exception as exc:
                results[peer.name] = [failed(exc)] * rounds
        for r in range(rounds):
            for name, running in up.items():
                print(f"round {r + 1}/{rounds}: {name}", flush=True)
                others = [o for o in up.values() if o is not running]
                try:
                    results[name].append(measure(running, seconds, warmup, others))
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
    """tfsupervisor's req/s over each peer's: of the means, and per round (measured minutes
    apart at most, so the pairs share the machine's state)."""
    ours = summaries.get("tfsupervisor", {})
    if "req_s_mean" not in ours:
        return {}
    out = {}
    for name, summary in summaries.items():
        if name.startswith("tfsupervisor") or "req_s_mean" not in summary:
            continue
        paired = [a["req_s"] / b["req_s"]
                  for a, b in zip(rounds["tfsupervisor"], rounds[name], strict=False)
                  if a.get("req_s") and b.get("req_s")]
        out[name] = {"mean": round(ours["req_s_mean"] / summary["req_s_mean"], 2),
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
    said = [f"**{v['mean']}x** {k}" + (f" (rounds {span(v['rounds'], 2)})"
                                        if len(v["rounds"]) > 1 else "")
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
        "req/s ratio tfsupervisor : peer: " + (", ".join(said) or "none") + ".")
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
        warmup: float = 3.0, resident: bool = False, model: Path | None = None
        ) -> dict[str, Any]:
    """Measure the servers named in ``only`` (default all); write peers.json and peers.md.
    ``resident``: start each server once (if the memory allows), not once per round."""
    names = only or list(PEERS)
    unknown = set(names) - set(PEERS)
    if unknown:
        raise ValueError(f"unknown server(s) {sorted(unknown)}; known: {', '.join(PEERS)}")
    peers: list[Peer] = []
    skipped: list[Peer] = []
    for name in names:
        (peers if installed(PEERS[name]) else skipped).append(PEERS[name])
    if resident and psutil.virtual_memory().available < RESIDENT_BYTES * (len(peers) + 1):
        print("not enough memory for resident servers: starting them per round", flush=True)
        resident = False
    rounds_of: dict[str, list[dict[str, Any]]] = {}
    if peers:
        model = resolve_model(model)
        workdir = short_tmpdir()  # the servers' scripts and logs stay there
        print(f"servers' scripts and logs: {workdir}", flush=True)
        measure_rounds = rounds_resident if resident else rounds_restarting
        rounds_of = measure_rounds(peers, model, workdir, rounds, seconds, warmup)
    summaries = {p.name: summarize(rounds_of[p.name]) for p in peers}
    summaries.update({p.name: {"status": SKIPPED} for p in skipped})
    summaries = {name: summaries[name] for name in names}
    for rows in rounds_of.values():
        for row in rows:
            row.pop("latencies", None)
    results = {"seconds": seconds, "warmup_seconds": warmup, "rounds_run": rounds,
               "clients": CONCURRENT, "processes": min(PROCESSES, CONCURRENT),
               "mode": "resident servers" if resident else "servers started per round",
               "max_wait_ms": MAX_WAIT_MS, "servers": summaries,
               "ratios": ratios(rounds_of, summaries), "rounds": rounds_of}
    report(results, out)
    return results


def main() -> None:
    global MAX_WAIT_MS, CONCURRENT
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20, help="measured seconds per round")
    parser.add_argument("--rounds", type=int, default=3)
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
    MAX_WAIT_MS, CONCURRENT = args.wait_ms, max(1, args.clients)
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
    seconds, warmup = (5.0, 2.0) if args.quick else (args.seconds, 3.0)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the servers on the way out
    results = run(seconds, args.rounds, args.only, args.out, warmup, args.resident,
                  args.model)
    for name, summary in results["servers"].items():
        print(name, json.dumps(summary))
    print("ratios", json.dumps(results["ratios"]))


if __name__ == "__main__":
    main()
