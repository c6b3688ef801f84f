"""The two prctl(2) calls the supervisor and its workers make (Linux only; elsewhere they
do nothing, and the parent watch in the worker's heartbeat covers the rest), and the
oom_score_adj the supervisor gives its workers."""

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


def raise_oom_score(pid: int, value: int) -> int | None:
    """Set ``pid``'s oom_score_adj to ``value``, or to the caller's own when ``value`` is
    lower: the point is that a worker is the likelier victim, and going below one's own
    needs CAP_SYS_RESOURCE. Returns what was set; None if it failed (no /proc, the process
    is gone)."""
    try:
        with open("/proc/self/oom_score_adj") as own:
            value = max(value, int(own.read()))
        with open(f"/proc/{pid}/oom_score_adj", "w") as target:
            target.write(str(value))
    except (OSError, ValueError):
        return None
    return value
