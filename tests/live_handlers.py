"""Handlers for the live regression tests (importable by workers: they run from the
repository root). Each reproduces one way a handler once broke a promise."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

import numpy as np

from worker.handlers import Echo

Arrays = dict[str, np.ndarray]


class Undeclared:
    """Declares no inputs (so admission cannot check them) and echoes what it gets."""

    outputs = None

    def __init__(self, options: dict[str, Any]) -> None:
        self.inputs = None

    def __call__(self, inputs: Arrays) -> Arrays:
        return {name: np.array(value) for name, value in inputs.items()}


class BigError(Echo):
    """Raises an error whose text is ``size`` characters for a row marked 1.0."""

    def __init__(self, options: dict[str, Any]) -> None:
        super().__init__(options)
        self.size = int(options.get("size", 200_000))

    def respond(self, inputs: Arrays) -> Arrays:
        if float(inputs["x"].ravel()[0]) == 1.0:
            raise RuntimeError("x" * self.size)
        return super().respond(inputs)


class Hog(Echo):
    """Holds ``hog_bytes`` of resident memory for ``hold_seconds`` on a row marked 1.0."""

    def __init__(self, options: dict[str, Any]) -> None:
        super().__init__(options)
        self.hog = int(options.get("hog_bytes", 300 * 1024**2))
        self.hold = float(options.get("hold_seconds", 3.0))

    def respond(self, inputs: Arrays) -> Arrays:
        if float(inputs["x"].ravel()[0]) == 1.0:
            held = bytearray(b"\x01" * self.hog)
            time.sleep(self.hold)
            del held
        return super().respond(inputs)


def undeclared(options: dict[str, Any]) -> Undeclared:
    return Undeclared(options)


def big_error(options: dict[str, Any]) -> BigError:
    return BigError(options)


def hog(options: dict[str, Any]) -> Hog:
    return Hog(options)



# A process that says its pid (appending "session PID" to the file named by its argument) and
# sleeps: the same command line serves for a look-alike the test starts itself.
SESSION_CHILD = ("import os, sys, time; open(sys.argv[1], 'a').write(f'session {os.getpid()}\\n'); "
                 "time.sleep(600)")


class Spawner(Echo):
    """Starts child processes, as handlers that shell out do: on a row marked 1.0 a child
    in the worker's process group that holds ``child_bytes``; on 2.0 one that escapes the
    group (``setsid``: a new session) and is orphaned once it has said its pid; on 4.0 one
    in a session of its own that stays its child. Each child's pid is appended to the file
    ``pids``."""

    def __init__(self, options: dict[str, Any]) -> None:
        super().__init__(options)
        self.pids = str(options["pids"])
        self.child_bytes = int(options.get("child_bytes", 200 * 1024**2))

    def respond(self, inputs: Arrays) -> Arrays:
        mark = float(inputs["x"].ravel()[0])
        if mark == 1.0:
            hold = (f"import os, time; b = bytearray(b'\\x01' * {self.child_bytes}); "
                    f"open({self.pids!r}, 'a').write(f'held {{os.getpid()}}\\n'); time.sleep(600)")
            subprocess.Popen([sys.executable, "-c", hold])
        elif mark == 2.0:
            # The escaper says its pid before its parent exits and leaves it an orphan
            # (once it is one, the supervisor may kill it at any moment).
            escaper = f"echo escaped $$ >> {self.pids}; exec sleep 600"
            script = (f"setsid sh -c '{escaper}' & "
                      f"until grep -qs escaped {self.pids}; do sleep 0.05; done")
            subprocess.run(["sh", "-c", script], check=True, timeout=60)
        elif mark == 3.0:
            # The same with an empty environment (no TFSUPERVISOR_TREE mark), its parent
            # staying until the file ``pids``.release exists: the supervisor has seen it.
            bare = f"echo bare $$ >> {self.pids}; exec sleep 600"
            script = (f"env -i setsid sh -c '{bare}' & "
                      f"until [ -e {self.pids}.release ]; do sleep 0.05; done")
            subprocess.Popen(["sh", "-c", script])
        elif mark == 4.0:
            # A child in a session of its own that stays the worker's child: it outlives a
            # worker that dies with its supervisor (killed outright), re-parented to init.
            subprocess.Popen([sys.executable, "-c", SESSION_CHILD, self.pids],
                             start_new_session=True)
        return super().respond(inputs)


def spawner(options: dict[str, Any]) -> Spawner:
    return Spawner(options)


class Orphans(Echo):
    """On a row marked 3.0, leaves an orphan behind: a shell starts `sleep` in the
    background and exits, so the sleep is re-parented (to the nearest subreaper, or to the
    PID namespace's init). Its pid, as this worker sees it, is the output ``orphan``."""

    def __init__(self, options: dict[str, Any]) -> None:
        super().__init__(options)
        self.seconds = float(options.get("orphan_seconds", 2.0))

    def respond(self, inputs: Arrays) -> Arrays:
        out = super().respond(inputs)
        if float(inputs["x"].ravel()[0]) == 3.0:
            shell = subprocess.run(
                ["/bin/sh", "-c", f"sleep {self.seconds} </dev/null >/dev/null 2>&1 & echo $!"],
                capture_output=True, text=True, timeout=30, check=True)
            out["orphan"] = np.array([int(shell.stdout.strip())], np.int64)
        return out


def orphans(options: dict[str, Any]) -> Orphans:
    return Orphans(options)


class Gated(Echo):
    """Holds a row marked ``marker`` until the file ``release`` exists (at most a minute):
    a job that stays in flight exactly as long as a test needs, whatever the machine's
    speed, where a fixed sleep raced the test's own commands on a loaded machine."""

    def __init__(self, options: dict[str, Any]) -> None:
        super().__init__(options)
        self.marker = float(options["marker"])
        self.release = options["release"]

    def respond(self, inputs: Arrays) -> Arrays:
        if float(inputs["x"].ravel()[0]) == self.marker:
            deadline = time.monotonic() + 60.0
            while not os.path.exists(self.release) and time.monotonic() < deadline:
                time.sleep(0.01)
        return super().respond(inputs)


class Ballast(Echo):
    """Holds ``ballast_bytes`` of private memory from its start (a model's weights, say): a
    replacement beside it adds that much to the container."""

    def __init__(self, options: dict[str, Any]) -> None:
        super().__init__(options)
        # Filled in place: no transient copy twice its size on the way.
        self.ballast = bytearray(b"\x01") * int(options.get("ballast_bytes", 100 * 1024**2))


def ballast(options: dict[str, Any]) -> Ballast:
    return Ballast(options)
