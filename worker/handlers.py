"""Built-in handlers, TF-free: for tests, fault drills and trying the supervisor out.

Each is a factory ``f(options) -> callable``. Options common to all:
  ``inputs``: {name: {dtype, shape}} declared to the supervisor (default x: float32[None, 4]);
  ``startup_seconds``: time spent loading, as a real model takes (default 0);
  ``startup_exit``: then os._exit with that status, saying nothing (default: none).
Markers let a test ask one job to misbehave: a first element equal to ``crash_on`` kills the
worker, ``exit_on`` ends it with os._exit(``exit_code``) as a handler of its own might,
``hang_on`` hangs it (native-style, ignoring SIGTERM), ``sleep_on`` sleeps
``sleep_seconds`` before answering.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import numpy as np

from supervisor.shared.protocol import TensorSpec
from worker import request_recycle

Arrays = dict[str, np.ndarray]


def _specs(options: dict[str, Any]) -> list[TensorSpec]:
    declared = options.get("inputs", {"x": {"dtype": "float32", "shape": [None, 4]}})
    return [TensorSpec.from_wire({"name": n, **s}, allow_none=True) for n, s in declared.items()]


class Echo:
    """Returns its inputs as outputs ``<name>`` (same dtype and shape)."""

    def __init__(self, options: dict[str, Any]) -> None:
        self.inputs = _specs(options)
        self.outputs = None
        self.crash_on = options.get("crash_on")
        self.exit_on = options.get("exit_on")  # os._exit(exit_code), as a handler may
        self.exit_code = int(options.get("exit_code", 1))
        self.hang_on = options.get("hang_on")
        self.sleep_on = options.get("sleep_on")
        self.sleep_seconds = float(options.get("sleep_seconds", 0.0))
        self.delay = float(options.get("delay", 0.0))
        self.recycle_after = options.get("recycle_after")  # calls, then request_recycle()
        self.calls = 0
        self.marked = any(m is not None for m in (self.crash_on, self.hang_on, self.sleep_on,
                                                  self.exit_on))
        time.sleep(float(options.get("startup_seconds", 0.0)))
        if options.get("startup_exit") is not None:  # a model that ends its own loading
            os._exit(int(options["startup_exit"]))

    def __call__(self, inputs: Arrays) -> Arrays:
        if self.marked:  # reading the markers is most of an echo's cost: only when asked
            self._drill(_markers(next(iter(inputs.values()))))
        if self.delay:
            time.sleep(self.delay)
        self.calls += 1
        if self.recycle_after is not None and self.calls >= int(self.recycle_after):
            request_recycle()
        return self.respond(inputs)

    def respond(self, inputs: Arrays) -> Arrays:
        return {name: np.array(value) for name, value in inputs.items()}

    def _drill(self, markers: set[float]) -> None:
        if self.crash_on in markers:
            os.kill(os.getpid(), signal.SIGKILL)
        if self.exit_on in markers:
            os._exit(self.exit_code)
        if self.hang_on in markers:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
            while True:
                time.sleep(3600)
        if self.sleep_on in markers:
            time.sleep(self.sleep_seconds)


def _markers(first: np.ndarray) -> set[float]:
    """Each row's first element is its marker (a batch may hold several jobs); strings carry
    none."""
    if first.ndim == 0 or first.dtype.kind not in "biuf":
        return set()
    return {float(row.ravel()[0]) for row in first if row.size}


class Leak(Echo):
    """Echo that keeps ``bytes_per_job`` bytes per row forever (touched, so resident): with
    one row a job, the leak per job does not depend on how jobs are batched."""

    def __init__(self, options: dict[str, Any]) -> None:
        super().__init__(options)
        self.bytes_per_job = int(options.get("bytes_per_job", 1024 * 1024))
        self.hoard: list[bytearray] = []

    def respond(self, inputs: Arrays) -> Arrays:
        first = next(iter(inputs.values()))
        rows = first.shape[0] if first.ndim else 1
        self.hoard.append(bytearray(b"\x01" * (self.bytes_per_job * rows)))
        return super().respond(inputs)


def echo(options: dict[str, Any]) -> Echo:
    return Echo(options)


def leak(options: dict[str, Any]) -> Leak:
    return Leak(options)


def broken(options: dict[str, Any]) -> Echo:
    """A factory that always fails: drills the load-error backoff."""
    raise RuntimeError(options.get("message", "this handler never loads"))
