"""Operations: sd_notify over a real datagram socket, the watchdog, the CLI, Prometheus
metrics scraped over HTTP, and JSON log lines. The unit file itself: test_systemd.py."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from supervisor.cli.render import render_status
from supervisor.core.lifecycle import EXTERNAL_KILL_NOTE as NOTE
from supervisor.daemon.notify import Notifier
from supervisor.shared.exitcodes import DaemonExit
from supervisor.testing import free_port
from tests.conftest import echo_model, short_tmpdir, start_supervisor
from tests.test_metric_series import promlint

REPO = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "supervisor"]


class NotifySocket:
    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.sock.settimeout(0.2)
        self.messages: list[tuple[float, str]] = []

    def pump(self, until: float) -> None:
        while time.monotonic() < until:
            try:
                data = self.sock.recv(4096).decode()
            except TimeoutError:
                continue
            self.messages.append((time.monotonic(), data))

    def wait_for(self, fragment: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(fragment in m for _, m in self.messages):
                return
            self.pump(time.monotonic() + 0.2)
        raise AssertionError(f"no {fragment!r} in {self.messages[-5:]}")

    def index(self, fragment: str) -> int:
        return next(i for i, (_, m) in enumerate(self.messages) if fragment in m)


@pytest.mark.parametrize("abstract", [False, True], ids=["path", "abstract"])
def test_sd_notify_sequence_and_watchdog(supervisor_factory: Any, tmp_path: Path,
                                         abstract: bool) -> None:
    name = f"tfs-notify-{os.getpid()}-{time.monotonic_ns()}"
    notify = NotifySocket("\0" + name if abstract else str(tmp_path / "notify.sock"))
    env = {"NOTIFY_SOCKET": "@" + name if abstract else str(tmp_path / "notify.sock"),
           "WATCHDOG_USEC": "400000"}  # ping every 0.2 s
    sup = supervisor_factory({"models": {"m": echo_model(2)}}, wait=False, env=env)
    notify.wait_for("READY=1")
    ready_at = notify.index("READY=1")
    assert sup.wait_ready(10)  # READY=1 came once the workers were ready
    assert any("STATUS=" in m and "m 2/2 ready" in m for _, m in notify.messages)
    notify.pump(time.monotonic() + 2.0)
    pings = [t for t, m in notify.messages if m == "WATCHDOG=1"]
    window = [t for t in pings if t > pings[-1] - 1.9]
    assert 6 <= len(window) <= 14, len(window)  # ~5 per second
    os.kill(sup.process.pid, signal.SIGHUP)
    notify.wait_for("RELOADING=1")
    reloading = next(m for _, m in notify.messages if "RELOADING=1" in m)
    assert "MONOTONIC_USEC=" in reloading
    assert int(reloading.split("MONOTONIC_USEC=")[1]) > 0
    notify.pump(time.monotonic() + 0.5)
    after_reload = [m for _, m in notify.messages[notify.index("RELOADING=1"):]]
    assert any(m.startswith("READY=1") for m in after_reload)
    sup.process.send_signal(signal.SIGTERM)
    notify.wait_for("STOPPING=1")
    assert sup.process.wait(30) == 0
    assert ready_at < notify.index("RELOADING=1") < notify.index("STOPPING=1")


def test_notifier_is_a_no_op_outside_systemd() -> None:
    notifier = Notifier({})
    assert not notifier.enabled and not notifier.ready() and notifier.watchdog_interval is None
    assert Notifier({"WATCHDOG_USEC": "10", "WATCHDOG_PID": "1"}).watchdog_interval is None


def test_status_ready_probe_and_version(supervisor_factory: Any, tmp_path: Path) -> None:
    sup = supervisor_factory({"models": {"m": echo_model(1)}})
    config = str(sup.config_path)
    assert subprocess.run([*CLI, "status", "-c", config, "--ready"], timeout=30).returncode == 0
    sup.stop()
    down = subprocess.run([*CLI, "status", "-c", config, "--ready", "--timeout", "1"],
                          capture_output=True, text=True, timeout=30)
    assert down.returncode != 0 and down.stdout == ""
    version = subprocess.run([*CLI, "--version"], capture_output=True, text=True, timeout=30)
    assert version.stdout.startswith("tfsupervisor ")


def test_top_refreshes_until_interrupted(supervisor_factory: Any) -> None:
    sup = supervisor_factory({"models": {"m": echo_model(1)}})
    top = subprocess.Popen([*CLI, "top", "-c", str(sup.config_path), "--interval", "0.2"],
                           stdout=subprocess.PIPE, text=True)
    assert top.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + 60
    while sum("tfsupervisor top" in line for line in lines) < 3:  # three screens
        assert time.monotonic() < deadline and top.poll() is None, lines
        lines.append(top.stdout.readline())
    top.send_signal(signal.SIGINT)
    out = "".join(lines) + top.communicate(timeout=10)[0]
    assert top.returncode == 0
    assert "READY" in out and "GROWTH/H" in out  # a line per model (issue 47: it fits)
    assert any(line.startswith("m ") and " 1/1 " in line for line in out.splitlines()), out
    assert "\x1b" not in out  # piped: no screen-clearing codes


def test_top_quits_after_its_refresh_on_ctrl_c_and_at_once_on_a_second() -> None:
    """The first SIGINT only records (an exception raised inside a ZeroMQ call could leave a
    socket that holds the process at exit); a second one interrupts whatever is running."""
    from supervisor.cli.commands import QuitFlag

    flag = QuitFlag()
    flag(signal.SIGINT, None)
    assert flag.asked
    with pytest.raises(KeyboardInterrupt):
        flag(signal.SIGINT, None)


def test_metrics_scraped_over_http(supervisor_factory: Any) -> None:
    port = free_port()
    model = {**echo_model(2), "policy": {"warmup_jobs": 0, "warmup_seconds": 0,
                                         "trend_window": 8}}
    sup = supervisor_factory({"supervisor": {"metrics": f"127.0.0.1:{port}"},
                              "models": {"m": model}})
    with sup.client() as client:
        for _ in range(20):
            client.infer("m", {"x": np.zeros((3, 4), np.float32)})
        with pytest.raises(Exception):  # noqa: B017 - any JobError will do
            client.infer("m", {"x": np.zeros((3, 4), np.float64)})
    deadline = time.monotonic() + 30
    while True:  # until a publish carries every worker's memory and trend (polls)
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                      timeout=10).read().decode()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for f in families.values() for s in f.samples}
        published = [n for (n, _) in samples if n in ("tfsupervisor_worker_memory_bytes",
                                                      "tfsupervisor_worker_growth_bytes_per_hour")]
        if len(published) == 4 and samples.get(
                ("tfsupervisor_job_latency_seconds_count", (("model", "m"),))) == 20:
            break
        assert time.monotonic() < deadline, text[-3000:]
        time.sleep(0.1)
    assert samples[("tfsupervisor_jobs_total", (("model", "m"), ("outcome", "ok")))] == 20
    assert samples[("tfsupervisor_jobs_total",
                    (("model", "m"), ("outcome", "bad_request")))] == 1
    assert samples[("tfsupervisor_job_latency_seconds_count", (("model", "m"),))] == 20
    assert samples[("tfsupervisor_batch_size_sum", (("model", "m"),))] == 60
    assert samples[("tfsupervisor_workers", (("model", "m"), ("state", "ready")))] == 2
    assert samples[("tfsupervisor_queue_depth", (("model", "m"),))] == 0
    memory = [v for (n, _), v in samples.items() if n == "tfsupervisor_worker_memory_bytes"]
    assert len(memory) == 2 and all(v > 10 * 1024**2 for v in memory)
    assert "tfsupervisor_process_resident_memory_bytes" in text
    for name in families:
        assert name.startswith("tfsupervisor_"), name
    assert "job_id" not in text
    # Every series the Grafana dashboard queries exists (VRAM only on GPU hosts, recycle
    # counts once there has been one, limits where set: the family is declared all the same).
    assert "tfsupervisor_recycles" in families
    dashboard = (REPO / "docs" / "grafana-dashboard.json").read_text()
    queried = set(re.findall(r"tfsupervisor_[a-z0-9_]+", dashboard))
    exposed = {s.name for f in families.values() for s in f.samples}
    assert queried - exposed <= {"tfsupervisor_worker_vram_bytes",
                                 "tfsupervisor_recycles_total",
                                 "tfsupervisor_policy_limit_bytes"}, queried - exposed
    assert "{{worker}}" not in dashboard and "worker=" not in dashboard  # no such label
    # No always-zero series: of the states, ready always, the others only while non-zero.
    assert [k for k in samples if k[0] == "tfsupervisor_workers"] == \
        [("tfsupervisor_workers", (("model", "m"), ("state", "ready")))]
    assert not promlint(text), promlint(text)


def _scrape(url: str) -> tuple[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]]:
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return text, {(s.name, tuple(sorted(s.labels.items()))): s.value
                  for f in text_string_to_metric_families(text) for s in f.samples}


def test_external_kill_and_recycles_show_in_metrics_and_status(
        supervisor_factory: Any) -> None:
    """A worker SIGKILLed from outside (as the OOM killer does) is counted in the metrics
    and shown by `status`; forced recycles add no series: workers are labelled by slot."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    sup = supervisor_factory({"supervisor": {"metrics": f"127.0.0.1:{port}"},
                              "models": {"m": echo_model(2)}})
    victim = sup.workers("m")[0]
    os.kill(victim["pid"], signal.SIGKILL)

    def replaced(status: dict[str, Any]) -> bool:
        model = status["models"]["m"]
        return model["exits"].get("killed_externally") == 1 and \
            sorted((w["slot"], w["state"]) for w in model["workers"]) == [(0, "ready"),
                                                                          (1, "ready")]
    report = sup.wait_for(replaced, 60, "the killed worker counted and replaced")
    last = report["models"]["m"]["last_unexpected_exit"]
    assert (last["cause"], last["worker"], last["slot"], last["exit"]) == \
        ("killed_externally", victim["id"], victim["slot"], "signal SIGKILL")
    assert "LAST UNEXPECTED EXIT: killed_externally" in render_status(report)
    died = [json.loads(line) for line in sup.log().splitlines() if '"worker_died"' in line]
    assert [(e["worker"], e["cause"], e["note"]) for e in died] == \
        [(victim["id"], "killed_externally", NOTE)]
    exits = ("tfsupervisor_worker_exits_total", (("cause", "killed_externally"), ("model", "m")))
    deadline = time.monotonic() + 30
    while _scrape(url)[1].get(exits) != 1:  # published at most a second later
        assert time.monotonic() < deadline, _scrape(url)[0]
        time.sleep(0.1)

    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for round_ in (1, 2, 3):  # each recycles both workers, one after the other
        sup.admin("recycle", model="m")
        deadline = time.monotonic() + 60
        while True:  # scraped throughout, so outgoing workers' series are seen too
            text, samples = _scrape(url)
            seen |= {k for k in samples if "slot" in dict(k[1])}
            status = sup.status()["models"]["m"]
            if status["recycles"].get("manual") == 2 * round_ and \
                    [w["role"] for w in status["workers"]] == ["current", "current"] and \
                    all(w["state"] == "ready" for w in status["workers"]):
                break
            assert time.monotonic() < deadline, status
            time.sleep(0.05)
    assert {(dict(labels)["slot"], dict(labels)["role"]) for _, labels in seen} <= \
        {("0", "current"), ("1", "current"), ("0", "outgoing"), ("1", "outgoing")}
    memory = {k for k in seen if k[0] == "tfsupervisor_worker_memory_bytes"}
    assert 2 <= len(memory) <= 4, memory  # 8 workers came and went: at most 2 slots x 2 roles
    assert not re.search(r'"m-\d+"', text)  # no worker id is a label value
    assert not promlint(text), promlint(text)


def test_log_lines_are_json_with_stable_events(supervisor_factory: Any) -> None:
    sup = supervisor_factory({"models": {"m": echo_model(1)}})
    with sup.client() as client:
        client.infer("m", {"x": np.zeros((1, 4), np.float32)})
    sup.stop()
    events = [json.loads(line) for line in sup.log().splitlines() if line.strip()]
    names = [e["event"] for e in events]
    for name in ("supervisor_started", "worker_started", "worker_ready", "serving",
                 "shutdown_started", "worker_exited", "supervisor_stopped"):
        assert name in names, name
    ready = next(e for e in events if e["event"] == "worker_ready")
    assert {"model", "worker", "pid", "warmup_seconds", "level", "timestamp"} <= set(ready)
    assert not any(e["event"].startswith("job") for e in events)  # no per-job lines at info


def test_a_second_daemon_on_the_same_runtime_dir_refuses_and_harms_nothing(
        supervisor_factory: Any) -> None:
    sup = supervisor_factory({"models": {"m": {"handler": "worker.handlers:echo"}}})
    second = subprocess.run([sys.executable, "-m", "supervisor", "run", "-c",
                             str(sup.config_path), "--log-format", "json"],
                            capture_output=True, text=True, timeout=60)
    assert second.returncode == DaemonExit.ALREADY_RUNNING
    assert f"pid {sup.process.pid}" in second.stdout + second.stderr
    assert sup.status()["models"]["m"]["workers"]  # the first one is still reachable
    with sup.client(timeout=30) as client:
        assert client.infer("m", {"x": np.ones((1, 4), np.float32)})["x"][0, 0] == 1.0


def test_an_ipc_endpoint_of_a_live_daemon_is_never_taken_over(
        supervisor_factory: Any) -> None:
    first = supervisor_factory({"models": {"m": {"handler": "worker.handlers:echo"}}})
    other = short_tmpdir()
    try:
        config = other / "config.yaml"
        config.write_text(yaml.safe_dump({
            "supervisor": {"runtime_dir": str(other / "run"),
                           "endpoints": [first.endpoint]},
            "models": {"h": {"handler": "worker.handlers:echo"}}}))
        second = subprocess.run([sys.executable, "-m", "supervisor", "run", "-c", str(config),
                                 "--log-format", "json"], capture_output=True, text=True,
                                timeout=60)
    finally:
        shutil.rmtree(other, ignore_errors=True)
    assert second.returncode == DaemonExit.ALREADY_RUNNING
    assert "served by another live process" in second.stdout + second.stderr
    assert Path(first.endpoint[len("ipc://"):]).is_socket()
    with first.client(timeout=30) as client:
        assert client.infer("m", {"x": np.ones((1, 4), np.float32)})["x"][0, 0] == 1.0


def test_infer_random_says_when_a_handler_declares_no_inputs() -> None:
    """Not 'no worker ready' while its workers are ready: nothing to draw inputs from."""
    workdir = short_tmpdir()
    (workdir / "undeclared.py").write_text(
        "class Undeclared:\n    inputs = None\n    outputs = None\n\n"
        "    def __call__(self, inputs):\n        return inputs\n\n\n"
        "def make(options):\n    return Undeclared()\n")
    sup = start_supervisor({"models": {"m": {"handler": "undeclared:make", "workers": 1}}},
                           workdir)
    try:
        sup.wait_ready()
        out = subprocess.run([sys.executable, "-m", "supervisor", "infer", "-c",
                              str(sup.config_path), "m", "--random"],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 1 and "declares no inputs" in out.stderr, out.stderr
        assert "--input NAME=FILE.npy" in out.stderr
    finally:
        sup.stop()
        shutil.rmtree(workdir, ignore_errors=True)
