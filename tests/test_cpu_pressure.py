"""CPU pressure (PSI): the share of time some task waited for a core, as the core judges it
(core/cpu.py) and as the daemon reads it (daemon/cpu_pressure.py, on fake /proc trees and
on this machine's own)."""

from __future__ import annotations

import math
import multiprocessing
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from supervisor.core.cpu import CONTENDED, RELEASE, CpuPressure
from supervisor.daemon.cpu_pressure import HOST, CpuPressureReader, locate, some_total

PSI = "some avg10=1.00 avg60=0.50 avg300=0.10 total={}\nfull avg10=0.00 avg60=0.00 " \
      "avg300=0.00 total=0\n"


def test_the_share_is_the_waiting_time_over_the_interval_with_two_thresholds() -> None:
    cpu = CpuPressure()
    cpu.read(1_000_000, 10.0)
    assert cpu.share is None and not cpu.contended  # one reading: no interval yet
    cpu.read(1_400_000, 11.0)
    assert cpu.share == pytest.approx(0.4) and cpu.contended
    cpu.read(1_550_000, 12.0)  # 15 %: under the threshold that set it, over the release
    assert cpu.share == pytest.approx(0.15) and cpu.contended
    cpu.read(1_600_000, 13.0)  # 5 %: released
    assert not cpu.contended
    cpu.read(1_750_000, 14.0)  # 15 % again: not contended until CONTENDED
    assert not cpu.contended and RELEASE < 0.15 < CONTENDED


def test_unreadable_or_broken_counters_never_count_as_contended() -> None:
    cpu = CpuPressure()
    cpu.read(0, 0.0)
    cpu.read(900_000, 1.0)
    assert cpu.contended
    cpu.read(None, 2.0)  # PSI gone: not known, not contended
    assert cpu.share is None and not cpu.contended
    cpu.read(5_000_000, 3.0)
    cpu.read(5_900_000, 4.0)
    assert cpu.contended
    cpu.read(1_000, 5.0)  # a counter that went back (another cgroup): a new start
    assert cpu.share is None and not cpu.contended
    cpu.read(900_000, 6.0)
    assert cpu.contended
    cpu.read(2_000_000, 6.0)  # no time passed: nothing known
    assert cpu.share is None and not cpu.contended
    cpu.read(-5, 5.0)
    assert cpu.share is None and not cpu.contended
    cpu.read(10**400, 6.0)  # past any 64-bit counter: not a reading
    assert cpu.share is None and not cpu.contended


@given(st.lists(st.tuples(st.one_of(st.none(), st.integers(-10, 2**63)),
                          st.floats(allow_nan=True, allow_infinity=True)), max_size=30))
def test_whatever_the_readings_the_share_is_a_fraction(readings: list[tuple[int | None,
                                                                            float]]) -> None:
    cpu = CpuPressure()
    for total, now in readings:
        cpu.read(total, now)
        assert cpu.share is None or (math.isfinite(cpu.share) and 0.0 <= cpu.share <= 1.0)
        assert cpu.contended in (True, False)
        assert not cpu.contended or cpu.share is not None


def fake_proc(tmp: Path, cgroup_path: str, v2_pressure: str | None) -> tuple[Path, Path]:
    """A /proc/self with a cgroup v2 mount at tmp/cg, our cgroup ``cgroup_path`` under it
    (with a cpu.pressure when ``v2_pressure``), and a host pressure file."""
    proc, mount = tmp / "proc", tmp / "cg"
    proc.mkdir()
    (proc / "cgroup").write_text(f"0::{cgroup_path}\n")
    (proc / "mountinfo").write_text(f"30 20 0:26 / {mount} rw - cgroup2 cgroup2 rw\n")
    directory = mount / cgroup_path.lstrip("/")
    directory.mkdir(parents=True)
    if v2_pressure is not None:
        (directory / "cpu.pressure").write_text(v2_pressure)
    host = tmp / "host_pressure"
    host.write_text(PSI.format(111))
    return proc, host


def test_the_daemons_own_cgroup_is_read_before_the_host(tmp_path: Path) -> None:
    proc, host = fake_proc(tmp_path, "/kubepods/pod1/c1", PSI.format(12_345))
    assert locate(proc, host) == tmp_path / "cg/kubepods/pod1/c1/cpu.pressure"
    assert CpuPressureReader(proc, host).read() == 12_345


def test_a_mount_root_with_a_space_is_read_as_the_kernel_escapes_it(tmp_path: Path) -> None:
    """mountinfo writes a space in a path as \\040, the root field included."""
    proc, host = fake_proc(tmp_path, "/my pod/c1", PSI.format(77))
    mount = tmp_path / "cg"
    (proc / "cgroup").write_text("0::/my pod/c1\n")
    (proc / "mountinfo").write_text(f"30 20 0:26 /my\\040pod {mount} rw - cgroup2 cgroup2 rw\n")
    (mount / "c1").mkdir()
    (mount / "c1" / "cpu.pressure").write_text(PSI.format(88))
    assert locate(proc, host) == mount / "c1" / "cpu.pressure"
    assert CpuPressureReader(proc, host).read() == 88


def test_without_a_cgroup_pressure_file_the_host_is_read(tmp_path: Path) -> None:
    proc, host = fake_proc(tmp_path, "/system.slice/x.service", None)
    assert CpuPressureReader(proc, host).read() == 111
    host.unlink()  # no PSI at all (a kernel without it, or psi=0)
    reader = CpuPressureReader(proc, host)
    assert reader.read() is None and reader.read() is None


def test_a_file_that_turns_unreadable_is_none_and_read_again_once_it_mends(
        tmp_path: Path) -> None:
    proc, host = fake_proc(tmp_path, "/a", PSI.format(7))
    reader = CpuPressureReader(proc, host)
    assert reader.read() == 7
    pressure = tmp_path / "cg/a/cpu.pressure"
    pressure.write_text("garbage\n")
    assert reader.read() is None and reader.failing
    assert reader.read() is None  # located again, still unreadable (logged once)
    pressure.write_text(PSI.format(9))
    assert reader.read() == 9 and not reader.failing


def test_some_total_reads_the_some_line_only() -> None:
    assert some_total(PSI.format(42)) == 42
    for text in ("", "full avg10=0 total=5\n", "some avg10=1.0\n", "some total=x\n"):
        with pytest.raises(ValueError):
            some_total(text)


def test_this_machine_reads_as_its_kernel_allows() -> None:
    """Here, the host's file (or this process's v2 cgroup's); a number that only grows."""
    first = CpuPressureReader().read()
    assert (first is None) == (locate() is None)
    if first is not None:
        assert isinstance(first, int) and first >= 0
        second = CpuPressureReader().read()
        assert second is not None and second >= first
    assert locate() is None or locate() == HOST or locate().name == "cpu.pressure"


def spin(stop: Any) -> None:
    while not stop.is_set():
        pass


@pytest.mark.skipif(locate() is None, reason="this kernel has no CPU pressure (PSI)")
def test_a_live_daemon_reads_the_pressure_and_batches_fuller_under_it(
        supervisor_factory: Any) -> None:
    """A real daemon polled every 0.2 s; more spinning processes than cores make every task
    wait for one (PSI's 'some' near 100 %), and the echo model's adaptive wait, under 16
    clients, says it waits for the cores' sake."""
    sup = supervisor_factory({"supervisor": {"poll_interval": "0.2s"}, "models": {"m": {
        "handler": "worker.handlers:echo", "workers": 2, "options": {"delay": 0.002},
        "batching": {"max_batch_size": 16}}}})
    sup.wait_for(lambda s: s["supervisor"]["cpu_pressure"]["some_share"] is not None, 30,
                 "a CPU pressure share in status")
    stop = multiprocessing.Event()
    spinners = [multiprocessing.Process(target=spin, args=(stop,), daemon=True)
                for _ in range((os.cpu_count() or 1) + 1)]
    done = threading.Event()

    def load() -> None:
        with sup.client(timeout=30) as client:
            while not done.is_set():
                client.infer("m", {"x": np.ones((1, 4), np.float32)})

    clients = [threading.Thread(target=load) for _ in range(16)]
    try:
        for process in spinners:
            process.start()
        for thread in clients:
            thread.start()
        status = sup.wait_for(
            lambda s: s["supervisor"]["cpu_pressure"]["contended"] and "cores being contended"
            in s["models"]["m"]["batches"]["wait"]["why"], 60,
            "the adaptive wait counting the cores as contended")
    finally:
        stop.set()
        done.set()
        for process in spinners:
            process.join(10)
        for thread in clients:
            thread.join(30)
    assert status["supervisor"]["cpu_pressure"]["some_share"] >= 0.2
    assert status["models"]["m"]["batches"]["wait"]["mode"] == "adaptive"
