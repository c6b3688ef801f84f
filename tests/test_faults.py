"""Nothing lost: crashes, hangs, timeouts, deadlines, overload, shutdown and reload, with
real worker processes and real signals. Every request gets exactly one reply."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
import uuid
from typing import Any

import numpy as np
import psutil
import pytest
import yaml
import zmq

from supervisor.client import Client, DeadlineExceeded, JobError, JobTimeout, WorkerCrashed
from supervisor.core.lifecycle import EXTERNAL_KILL_NOTE
from supervisor.shared.protocol import INFER, Message, decode, encode, pack_arrays
from tests.conftest import Supervisor

CRASH, HANG, SLEEP = -1.0, -3.0, -2.0


def markers(workers: int = 2, sleep: float = 1.0, **policy: Any) -> dict[str, Any]:
    return {"handler": "worker.handlers:echo", "workers": workers,
            "options": {"crash_on": CRASH, "hang_on": HANG, "sleep_on": SLEEP,
                        "sleep_seconds": sleep},
            "policy": policy}


def job(value: float, rows: int = 1) -> dict[str, np.ndarray]:
    return {"x": np.full((rows, 4), value, np.float32)}


class RawClient:
    """A DEALER that sends many jobs and collects every reply by job id."""

    def __init__(self, sup: Supervisor) -> None:
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(sup.endpoint)

    def send(self, value: float, timeout_ms: int | None = None) -> bytes:
        specs, frames = pack_arrays(job(value))
        header: dict[str, Any] = {"model": "m", "inputs": specs}
        if timeout_ms is not None:
            header["timeout_ms"] = timeout_ms
        job_id = uuid.uuid4().bytes
        self.sock.send_multipart(encode(Message(INFER, job_id, header, frames)))
        return job_id

    def collect(self, count: int, wait: float = 30.0) -> dict[bytes, list[Message]]:
        replies: dict[bytes, list[Message]] = {}
        deadline = time.monotonic() + wait
        while sum(map(len, replies.values())) < count and time.monotonic() < deadline:
            if self.sock.poll(100):
                msg = decode(self.sock.recv_multipart())
                replies.setdefault(msg.job_id, []).append(msg)
        # Linger a little: a second reply to any job would be a bug.
        while self.sock.poll(300):
            msg = decode(self.sock.recv_multipart())
            replies.setdefault(msg.job_id, []).append(msg)
        return replies

    def close(self) -> None:
        self.sock.close()


def codes(replies: dict[bytes, list[Message]]) -> list[str]:
    return [m[0].header.get("code", "ok") if m[0].kind == b"error" else "ok"
            for m in replies.values()]


def test_poison_job_fails_after_max_attempts_and_pool_stays_healthy(
        supervisor_factory: Any) -> None:
    sup = supervisor_factory({"models": {"m": markers(2, max_attempts=2)}})
    with sup.client(timeout=30) as client:
        with pytest.raises(WorkerCrashed) as err:
            client.infer("m", job(CRASH))
        assert "poison" in err.value.message and "2 worker(s)" in err.value.message
        sup.wait_ready(30)
        assert client.infer("m", job(5.0))["x"][0, 0] == 5.0
    assert sup.log().count(EXTERNAL_KILL_NOTE) == 2  # the log flags unexplained SIGKILLs


def test_job_timeout_kills_the_worker_and_answers_timeout(supervisor_factory: Any) -> None:
    sup = supervisor_factory({"models": {"m": markers(2, job_timeout="1s")}})
    pids = {w["pid"] for w in sup.workers("m")}
    with sup.client(timeout=30) as client:
        started = time.monotonic()
        with pytest.raises(JobTimeout):
            client.infer("m", job(HANG))
        assert time.monotonic() - started < 5
        assert client.infer("m", job(2.0))["x"][0, 0] == 2.0
    status = sup.wait_ready(30)
    assert len(pids & {w["pid"] for w in status["models"]["m"]["workers"]}) == 1
    assert '"event": "job_timeout"' in sup.log()


def test_silent_worker_is_killed_but_a_busy_one_is_not(supervisor_factory: Any) -> None:
    sup = supervisor_factory({"supervisor": {"heartbeat_interval": "0.2s",
                                             "heartbeat_timeout": "1.5s"},
                              "models": {"m": markers(2, sleep=3.0)}})
    with sup.client(timeout=30) as client:
        out: dict[str, Any] = {}
        thread = threading.Thread(target=lambda: out.update(r=client.infer("m", job(SLEEP))))
        thread.start()
        status = sup.wait_for(lambda s: any(w["in_flight"] for w in s["models"]["m"]["workers"]),
                              10, "the long job in flight")
        busy = next(w for w in status["models"]["m"]["workers"] if w["in_flight"])
        stopped = next(w for w in status["models"]["m"]["workers"] if not w["in_flight"])
        os.kill(stopped["pid"], signal.SIGSTOP)  # hung: alive but silent
        thread.join(30)
        assert out["r"]["x"][0, 0] == SLEEP  # 3 s of work, heartbeating all along
    status = sup.wait_for(lambda s: stopped["pid"] not in
                          {w["pid"] for w in s["models"]["m"]["workers"]}, 15, "hung killed")
    pids = {w["pid"] for w in status["models"]["m"]["workers"]}
    assert busy["pid"] in pids  # busy for 3 s, twice the heartbeat timeout: not killed
    assert '"event": "worker_hung"' in sup.log()
    assert not psutil.pid_exists(stopped["pid"]) or \
        psutil.Process(stopped["pid"]).status() == psutil.STATUS_ZOMBIE


def running(sup: Supervisor, model: str = "m", timeout: float = 60.0) -> None:
    """Wait until a job of ``model`` is in a worker's hands (not merely sent): a job sent
    after this one is queued behind it, never read in the same pass and batched with it."""
    deadline = time.monotonic() + timeout
    while sup.status()["models"][model]["in_flight"] == 0:
        assert time.monotonic() < deadline, "the blocking job never reached a worker"
        time.sleep(0.02)


def test_deadline_passed_in_the_queue_is_never_dispatched(supervisor_factory: Any) -> None:
    # The blocker sleeps well past the last job's deadline: on a busy machine the late
    # job must still be queued, not run, when its deadline passes.
    sup = supervisor_factory({"models": {"m": markers(1, sleep=3.0)}})
    raw = RawClient(sup)
    try:
        blocker = raw.send(SLEEP)
        running(sup)
        late = raw.send(7.0, timeout_ms=300)
        fine = raw.send(8.0, timeout_ms=20_000)
        replies = raw.collect(3)
    finally:
        raw.close()
    assert replies[blocker][0].kind == b"result"
    assert replies[late][0].header["code"] == "deadline_exceeded"
    assert replies[fine][0].kind == b"result"
    assert all(len(r) == 1 for r in replies.values())
    assert sup.status()["models"]["m"]["workers"][0]["jobs"] == 2  # the late one never ran
    with sup.client() as client, pytest.raises(DeadlineExceeded):
        threading.Thread(target=lambda: Client(sup.endpoint).infer("m", job(SLEEP))).start()
        running(sup)
        # The client waits 10 % past its timeout for the supervisor's verdict: 0.1 s here.
        client.infer("m", job(1.0), timeout=1.0)


def test_full_queue_answers_overloaded_at_once(supervisor_factory: Any) -> None:
    sup = supervisor_factory({"supervisor": {"max_queue": 5},
                              "models": {"m": markers(1, sleep=0.5)}})
    raw = RawClient(sup)
    try:
        sent = [raw.send(SLEEP)] + [raw.send(float(i)) for i in range(20)]
        replies = raw.collect(len(sent))
    finally:
        raw.close()
    assert set(replies) == set(sent)
    assert all(len(r) == 1 for r in replies.values())
    outcome = codes(replies)
    # max_queue counts what the model holds, running or queued: 1 running + 4 queued.
    assert outcome.count("overloaded") == 16
    assert outcome.count("ok") == 5


def test_sigterm_finishes_in_flight_and_queued_jobs(supervisor_factory: Any) -> None:
    sup = supervisor_factory({"models": {"m": markers(1, sleep=1.0)}})
    raw = RawClient(sup)
    try:
        sent = [raw.send(SLEEP), raw.send(1.0), raw.send(2.0)]
        time.sleep(0.3)
        sup.process.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        refused = raw.send(3.0)
        replies = raw.collect(4)
    finally:
        raw.close()
    assert [replies[j][0].kind for j in sent] == [b"result"] * 3
    assert replies[refused][0].header["code"] == "shutting_down"
    assert sup.process.wait(30) == 0
    assert '"event": "shutdown_started"' in sup.log()


def test_shutdown_timeout_answers_what_remains(supervisor_factory: Any) -> None:
    sup = supervisor_factory({"supervisor": {"shutdown_timeout": "1s"},
                              "models": {"m": markers(1, sleep=5.0)}})
    raw = RawClient(sup)
    try:
        sent = [raw.send(SLEEP)]
        running(sup)  # alone: sent together, the two would be read together and batched
        sent.append(raw.send(1.0))
        time.sleep(0.3)
        started = time.monotonic()
        sup.process.send_signal(signal.SIGTERM)
        replies = raw.collect(2, wait=15)
    finally:
        raw.close()
    # The running job may have had effects: 'timeout'; the queued one never ran.
    assert [replies[j][0].header.get("code") for j in sent] == ["timeout", "shutting_down"]
    assert sup.process.wait(30) == 0
    assert time.monotonic() - started < 10


def test_second_signal_exits_fast(supervisor_factory: Any) -> None:
    sup = supervisor_factory({"models": {"m": markers(1, sleep=20.0)}})
    raw = RawClient(sup)
    try:
        sent = raw.send(SLEEP)
        time.sleep(0.3)
        started = time.monotonic()
        sup.process.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        sup.process.send_signal(signal.SIGINT)
        replies = raw.collect(1, wait=10)
    finally:
        raw.close()
    assert sup.process.wait(10) == 0
    assert time.monotonic() - started < 5
    assert replies[sent][0].header.get("code") == "timeout"  # it was running


def _write(sup: Supervisor, config: dict[str, Any]) -> None:
    current = yaml.safe_load(sup.config_path.read_text())
    current["models"] = config
    sup.config_path.write_text(yaml.safe_dump(current))


def test_reload_applies_changes_and_rejects_bad_files(supervisor_factory: Any) -> None:
    import subprocess
    import sys

    sup = supervisor_factory({"models": {"m": markers(2), "old": markers(1)}})
    before = {w["id"] for w in sup.workers("m")}
    cli = [sys.executable, "-m", "supervisor", "reload", "-c", str(sup.config_path)]

    original = sup.config_path.read_text()
    sup.config_path.write_text(original + "\nbogus: 1\n")
    out = subprocess.run(cli, capture_output=True, text=True, timeout=30)
    assert out.returncode == 1 and "bogus" in out.stderr
    os.kill(sup.process.pid, signal.SIGHUP)  # the daemon itself rejects it too
    sup.wait_for(lambda s: True, 5)
    time.sleep(0.5)
    assert '"event": "config_rejected"' in sup.log()
    sup.config_path.write_text(original)

    new_m = markers(2, max_jobs=100000)
    new_m["options"] = {**new_m["options"], "sleep_seconds": 0.1}  # options: new workers
    _write(sup, {"m": new_m, "fresh": markers(1)})
    out = subprocess.run(cli, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert "added fresh" in out.stdout and "removed old" in out.stdout
    assert "replaced m" in out.stdout
    status = sup.wait_for(lambda s: "old" not in s["models"] and "fresh" in s["models"] and
                          not before & {w["id"] for w in s["models"]["m"]["workers"]} and
                          sum(w["state"] == "ready" for w in s["models"]["m"]["workers"]) == 2,
                          60, "reload carried out")
    assert status["models"]["m"]["recycles"] == {"reload": 2}
    with sup.client() as client:
        assert client.infer("fresh", job(1.0))["x"][0, 0] == 1.0
        with pytest.raises(JobError, match="unknown_model"):
            client.infer("old", job(1.0))


def test_combined_faults_lose_nothing(supervisor_factory: Any) -> None:
    """Clients submit continuously while workers are SIGKILLed at random, a recycle and a
    reload happen: every job gets exactly one reply, and none is lost."""
    sup = supervisor_factory({"models": {"m": {
        # 0.2 s a batch: each client's 8 jobs are read together and run as one batch, so a
        # short call left the workers idle most of the time and a kill could miss them all.
        "handler": "worker.handlers:echo", "workers": 3, "options": {"delay": 0.2},
        "policy": {"max_attempts": 5, "max_concurrent_recycles": 2}}}})
    stop = threading.Event()
    results: list[str] = []
    lock = threading.Lock()

    def submit() -> None:
        raw = RawClient(sup)
        try:
            while not stop.is_set():
                value = float(random.randint(1, 10**6))
                ids = [raw.send(value) for _ in range(8)]
                replies = raw.collect(len(ids), wait=60)
                for job_id in ids:
                    got = replies.get(job_id, [])
                    with lock:
                        if len(got) != 1:
                            results.append(f"{len(got)} replies")
                        elif got[0].kind != b"result":
                            results.append(got[0].header.get("code", "?"))
                        else:
                            results.append("ok")
        finally:
            raw.close()

    def answered_past(count: int, what: str) -> None:
        """Wait for ``count`` answers: the faults land on a service that is serving,
        however fast or slow this machine is."""
        deadline = time.monotonic() + 90
        while len(results) < count:
            assert time.monotonic() < deadline, f"{what}: {len(results)} answers"
            assert all(t.is_alive() for t in threads), "a client thread failed"
            time.sleep(0.05)

    threads = [threading.Thread(target=submit) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        for round_ in range(6):
            answered_past(len(results) + 16, f"answers before fault round {round_}")
            workers = [w for w in sup.workers("m") if w["state"] == "ready"]
            busy = [w for w in workers if w["in_flight"]] or workers
            if busy:
                os.kill(random.choice(busy)["pid"], signal.SIGKILL)
            if round_ == 2:
                import subprocess
                import sys
                subprocess.run([sys.executable, "-m", "supervisor", "recycle", "-c",
                                str(sup.config_path), "m"], check=True, timeout=30)
            if round_ == 4:
                m = yaml.safe_load(sup.config_path.read_text())["models"]["m"]
                m["options"]["delay"] = 0.1
                _write(sup, {"m": m})
                os.kill(sup.process.pid, signal.SIGHUP)
        answered_past(max(len(results) + 24, 101), "answers after the faults")
    finally:
        stop.set()
        for t in threads:
            t.join(90)
    assert len(results) > 100
    assert set(results) == {"ok"}, {r: results.count(r) for r in set(results)}
    log = sup.log()
    assert '"event": "config_reloaded"' in log and '"event": "jobs_requeued"' in log
