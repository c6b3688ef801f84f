"""Built-in handlers, TF-free: for tests, fault drills and trying the supervisor out.

Each is a factory ``f(options) -> callable``. Options common to all:
  ``inputs``: {name: {dtype, shape}} declared to the supervisor (default x: float32[None, 4]).
Markers let a test ask one job to misbehave: a first element equal to ``crash_on`` kills the
worker, ``hang_on`` hangs it (native-style, ignoring SIGTERM), ``sleep_on`` sleeps
``sleep_seconds`` before answering.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import numpy as np

from supervisor.protocol import TensorSpec

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
        self.hang_on = options.get("hang_on")
        self.sleep_on = options.get("sleep_on")
        self.sleep_seconds = float(options.get("sleep_seconds", 0.0))
        self.delay = float(options.get("delay", 0.0))

    def __call__(self, inputs: Arrays) -> Arrays:
        first = next(iter(inputs.values())).ravel()
        marker = float(first[0]) if first.size else None
        if marker is not None and marker == self.crash_on:
            os.kill(os.getpid(), signal.SIGKILL)
        if marker is not None and marker == self.hang_on:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
            while True:
                time.sleep(3600)
        if marker is not None and marker == self.sleep_on:
            time.sleep(self.sleep_seconds)
        if self.delay:
            time.sleep(self.delay)
        return self.respond(inputs)

    def respond(self, inputs: Arrays) -> Arrays:
        return {name: np.array(value) for name, value in inputs.items()}


class Leak(Echo):
    """Echo that keeps ``bytes_per_job`` bytes per job forever (touched, so resident)."""

    def __init__(self, options: dict[str, Any]) -> None:
        super().__init__(options)
        self.bytes_per_job = int(options.get("bytes_per_job", 1024 * 1024))
        self.hoard: list[bytearray] = []

    def respond(self, inputs: Arrays) -> Arrays:
        self.hoard.append(bytearray(b"\x01" * self.bytes_per_job))
        return super().respond(inputs)


def echo(options: dict[str, Any]) -> Echo:
    return Echo(options)


def leak(options: dict[str, Any]) -> Leak:
    return Leak(options)


def broken(options: dict[str, Any]) -> Echo:
    """A factory that always fails: drills the load-error backoff."""
    raise RuntimeError(options.get("message", "this handler never loads"))
