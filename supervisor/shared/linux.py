"""The two prctl(2) calls the supervisor and its workers make (Linux only; elsewhere they
do nothing, and the parent watch in the worker's heartbeat covers the rest)."""

from __future__ import annotations

import ctypes

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def prctl(option: int, value: int) -> bool:
    """True if the kernel took it."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        return int(libc.prctl(option, value, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False
