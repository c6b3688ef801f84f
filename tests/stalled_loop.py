"""Runs the command line it is given (`python -m supervisor run -c CONFIG ...`) with the main
loop's memory poll blocking while a file named STALL exists beside the config: what a read
stuck on the loop does (a /proc file behind a worker's memory-map lock, a hung mount), and
what the liveness probe is for. Only that read is replaced (the name
supervisor.daemon.monitor.read_tree); the loop, the workers and the HTTP listener's threads
are the real daemon's, and the listener runs on while the loop is stuck."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from supervisor.cli.commands import main
from supervisor.daemon import monitor

real_read = monitor.read_tree


def stalling(flag: Path) -> Callable[[int, Iterable[int], str], tuple[int, int, int] | None]:
    def read_tree(pid: int, tree: Iterable[int], metric: str) -> tuple[int, int, int] | None:
        while flag.exists():
            time.sleep(0.05)  # sleeps without the GIL, as a blocked read() waits
        return real_read(pid, tree, metric)
    return read_tree


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[1:3] == ["-m", "supervisor"]:  # the wrapped command line: python -m supervisor
        args = args[3:]
    config = Path(args[args.index("-c") + 1])
    monitor.read_tree = stalling(config.parent / "STALL")
    sys.exit(main(args))
