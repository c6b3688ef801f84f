"""VRAM through NVML. No GPU here: a stand-in with pynvml's own interface (the functions the
reader calls, with the same shapes of results and errors) drives every path."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import structlog

from supervisor.daemon.gpu import VramReader


@dataclass
class Proc:
    pid: int
    usedGpuMemory: int | None


class FakeNvml:
    def __init__(self, devices: list[list[Proc]], init_error: str | None = None) -> None:
        self.devices, self.init_error = devices, init_error
        self.fail_reads = False

    def nvmlInit(self) -> None:
        if self.init_error:
            raise RuntimeError(self.init_error)

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[Proc]:
        if self.fail_reads:
            raise RuntimeError("GPU is lost")
        return self.devices[handle]


def events() -> Any:
    return structlog.testing.capture_logs()


def test_usage_is_summed_per_pid_across_devices() -> None:
    nvml = FakeNvml([[Proc(10, 1000), Proc(11, 2000)], [Proc(10, 500), Proc(99, 7)]])
    assert VramReader(nvml).read([10, 11, 12]) == {10: 1500, 11: 2000}


def test_unknown_usage_is_skipped() -> None:
    nvml = FakeNvml([[Proc(10, None), Proc(11, 3)]])
    assert VramReader(nvml).read([10, 11]) == {11: 3}


@pytest.mark.parametrize(("error", "level"), [("NVML Shared Library Not Found", "info"),
                                               ("Insufficient Permissions", "warning")])
def test_init_failure_is_reported_once(error: str, level: str) -> None:
    reader = VramReader(FakeNvml([[Proc(1, 1)]], init_error=error))
    with events() as logs:
        assert reader.read([1]) == {} and reader.read([1]) == {}
    assert [(e["event"], e["log_level"]) for e in logs] == [("vram_unavailable", level)]


def test_no_gpu_and_read_errors_never_raise() -> None:
    with events() as logs:
        assert VramReader(FakeNvml([])).read([1]) == {}
        nvml = FakeNvml([[Proc(1, 5)]])
        reader = VramReader(nvml)
        assert reader.read([1]) == {1: 5}
        nvml.fail_reads = True
        assert reader.read([1]) == {} and reader.read([1]) == {}
    assert [e["reason"] for e in logs] == ["no_gpu", "nvml_read"]


def test_pid_namespace_mismatch_is_reported_once() -> None:
    reader = VramReader(FakeNvml([[Proc(4242, 10)]]))  # host pids, none of ours
    with events() as logs:
        assert reader.read([10, 11]) == {} and reader.read([10]) == {}
    assert [e["reason"] for e in logs] == ["pid_namespace"]
