"""Why a daemon could not start: one error event, one exit status from the documented set
(supervisor/shared/exitcodes.py DaemonExit), never a traceback for a condition an operator fixes.

Each step of the start names what it is doing; whatever it raises is turned into a
StartError here, in one place, so the table of causes and statuses is written once.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator

import zmq

from supervisor.daemon.instance_lock import AlreadyRunning
from supervisor.daemon.security import KeyDirError, RuntimeDirError, UnknownGroup
from supervisor.shared.exitcodes import DaemonExit

_ADDRESS_ERRNOS = (errno.EADDRINUSE, errno.EADDRNOTAVAIL)


class StartError(Exception):
    def __init__(self, code: DaemonExit, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@contextlib.contextmanager
def step(what: str, runtime_dir: bool = False) -> Iterator[None]:
    """Run one step of the start; ``runtime_dir``: the step writes in the runtime dir, so
    an OS error there means the directory (not an address) is the problem."""
    try:
        yield
    except StartError:
        raise
    except AlreadyRunning as exc:
        raise StartError(DaemonExit.ALREADY_RUNNING, str(exc)) from None
    except (KeyDirError, UnknownGroup) as exc:
        raise StartError(DaemonExit.CONFIG, str(exc)) from None
    except RuntimeDirError as exc:
        raise StartError(DaemonExit.RUNTIME_DIR, str(exc)) from None
    except (zmq.ZMQError, OSError) as exc:
        raise StartError(_os_status(exc, runtime_dir), f"{what}: {_strerror(exc)}") from None
    except ValueError as exc:  # a certificate file without the key it should hold
        raise StartError(DaemonExit.CONFIG, f"{what}: {exc}") from None


def _os_status(exc: zmq.ZMQError | OSError, runtime_dir: bool) -> DaemonExit:
    if exc.errno in _ADDRESS_ERRNOS:
        return DaemonExit.ADDRESS_IN_USE
    if runtime_dir:
        return DaemonExit.RUNTIME_DIR
    return DaemonExit.START_FAILED


def _strerror(exc: zmq.ZMQError | OSError) -> str:
    text = exc.strerror or str(exc)
    filename = getattr(exc, "filename", None)
    return f"{text} ({filename})" if filename else text
