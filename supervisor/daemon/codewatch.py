"""Fingerprints of every model's code on disk (config/fingerprint.py), taken off the main
loop: at start (with a deadline), and every CHECK seconds after, so that `status` can say
when live workers run code that differs from what is on disk.

A check runs off the loop (daemon/offloop.py); one that does not return (a hung mount) is
never stacked upon: no new check starts until it does, and `status` keeps the last result.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from supervisor.config.fingerprint import Progress, fingerprint
from supervisor.config.keys import Config
from supervisor.daemon.offloop import OffLoop, Task

# How often the code on disk is fingerprinted again (seconds): stat calls, and a read of
# the small files (handler modules), for each model.
CHECK = 10.0

Prints = dict[str, str | None]  # None: not known (a handler module not found)


def fingerprints(config: Config, progress: Progress | None = None) -> Prints:
    """Every model's, now (blocks on the files: off the loop); ``progress`` is told each
    file before it is looked at (what a reload that timed out names)."""
    base = config.path.parent.resolve() if config.path is not None else None
    runtime = Path(config.runtime_dir)
    return {name: fingerprint(model, base, runtime, progress)
            for name, model in config.models.items()}


def fingerprints_within(offloop: OffLoop, config: Config, timeout: float) -> Prints | None:
    """Every model's, or None when the files did not answer within ``timeout``. Blocks:
    before the loop runs only."""
    check = offloop.submit("code-check", partial(fingerprints, config), timeout)
    return _found(check) if check.wait(timeout) else None


def _found(check: Task[Prints]) -> Prints:
    """A returned check's fingerprints: none from one that failed (the next one may not)."""
    return {} if check.error is not None or check.value is None else check.value


class CodeWatch:
    def __init__(self, offloop: OffLoop) -> None:
        self.offloop = offloop
        self.next_check = 0.0
        self.running: Task[Prints] | None = None

    def due(self, config: Config, now: float) -> Prints | None:
        """From housekeeping: a finished check's fingerprints (once); starts the next one
        when it is time."""
        running = self.running
        if running is not None and running.done():
            self.running = None
            return _found(running)
        if running is None and now >= self.next_check:
            self.next_check = now + CHECK
            # Past CHECK it is stuck (counted); the next waits for it all the same.
            self.running = self.offloop.submit("code-check", partial(fingerprints, config),
                                               CHECK)
        return None
