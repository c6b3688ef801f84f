"""Smoke tests: every benchmark runs end to end at tiny sizes and writes its results, so
none can rot. No timing is asserted here; the figures live in bench/results. Those that start
TensorFlow are in modules of their own (test_bench_*.py), so that pytest-xdist spreads them
over its workers."""

from __future__ import annotations

import http.server
import shutil
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from bench import footprint, health_checks, probe_cost, roundtrip, text_peers, throughput
from supervisor.testing import short_tmpdir
from tests.bench_results import written


def test_roundtrip_smoke(tmp_path: Path) -> None:
    roundtrip.run(50, tmp_path)
    result = written(tmp_path, "roundtrip")
    assert float(str(result["ratio_p50"])) > 0


def test_throughput_smoke(tmp_path: Path) -> None:
    throughput.run(1.0, 1, 8, tmp_path)
    result = written(tmp_path, "throughput")
    assert int(str(result["jobs"])) > 0 and result["errors"] == 0


def test_footprint_smoke(tmp_path: Path) -> None:
    footprint.run(1.0, 0.5, tmp_path)
    result = written(tmp_path, "footprint")
    assert int(str(result["jobs"])) > 0


def test_health_checks_smoke(tmp_path: Path) -> None:
    health_checks.run(1, 5, tmp_path)
    result = written(tmp_path, "health_checks")
    assert float(str(result["exec_probe_peak_rss_mb"])) > 0


def test_probe_cost_smoke(tmp_path: Path) -> None:
    probe_cost.run(0.1, tmp_path, demo=False)  # the demo MLP needs TF: echo only
    result = written(tmp_path, "probe_cost")
    [echo] = result["results"]  # type: ignore[misc]
    assert echo["jobs_on"] > 0 and echo["jobs_off"] > 0


def test_peers_missing_package_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dataclasses import replace

    from bench import peers
    from bench.harness.workload import SKIPPED

    missing = replace(peers.PEERS["mosec"], modules=("no_such_module_for_bench_peers",))
    monkeypatch.setitem(peers.PEERS, "mosec", missing)
    result = peers.run(1.0, 1, ["mosec"], tmp_path)  # nothing to start: no model is built
    assert written(tmp_path, "peers")["servers"] == {"mosec": {"status": SKIPPED}}
    assert result["ratios"] == {} and SKIPPED in (tmp_path / "peers.md").read_text()


def test_timeline_lines_up_each_job_and_leaves_out_broken_ones() -> None:
    """Three jobs 1,000 µs apart, each step 10 µs after the last (ns on the wire), every
    receiver awake before its sender's call to send returns (as under load); the second
    job's worker never sends before the next job starts, so it is left out."""
    from bench.timeline import SEGMENTS, SENDS, segments

    client: list[tuple[str, int, int]] = []
    middle: list[tuple[str, int, int]] = []
    worker: list[tuple[str, int, int]] = []
    for job in range(3):
        t = 1_000_000 * (job + 1)
        client += [("S", t, t + 25_000), ("W", t, t + 70_000)]
        middle += [("W", t, t + 10_000), ("S", t + 20_000, t + 35_000),
                   ("W", t, t + 50_000), ("S", t + 60_000, t + 75_000)]
        worker += [("W", t, t + 30_000)] + ([] if job == 1 else [("S", t + 40_000,
                                                                 t + 55_000)])
    found = segments(client, middle, worker)
    assert len(found["total"]) == 1  # the first job; the second broken, the third has no next
    spans = [found[name][0] for name in SEGMENTS]
    assert spans == [10.0] * 7 + [930.0] and sum(spans) == found["total"][0] == 1000.0
    assert [sorted(set(found[name])) for name in SENDS] == [[25.0], [15.0], [15.0]]


def test_timeline_smoke(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bench import timeline

    # The run's directories (its notes, and every process's sockets and logs) are made in a
    # directory of its own, so that those of tests running beside it are not counted.
    own = short_tmpdir()
    monkeypatch.setenv("TFS_SHORT_TMPDIR", str(own))
    monkeypatch.setenv("TMPDIR", str(own))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    try:
        timeline.run(100, 1, tmp_path)
        assert list(own.iterdir()) == []  # sockets, logs, notes: all removed
    finally:
        shutil.rmtree(own, ignore_errors=True)
    result = written(tmp_path, "timeline")
    lined_up = result["jobs_lined_up"]
    assert isinstance(lined_up, dict) and all(count > 0 for count in lined_up.values())


class _Stalling(http.server.BaseHTTPRequestHandler):
    """Answers one request at a time, each after 40 ms: far slower than it is sent to."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        time.sleep(0.04)  # the server's service time, not a wait in the test
        body = bytes(4 * text_peers.WIDTH)
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


class _Out(list[object]):
    put = list.append


def test_open_loop_counts_latency_from_the_scheduled_send() -> None:
    """60 requests scheduled over 1 s to a server that answers 25 a second: the last ones
    are answered ~1.4 s after they were due, though none took more than 16 x 40 ms once
    sent. Counted from the schedule, the queue the server built shows."""
    from bench.harness.load import DRAIN_S, OPEN_THREADS
    from bench.harness.transport import Http, raw_codec

    server = http.server.HTTPServer(("127.0.0.1", 0), _Stalling)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        out = _Out()
        load = text_peers.TEXT.load(Http(server.server_address[1], "/", raw_codec()), 1, 1)
        load._open(1.0, 60.0, 7, OPEN_THREADS, DRAIN_S, out)  # one client process's part
    finally:
        server.shutdown()
        server.server_close()
    [(latencies, ends, failures, cpu)] = out  # type: ignore[misc]
    assert failures == 0 and 30 <= len(latencies) == len(ends) <= 100  # Poisson, around 60
    assert max(latencies) > 0.04 * len(latencies) - 1.0 - 0.2 > 16 * 0.04
    assert cpu > 0


def test_open_loop_rates_follow_the_rounds_first_server() -> None:
    rates = text_peers.Rates([0.5, 0.8])
    assert rates(200.0) == [100.0, 160.0]
    assert rates(50.0) == [100.0, 160.0]  # the same absolute rates for every server after it
    drawn = text_peers.lengths(10_000, seed=1)
    assert drawn.min() >= 4 and drawn.max() <= text_peers.MAX_LENGTH
    assert 24 <= np.median(drawn) <= 32 and np.mean(drawn > 64) > 0.05  # skewed: a long tail


def test_night_marks_recycles_and_the_throughput_they_cost() -> None:
    """Worker w1 replaced by w2 at 15 s: one recycle there; the supervised jobs/s in that
    10 s window against the others is the throughput lost."""
    from bench import night

    samples = [{"t": float(t), "model": "supervised", "worker": "w1" if t <= 15 else "w2",
                "rss": (600 + 10 * t) * 2**20} for t in range(30)]
    samples += [{"t": float(t), "model": "unsupervised", "worker": "u1",
                 "rss": (600 + 20 * t) * 2**20} for t in range(30)]
    assert night.recycle_times(samples, "supervised") == [15.0]
    done = [100.0 + t / 10 for t in range(300) if not 12 <= t / 10 < 17]  # 5 s stalled
    result = night.summarise(samples, {"supervised": {"done": done, "failed": []},
                                       "unsupervised": {"done": [], "failed": ["x"]}},
                             {"max_memory": 1}, 100.0, 30.0, "900MiB")
    assert result["throughput_lost_pct"] == 50.0 and result["recycled_at_s"] == [15.0]
    assert result["peak_mib"] == {"unsupervised": 1180, "supervised": 890}
    assert result["failed"] == {"unsupervised": 1, "supervised": 0}
