"""Benchmark: what one health check costs, as an exec probe and as an HTTP probe.

A real supervisor (two echo workers, metrics on a local port), asked the same question three
ways, each measured on its own:

- exec: `python -m supervisor status --ready --model m` started per check, as the manifests'
  exec probes and the Dockerfile's HEALTHCHECK did; its CPU (user + system) and peak RSS as
  GNU time reports them, and the daemon's own CPU for answering it;
- http: `GET /readyz?model=m` (what the kubelet's httpGet does, from the node): no process in
  the container, so the cost there is the daemon's CPU for the request, and its peak RSS
  (VmHWM) before and after;
- bash: the Dockerfile's HEALTHCHECK command as written (bash's /dev/tcp), per check.

The daemon's CPU per check is its CPU over the checks minus its idle rate over the same wall
time (measured just before), divided by the checks.

    python -m bench.health_checks [--exec 20] [--http 200]

(The listener accepts 20 requests a second at most: 200 checks take 10 s.)
"""

from __future__ import annotations

import argparse
import http.client
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from bench.common import cpu, scratch, write
from bench.dockerfile import healthcheck  # the Dockerfile's HEALTHCHECK, on a port
from supervisor.testing import free_port, start_supervisor

ROOT = Path(__file__).resolve().parent.parent


def child(command: list[str], report: Path) -> tuple[int, float, int]:
    """(exit status, CPU seconds, peak RSS bytes) of one command, as GNU time reports them
    (a small process: the command's peak is its own, not that of a fork of this one)."""
    status = subprocess.run(["/usr/bin/time", "-f", "%U %S %M", "-o", str(report), *command],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            cwd=ROOT).returncode
    user, system, peak_kb = report.read_text().split()[-3:]
    return status, float(user) + float(system), int(peak_kb) * 1024


def hwm(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


def daemon_share(daemon: psutil.Process, idle_rate: float, work: Any) -> tuple[float, float]:
    """(the daemon's CPU seconds beyond idle while ``work`` ran, wall seconds)."""
    start_cpu, start = cpu(daemon), time.monotonic()
    work()
    wall = time.monotonic() - start
    return cpu(daemon) - start_cpu - idle_rate * wall, wall


def run(execs: int, gets: int, out: Path | None = None) -> dict[str, Any]:
    with scratch() as workdir:
        port = free_port()
        sup = start_supervisor({"supervisor": {"metrics": f"127.0.0.1:{port}",
                                               "poll_interval": "1s"},
                                "models": {"m": {"handler": "worker.handlers:echo",
                                                 "workers": 2}}}, workdir)
        try:
            sup.wait_ready()
            daemon = psutil.Process(sup.process.pid)
            before = cpu(daemon)
            time.sleep(3.0)  # the idle rate the checks are measured against
            idle_rate = (cpu(daemon) - before) / 3.0
            exec_probe = [sys.executable, "-m", "supervisor", "status", "--control",
                          sup.control_endpoint, "--ready", "--model", "m", "--timeout", "3"]
            exec_runs: list[tuple[int, float, int]] = []
            exec_daemon, _ = daemon_share(daemon, idle_rate, lambda: exec_runs.extend(
                child(exec_probe, workdir / "time") for _ in range(execs)))
            hwm_before = hwm(daemon.pid)
            codes: list[int] = []

            def get_all() -> None:
                for _ in range(gets):
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                    conn.request("GET", "/readyz?model=m")
                    response = conn.getresponse()
                    response.read()
                    codes.append(response.status)
                    conn.close()

            http_daemon, _ = daemon_share(daemon, idle_rate, get_all)
            hwm_after = hwm(daemon.pid)
            check = healthcheck(port)
            bash_runs = [child(check, workdir / "time") for _ in range(execs)]
        finally:
            sup.stop()
    assert all(r[0] == 0 for r in exec_runs + bash_runs) and set(codes) == {200}
    result = {
        "exec_probe_cpu_s": round(statistics.mean(r[1] for r in exec_runs), 4),
        "exec_probe_peak_rss_mb": round(max(r[2] for r in exec_runs) / 1e6, 1),
        "exec_probe_daemon_cpu_ms": round(exec_daemon / execs * 1000, 3),
        "http_probe_daemon_cpu_ms": round(http_daemon / gets * 1000, 3),
        "http_probe_daemon_hwm_growth_mb": round((hwm_after - hwm_before) / 1e6, 2),
        "bash_healthcheck_cpu_s": round(statistics.mean(r[1] for r in bash_runs), 4),
        "bash_healthcheck_peak_rss_mb": round(max(r[2] for r in bash_runs) / 1e6, 1),
        "daemon_idle_cpu_percent": round(idle_rate * 100, 2),
        "exec_checks": execs, "http_checks": gets}
    table = [["check", "CPU per check (in the container)", "peak memory per check"],
             ["exec `status --ready`", f"{result['exec_probe_cpu_s'] * 1000:.0f} ms + daemon "
              f"{result['exec_probe_daemon_cpu_ms']:.2f} ms",
              f"{result['exec_probe_peak_rss_mb']} MB (a new process)"],
             ["httpGet /readyz", f"daemon {result['http_probe_daemon_cpu_ms']:.2f} ms",
              f"no process; daemon peak RSS +{result['http_probe_daemon_hwm_growth_mb']} MB "
              f"over {gets} checks"],
             ["Docker HEALTHCHECK (bash /dev/tcp)", f"{_ms(result['bash_healthcheck_cpu_s'])}"
              f" + daemon ~{result['http_probe_daemon_cpu_ms']:.2f} ms",
              f"{result['bash_healthcheck_peak_rss_mb']} MB (bash)"]]
    write("health_checks", result, table, out, notes=(
        "exec: a Python process per check (GNU time's figures), plus the daemon answering its "
        "status request; httpGet: the kubelet's request comes from the node, so the "
        "container pays only the daemon's CPU for it. The daemon's figures are its CPU over "
        "the checks less its idle rate over the same time."))
    return result


def _ms(seconds: float) -> str:
    """GNU time counts CPU in hundredths of a second."""
    return f"{seconds * 1000:.0f} ms" if seconds else "under 10 ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exec", type=int, default=20, dest="execs")
    parser.add_argument("--http", type=int, default=200, dest="gets")
    args = parser.parse_args()
    print(run(args.execs, args.gets))


if __name__ == "__main__":
    main()
