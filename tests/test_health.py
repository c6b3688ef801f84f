"""/livez and /readyz: the rule on a fake clock, then a live daemon over real HTTP through
start-up, ready, a recycle, a model that cannot load and a drain (each answer against what
`status --ready` says at that moment), a loop stuck on purpose, idle, trickling and
flooding clients all at once (no probe may fail), and the Dockerfile's HEALTHCHECK run as
it is written; the listener alone for its paths, methods, pacing and deadline."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Counter, make_wsgi_app

from bench.dockerfile import healthcheck
from supervisor.client import JobError, control
from supervisor.daemon import listener
from supervisor.daemon.health import LIVENESS_TIMEOUT, MAX_MODELS, Health, not_ready_reason
from supervisor.daemon.listener import (
    DEADLINE,
    MAX_CONNECTIONS,
    METRICS_BURST,
    METRICS_RATE,
    Pace,
)
from supervisor.testing import free_port
from tests.conftest import echo_model, start_supervisor
from tests.test_container import wait_until

REPO = Path(__file__).resolve().parent.parent
SLOW = 7.0  # a job marked so sleeps in its worker: the drain has it in flight
SECRET = "s3cr3t-token-in-a-load-error"


def get(port: int, path: str, timeout: float = 10.0, method: str = "GET") -> tuple[int, str]:
    """(status, body); (0, why) when the connection fails or is closed unanswered."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path)
        response = conn.getresponse()
        return response.status, response.read().decode()
    except (OSError, http.client.HTTPException) as exc:
        return 0, repr(exc)
    finally:
        conn.close()


# --- the rule, on a fake clock -----------------------------------------------------------------

def report(*, serving: bool = True, ready: bool = True, stopping: bool = False,
           **models: list[str]) -> dict[str, Any]:
    return {"serving": serving, "ready": ready, "stopping": stopping, "models": {
        name: {"required": True, "removed": False, "workers": [{"state": s} for s in states],
               "failing_to_start": name == "bad", "last_error": SECRET}
        for name, states in models.items()}}


def test_answers_from_what_the_loop_published() -> None:
    clock = [100.0]
    health = Health(100.0, lambda: clock[0])
    # Start-up: alive (the loop has its first turns to take), not ready.
    assert health.answer("/livez", "") == (200, "alive")
    assert health.answer("/readyz", "") == (
        503, "not ready: starting: not every required model has had its ready workers yet")
    health.publish(report(m=["ready", "starting"], bad=["starting"], ready=True))
    assert health.answer("/readyz", "") == (200, "ready")
    assert health.answer("/readyz", "model=m") == (200, "ready")
    code, body = health.answer("/readyz", "model=m&model=bad")
    assert code == 503 and body.startswith("not ready: no ready worker for 'bad' (1 starting")
    assert SECRET not in body and "failing to start" in body  # the error text stays home
    assert SECRET in (not_ready_reason(health.report, ["bad"]) or "")  # status has it
    assert health.answer("/readyz", "model=nosuch")[1] == \
        "not ready: this supervisor does not serve 'nosuch' (it serves bad, m)"
    # The loop stalls: both fail once it has been silent longer than the bound.
    clock[0] += LIVENESS_TIMEOUT
    assert health.answer("/livez", "")[0] == 200
    clock[0] += 0.5
    assert health.answer("/livez", "") == (503, "not alive: the main loop has not completed a "
                                           f"turn for {LIVENESS_TIMEOUT + 0.5:.1f}s (bound "
                                           f"{LIVENESS_TIMEOUT:g}s)")
    assert health.answer("/readyz", "")[1].startswith("not alive: ")
    health.turned(clock[0])
    assert health.answer("/livez", "") == (200, "alive")
    # A drain: not ready from that moment, whatever the last report said; still alive.
    health.stop()
    assert health.answer("/readyz", "model=m") == (503, "not ready: the supervisor is "
                                                   "stopping (draining: new jobs are answered "
                                                   "shutting_down)")
    assert health.answer("/livez", "") == (200, "alive")


@pytest.mark.parametrize(("path", "query", "told"), [
    ("/readyz", "models=m", "unknown parameter 'models': /readyz takes model=NAME"),
    ("/readyz", "model", "bad query 'model': /readyz takes model=NAME"),
    ("/readyz", "&".join(["model=m"] * (MAX_MODELS + 1)), f"at most {MAX_MODELS} times"),
    ("/livez", "model=m", "unknown parameter 'model': /livez takes none"),
    ("/readyz", "x" * 500 + "=1", "unknown parameter '" + "x" * 64 + "'"),
])
def test_a_bad_query_is_told_in_one_short_line(path: str, query: str, told: str) -> None:
    code, body = Health(0.0, lambda: 0.0).answer(path, query)
    assert code == 400 and told in body and "\n" not in body and len(body) < 200, body


def test_the_pace_lets_a_burst_through_then_one_request_per_tick() -> None:
    clock = [0.0]
    pace = Pace(10.0, 3, lambda: clock[0])
    assert [pace.allow() for _ in range(4)] == [True, True, True, False]  # the burst
    clock[0] += 0.1
    assert [pace.allow() for _ in range(2)] == [True, False]
    clock[0] += 10.0  # quiet for a while: the bucket fills up to the burst, no further
    assert [pace.allow() for _ in range(4)] == [True, True, True, False]


@pytest.fixture
def bare() -> Any:
    """The listener alone on a free port (real sockets), a ready report published, and a
    registry with one counter behind /metrics."""
    health = Health(time.monotonic())
    health.publish(report(m=["ready"]))
    registry = CollectorRegistry()
    Counter("probe_test", "a counter", registry=registry).inc()
    server = listener.serve("127.0.0.1:0", listener.routes(make_wsgi_app(registry), health))
    yield server.sock.getsockname()[1]
    server.close()


@pytest.mark.parametrize(("method", "path", "code", "body"), [
    ("GET", "/livez", 200, "alive\n"),
    ("HEAD", "/livez", 200, ""),
    ("HEAD", "/readyz?model=m", 200, ""),
    ("GET", "/readyz?model=m&", 200, "ready\n"),
    ("GET", "/readyz?&model=m&&", 200, "ready\n"),
    ("POST", "/livez", 405, "/livez answers GET and HEAD only\n"),
    ("GET", "/livez/", 404, "no '/livez/' here: /metrics, /livez, /readyz\n"),
    ("GET", "/healthz", 404, "no '/healthz' here: /metrics, /livez, /readyz\n"),
    ("GET", "/READYZ", 404, "no '/READYZ' here: /metrics, /livez, /readyz\n"),
    ("GET", "/readyz/../metrics", 404, "no '/readyz/../metrics' here: /metrics, /livez, "
                                       "/readyz\n"),
    ("HEAD", "/nosuch", 404, ""),
])
def test_paths_and_methods(bare: int, method: str, path: str, code: int, body: str) -> None:
    assert get(bare, path, method=method) == (code, body)


def test_metrics_are_served_at_metrics_and_root_and_paced(bare: int) -> None:
    for path in ("/metrics", "/"):
        code, body = get(bare, path)
        assert code == 200 and "probe_test_total 1.0" in body, body
    assert get(bare, "/metrics", method="HEAD") == (200, "")
    # Past the burst, scrapes wait for their turn (METRICS_RATE a second) while probes are
    # answered at once, unpaced.
    scrapes: list[tuple[int, str]] = []
    flood = threading.Thread(target=lambda: scrapes.extend(
        get(bare, "/metrics") for _ in range(3 * METRICS_BURST)))
    flood.start()
    while flood.is_alive():
        started = time.monotonic()
        assert get(bare, "/livez") == (200, "alive\n")
        assert time.monotonic() - started < DEADLINE / 2  # not behind the waiting scrapes
    flood.join()
    assert {code for code, _ in scrapes} == {200}
    # Many scrapers at once: those whose turn does not come within the DEADLINE are closed.
    many: list[int] = []
    threads = [threading.Thread(target=lambda: many.append(get(bare, "/metrics")[0]))
               for _ in range(int(METRICS_RATE * DEADLINE) + 2 * METRICS_BURST)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert set(many) == {0, 200} and many.count(200) >= METRICS_BURST, many


def test_a_trickling_client_is_closed_at_the_deadline_from_accept(bare: int) -> None:
    """One header line every 0.2 s (well within any per-read timeout) still ends DEADLINE
    after the accept, answered or not."""
    with socket.create_connection(("127.0.0.1", bare)) as sock:
        started = time.monotonic()
        sock.sendall(b"GET /livez HTTP/1.1\r\n")
        closed = None
        while closed is None and time.monotonic() - started < DEADLINE + 10:
            try:
                sock.sendall(b"X-Slow: 1\r\n")
                sock.settimeout(0.2)
                if sock.recv(1) == b"":
                    closed = time.monotonic() - started
            except TimeoutError:
                continue
            except OSError:
                closed = time.monotonic() - started
        assert closed is not None and DEADLINE - 0.1 <= closed < DEADLINE + 1.5, closed


def test_a_request_head_over_the_bound_is_refused(bare: int) -> None:
    with socket.create_connection(("127.0.0.1", bare), timeout=5) as sock:
        sock.sendall(b"GET /livez HTTP/1.1\r\nX: " + b"x" * listener.MAX_HEAD + b"\r\n\r\n")
        assert sock.recv(100).startswith(b"HTTP/1.1 431 ")


# --- a live daemon over HTTP -------------------------------------------------------------------

def agreed(sup: Any, port: int, models: list[str]) -> tuple[int, str]:
    """/readyz?model=... and `status --ready --model ...` (the rule on the status report)
    giving the same answer; they are read a moment apart, so until they do (the published
    report is at most a poll old)."""
    query = "&".join(f"model={m}" for m in models)

    def same() -> tuple[int, str] | None:
        code, body = get(port, "/readyz" + (f"?{query}" if query else ""))
        reason = not_ready_reason(sup.status(), models or None, errors=False)
        expected = (200, "ready\n") if reason is None else (503, f"not ready: {reason}\n")
        return (code, body) if (code, body) == expected else None

    found: tuple[int, str] = wait_until(same, 30, f"/readyz and status to agree on {models}")
    return found


def test_probes_follow_start_up_ready_recycle_a_broken_model_and_a_drain() -> None:
    port = free_port()
    model = echo_model(2, startup_seconds=3.0, sleep_on=SLOW, sleep_seconds=3.0)
    sup = start_supervisor({"supervisor": {"metrics": f"127.0.0.1:{port}",
                                           "shutdown_timeout": "30s"},
                            "models": {"m": model, "bad": {
                                "handler": "worker.handlers:broken", "required": False,
                                "options": {"message": SECRET}}}})
    check = healthcheck(port)
    try:
        # Start-up: alive at once, not ready while the workers warm up.
        assert wait_until(lambda: get(port, "/livez")[0] == 200, 30, "/livez")
        code, body = agreed(sup, port, [])
        assert code == 503 and "'m' (" in body and "starting" in body, body
        assert subprocess.run(check, timeout=30).returncode != 0  # Docker: not healthy yet
        sup.wait_for(lambda s: s["ready"], 60, "ready")
        # Ready; the broken model (not required) holds nothing back, but named it is not
        # ready, and its error (which may hold anything) is in `status` only.
        assert agreed(sup, port, []) == (200, "ready\n")
        assert agreed(sup, port, ["m"]) == (200, "ready\n")
        wait_until(lambda: sup.status()["models"]["bad"]["failing_to_start"], 60, "bad fails")
        code, body = agreed(sup, port, ["m", "bad"])
        assert code == 503 and "'bad' (" in body and "failing to start" in body, body
        assert SECRET in str(sup.status()["models"]["bad"]["last_error"])
        assert SECRET not in body
        code, body = agreed(sup, port, ["nosuch"])
        assert body == "not ready: this supervisor does not serve 'nosuch' (it serves bad, m)\n"
        assert subprocess.run(check, timeout=30).returncode == 0  # Docker: healthy
        # A recycle of every worker: replacements first, so ready and alive throughout.
        before = sup.status()["models"]["m"]["recycles"]
        sup.admin("recycle", model="m")
        answers = set()
        while True:
            status = sup.status()["models"]["m"]
            answers |= {get(port, "/readyz?model=m"), get(port, "/livez"), get(port, "/readyz")}
            done = sum(status["recycles"].values()) >= sum(before.values()) + 2
            if done and sum(w["state"] == "ready" for w in status["workers"]) == 2:
                break
            assert sup.process.poll() is None
        assert answers == {(200, "ready\n"), (200, "alive\n")}, answers
        # A drain: a job in flight keeps it going; not ready from the moment it begins.
        result: dict[str, Any] = {}

        def slow_job() -> None:
            with sup.client(timeout=60) as client:
                result["x"] = client.infer("m", {"x": np.full((1, 4), SLOW, np.float32)})["x"]

        job = threading.Thread(target=slow_job)
        job.start()
        sup.wait_for(lambda s: s["models"]["m"]["in_flight"] == 1, 30, "job running")
        sup.process.send_signal(signal.SIGTERM)
        sup.wait_for(lambda s: s["stopping"], 30, "drain started")
        # Published before `status` could say so: no waiting here.
        assert get(port, "/readyz") == (503, "not ready: the supervisor is stopping "
                                        "(draining: new jobs are answered shutting_down)\n")
        assert get(port, "/livez") == (200, "alive\n")  # draining is alive
        assert agreed(sup, port, ["m"])[0] == 503
        livez = set()
        while sup.process.poll() is None:  # alive to its end: answered or gone
            code, _ = get(port, "/livez")
            livez.add(code if code else "closed")
        job.join(60)
        assert result["x"].tolist() == [[SLOW] * 4]
        assert livez <= {200, "closed"} and 200 in livez, livez
        assert sup.process.wait(30) == 0
        assert get(port, "/livez")[0] == 0  # the listener went with the daemon
    finally:
        sup.stop()


def test_a_stuck_loop_fails_livez_while_metrics_still_answer() -> None:
    """The loop blocks in its memory poll (tests/stalled_loop.py) while the listener runs:
    `status` gets no answer, /livez and /readyz say why once the bound has passed, /metrics
    answers all along, and the loop's recovery brings /livez back."""
    port = free_port()
    sup = start_supervisor({"supervisor": {"metrics": f"127.0.0.1:{port}"},
                            "models": {"m": echo_model(1)}},
                           wrapper=[sys.executable, str(REPO / "tests" / "stalled_loop.py")],
                           env={"PYTHONPATH": str(REPO)})
    stall = sup.config_path.parent / "STALL"
    try:
        sup.wait_ready()
        assert wait_until(lambda: get(port, "/readyz") == (200, "ready\n"), 30, "ready")
        stall.touch()
        with pytest.raises(JobError):  # the loop no longer answers its own socket
            wait_until(lambda: control(sup.control_endpoint, "status", timeout=1) and False,
                       30, "status to go unanswered")
        _, body = wait_until(lambda: (r := get(port, "/livez"))[0] == 503 and r,
                             LIVENESS_TIMEOUT + 30, "/livez to fail")
        seconds = float(body.split(" for ")[1].split("s ")[0])
        assert body.startswith("not alive: the main loop has not completed a turn for ") and \
            seconds >= LIVENESS_TIMEOUT, body
        assert get(port, "/readyz")[1].startswith("not alive: ")
        assert get(port, "/metrics")[0] == 200  # the listener itself is fine
        stall.unlink()
        assert wait_until(lambda: get(port, "/livez") == (200, "alive\n"), 30, "recovery")
        assert sup.status()["ready"]
    finally:
        stall.unlink(missing_ok=True)
        sup.stop()
    events = [json.loads(line)["event"] for line in sup.log().splitlines()
              if line.startswith("{")]
    assert "supervisor_stalled" in events  # the loop noticed its own stall too


PROBE_TIMEOUT = 3.0  # the manifests' timeoutSeconds
TRIES = 20


class Attack:
    """Clients on the metrics port that try to make the probes fail: IDLE connections that
    send nothing (each reopened as soon as the listener closes it, and more opened all the
    time), TRICKLING ones that send a header line now and then (a request that never ends),
    and FLOODERS threads asking /readyz and /metrics as fast as they are answered."""

    IDLE = 2 * MAX_CONNECTIONS
    TRICKLING = 64
    FLOODERS = 16

    def __init__(self, port: int) -> None:
        self.port, self.stop = port, threading.Event()
        self.codes: dict[int, int] = {}
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.idle), threading.Thread(target=self.trickle)]
        self.threads += [threading.Thread(target=self.flood, args=(path,)) for path in
                         ["/readyz?model=m", "/metrics"] * (self.FLOODERS // 2)]

    def __enter__(self) -> Attack:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)

    def connect(self) -> socket.socket | None:
        try:
            return socket.create_connection(("127.0.0.1", self.port), timeout=1)
        except OSError:
            return None

    def idle(self) -> None:
        held: list[socket.socket] = []
        while not self.stop.is_set():
            if (sock := self.connect()) is not None:
                held.append(sock)
            if len(held) > self.IDLE:
                held.pop(0).close()
        for sock in held:
            sock.close()

    def trickle(self) -> None:
        held: list[socket.socket] = []
        while not self.stop.wait(0.05):
            for sock in list(held):
                try:
                    sock.sendall(b"X-Slow: 1\r\n")
                except OSError:
                    held.remove(sock)
                    sock.close()
            while len(held) < self.TRICKLING and (sock := self.connect()) is not None:
                sock.sendall(b"GET /livez HTTP/1.1\r\n")
                held.append(sock)
        for sock in held:
            sock.close()

    def flood(self, path: str) -> None:
        while not self.stop.is_set():
            code, _ = get(self.port, path, timeout=30)
            with self.lock:
                self.codes[code] = self.codes.get(code, 0) + 1


def test_idle_trickling_and_flooding_clients_never_fail_a_probe() -> None:
    """Every probe answered 200 within the manifests' timeout while the listener is under
    all three attacks at once and jobs run: the loop keeps turning and answers them all."""
    port = free_port()
    sup = start_supervisor({"supervisor": {"metrics": f"127.0.0.1:{port}"},
                            "models": {"m": echo_model(1)}})
    try:
        sup.wait_ready()
        wait_until(lambda: get(port, "/readyz") == (200, "ready\n"), 30, "ready")
        probes: list[tuple[str, int, float]] = []
        with Attack(port) as attack, sup.client() as client:
            wait_until(lambda: sum(attack.codes.values()) > 50, 30, "the flood to be under way")
            for i in range(TRIES):
                for path in ("/livez", "/readyz?model=m"):
                    started = time.monotonic()
                    code, _ = get(port, path, timeout=PROBE_TIMEOUT)
                    probes.append((path, code, time.monotonic() - started))
                x = np.full((1, 4), i, np.float32)
                assert client.infer("m", {"x": x})["x"].tolist() == x.tolist()
            assert sup.status()["ready"]
        failed = [p for p in probes if p[1] != 200]
        slowest = max(seconds for _, _, seconds in probes)
        print(f"probes: {len(probes) - len(failed)}/{len(probes)} answered 200, slowest "
              f"{slowest:.3f}s; flood answers {attack.codes}")
        assert not failed, failed
        assert attack.codes.get(200, 0) > 0, attack.codes
        assert get(port, "/livez") == (200, "alive\n")
    finally:
        sup.stop()
    assert sup.process.returncode == 0
