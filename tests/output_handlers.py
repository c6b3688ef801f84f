"""A handler that writes to stdout and stderr the way TensorFlow and careless handlers do,
for the worker output tests (importable by workers: they run from the repository root)."""

from __future__ import annotations

import os
import resource
import sys
import traceback
from typing import Any

import numpy as np

from supervisor.shared import logs
from worker.handlers import Echo

Arrays = dict[str, np.ndarray]

# Written at load, one line each (the long one is a single 1 MB line).
LONG_LINE = "noisy: long " + "x" * 1_000_000
INIT_TEXT = [
    "noisy: plain text on stdout",
    "noisy: plain text on stderr",
    "noisy: invalid utf-8 \\xff\\xfe here",  # as the supervisor shows those bytes
    '{"note": "JSON that is not a log event"}',
    '{"event": "worker_ready", "worker": "someone-else"}',
    LONG_LINE,
    "noisy: init done",
]
FLOOD_LINES = 20_000
FLOOD = 1.0  # the marker of a job that prints in a tight loop
CRASH = 2.0  # the marker of a job that prints a traceback and aborts


def crash_report() -> str:
    """A real Python traceback, then TF's C++ way of dying (a failed CHECK before abort)."""
    try:
        _load_weights()
    except RuntimeError:
        text = traceback.format_exc()
    return text + ("F0000 00:00:1712345678.123456    4242 op_kernel.cc:99] Check failed: "
                   "dims == 2 (3 vs. 2)\n")


def _load_weights() -> None:
    raise RuntimeError("weights file is corrupt")


class Noisy(Echo):
    def __init__(self, options: dict[str, Any]) -> None:
        super().__init__(options)
        print(INIT_TEXT[0])
        print(INIT_TEXT[1], file=sys.stderr)
        sys.stdout.flush()
        os.write(1, b"noisy: invalid utf-8 \xff\xfe here\n")
        for line in INIT_TEXT[3:6]:
            print(line)
        logs.get("handler").info("noisy_loaded")  # the worker's own event: passes through
        print(INIT_TEXT[6])

    def respond(self, inputs: Arrays) -> Arrays:
        marker = float(next(iter(inputs.values())).ravel()[0])
        if marker == FLOOD:
            for i in range(FLOOD_LINES):
                print(f"flood {i}")
        elif marker == CRASH:
            sys.stderr.write(crash_report())
            sys.stderr.flush()
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file in the repo
            os.abort()
        return super().respond(inputs)


def noisy(options: dict[str, Any]) -> Noisy:
    return Noisy(options)


# Written by TensorFlow itself, natively: what TensorFlow prints of its own accord at start
# depends on the CPU (nothing at all on an AMD EPYC with TF_CPP_MIN_LOG_LEVEL=1).
TF_LINE = "tf_noisy: written by TensorFlow's print kernel"


class TfNoisy(Echo):
    def __init__(self, options: dict[str, Any]) -> None:
        super().__init__(options)
        import tensorflow as tf

        # The PrintV2 kernel writes to file descriptor 2 from C++ (std::cerr), not through
        # Python's sys.stderr: the way TensorFlow's own start-up lines come out.
        tf.print(TF_LINE, output_stream=sys.stderr)


def tf_noisy(options: dict[str, Any]) -> TfNoisy:
    return TfNoisy(options)
