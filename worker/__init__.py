"""Worker processes: everything that touches TensorFlow lives in this package.

A handler may call :func:`request_recycle` when it knows its process should be replaced
(it noticed its own caches growing, say): the worker answers the batch in hand with the
``leaving`` flag set on those RESULTS, so the supervisor sends it nothing more, then exits
with ``WorkerExit.RECYCLE`` and the supervisor starts a fresh one.
"""

from __future__ import annotations

import threading

_recycle = threading.Event()


def request_recycle() -> None:
    """Ask to be replaced once the jobs in hand are answered."""
    _recycle.set()


def recycle_requested() -> bool:
    return _recycle.is_set()
