"""GPU memory per process through NVML (nvidia-ml-py), when there is a GPU to read.

Everything that can go wrong here — no library, no driver, no GPU, a permission error, a
container whose PIDs NVML cannot see — is reported once and turns readings into None. The
monitor loop never fails because of it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from supervisor.shared import logs

log = logs.get(__name__)


class VramReader:
    """Used GPU memory by pid, summed over devices. ``read`` returns {} when unavailable."""

    def __init__(self, nvml: Any = None) -> None:
        self._nvml = nvml  # injectable for tests; the real module is imported lazily
        self._state = "new"  # new -> ready | off
        self._warned: set[str] = set()

    def _start(self) -> bool:
        if self._state == "new":
            self._state = "off"
            try:
                if self._nvml is None:
                    import pynvml

                    self._nvml = pynvml
                self._nvml.nvmlInit()
                count = self._nvml.nvmlDeviceGetCount()
            except ImportError:
                self._once("no_nvml", "nvidia-ml-py is not installed: VRAM is not read")
                return False
            except Exception as exc:  # NVMLError and friends: no driver, no permission
                expected = "Library Not Found" in str(exc) or "Driver Not Loaded" in str(exc)
                self._once("nvml_init", f"NVML unavailable, VRAM is not read: {exc}",
                           "info" if expected else "warning")  # no GPU here: nothing wrong
                return False
            if count == 0:
                self._once("no_gpu", "NVML finds no GPU: VRAM is not read", "info")
                return False
            self._state = "ready"
        return self._state == "ready"

    def read(self, pids: Iterable[int]) -> dict[int, int]:
        """Used GPU memory in bytes for each of ``pids`` that NVML reports."""
        wanted = set(pids)
        if not wanted or not self._start():
            return {}
        nvml = self._nvml
        used: dict[int, int] = {}
        seen_any = False
        try:
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    seen_any = True
                    memory = getattr(proc, "usedGpuMemory", None)
                    if proc.pid in wanted and isinstance(memory, int):
                        used[proc.pid] = used.get(proc.pid, 0) + memory
        except Exception as exc:
            self._once("nvml_read", f"NVML read failed, VRAM readings skipped: {exc}")
            return {}
        if seen_any and not used:
            self._once("pid_namespace", "NVML lists GPU processes but none of our workers' "
                       "pids: the supervisor probably runs in a container whose PID namespace "
                       "differs from the driver's (see docs/deployment.md, GPU notes)")
        return used

    def _once(self, key: str, message: str, level: str = "warning") -> None:
        if key not in self._warned:
            self._warned.add(key)
            getattr(log, level)("vram_unavailable", reason=key, detail=message)
