"""Errors the main loop survives, logged so that one that recurs on every turn does not
flood the log: its traceback once, then a count at most once a minute."""

from __future__ import annotations

import traceback

from supervisor.shared import logs

log = logs.get(__name__)

# A failure that recurs is told again, as a count, at most this often (seconds).
PERIOD = 60.0
# Distinct failures remembered; past this the oldest is forgotten (and told again in full).
KEPT = 64


class Failures:
    def __init__(self) -> None:
        # (event, where and what) -> (when last told, times since then)
        self.seen: dict[tuple[str, str], tuple[float, int]] = {}

    def failed(self, event: str, exc: BaseException, now: float) -> None:
        key = (event, _where(exc))
        last = self.seen.get(key)
        if last is None:
            if len(self.seen) >= KEPT:
                del self.seen[next(iter(self.seen))]
            self.seen[key] = (now, 0)
            log.error(event, exc_info=exc)
        elif now - last[0] >= PERIOD:
            self.seen[key] = (now, 0)
            log.error(event, error=f"{type(exc).__name__}: {exc}", repeated=last[1] + 1,
                      seconds=round(now - last[0]),
                      hint="the same failure again (its traceback was logged the first "
                      "time); the loop goes on")
        else:
            self.seen[key] = (last[0], last[1] + 1)


def _where(exc: BaseException) -> str:
    """The failure's kind and the line it came from: the same bug, whatever its message
    says (a pid, a path)."""
    frames = traceback.extract_tb(exc.__traceback__)
    place = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"
    return f"{type(exc).__name__} at {place}"
