"""What a worker's exit status means. Shared by the worker (which exits with them) and the
pool (which decides from them whether to restart at once, back off, or mark a model down)."""

from __future__ import annotations

import signal
from enum import IntEnum


class WorkerExit(IntEnum):
    OK = 0  # asked to stop, stopped cleanly
    BOOT_ERROR = 2  # bad arguments or environment: a bug or a broken install, not the model
    LOAD_ERROR = 3  # the model could not be loaded or warmed up
    RECYCLE = 4  # the worker asked to be replaced (e.g. a handler noticed its own state)
    ORPHANED = 5  # the supervisor went away
    INTERNAL = 6  # an unexpected error in the worker's own loop
    # Never an exit status: the supervisor could not start the process at all (fork or exec
    # failed, e.g. EAGAIN), which it treats like a worker that failed to boot.
    SPAWN_FAILED = 7


# Statuses a worker gives itself only before it is ready: after that, one of them is the
# model's own code exiting (a handler's os._exit(3) mid-serving is no load error).
BEFORE_READY = (WorkerExit.BOOT_ERROR, WorkerExit.LOAD_ERROR)


def describe_exit(returncode: int, served: bool = False) -> str:
    """'exit 3 (LOAD_ERROR)' or 'signal SIGKILL' for a Popen returncode; ``served``: the
    worker had been ready, so a status it gives itself only before that is not named."""
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    if served and returncode in BEFORE_READY:
        return f"exit {returncode} (while serving: the model's own code exited, not a " \
            "load error)"
    try:
        return f"exit {returncode} ({WorkerExit(returncode).name})"
    except ValueError:
        return f"exit {returncode}"


class DaemonExit(IntEnum):
    """`tfsupervisor run`'s exit status (docs/operations.md). The systemd unit lists those a
    restart cannot fix in RestartPreventExitStatus=."""

    OK = 0  # stopped by a signal, after draining
    CONFIG = 1  # the config, a key file or a group it names cannot be used
    USAGE = 2  # a bad command line (argparse's own status)
    ALREADY_RUNNING = 3  # another live supervisor owns the runtime dir or an ipc endpoint
    ADDRESS_IN_USE = 4  # a TCP endpoint or the metrics port is taken or not available here
    RUNTIME_DIR = 5  # the runtime dir, or a socket in it, cannot be created or written
    START_FAILED = 6  # anything else that stopped the start, or a crash (a bug): the event says
