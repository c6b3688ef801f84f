"""Fingerprints of every model's code on disk (config/fingerprint.py), taken off the main
loop: at start (with a deadline), and every CHECK seconds after, so that `status` can say
when live workers run code that differs from what is on disk.

A check runs in a thread of its own; one that does not return (a hung mount) is never
stacked upon: no new check starts until it does, and `status` keeps the last result.
"""

from __future__ import annotations

import threading
from pathlib import Path

from supervisor.config.fingerprint import Progress, fingerprint
from supervisor.config.keys import Config

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


def fingerprints_within(config: Config, timeout: float) -> Prints | None:
    """Every model's, or None when the files did not answer within ``timeout``."""
    check = _Check(config)
    check.thread.join(timeout)
    return check.result


class _Check:
    def __init__(self, config: Config) -> None:
        self.result: Prints | None = None
        self.thread = threading.Thread(target=self._run, args=(config,), name="code-check",
                                       daemon=True)
        self.thread.start()

    def _run(self, config: Config) -> None:
        try:
            self.result = fingerprints(config)
        except Exception:  # a check that fails says nothing; the next one may
            self.result = {}


class CodeWatch:
    def __init__(self) -> None:
        self.next_check = 0.0
        self.running: _Check | None = None

    def due(self, config: Config, now: float) -> Prints | None:
        """From housekeeping: a finished check's fingerprints (once); starts the next one
        when it is time."""
        running = self.running
        if running is not None and not running.thread.is_alive():
            self.running = None
            return running.result
        if running is None and now >= self.next_check:
            self.next_check = now + CHECK
            self.running = _Check(config)
        return None
