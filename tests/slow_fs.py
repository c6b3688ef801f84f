"""Runs the command line it is given (`python -m supervisor ...`) with the config file's
reads blocking while a file named HANG exists beside the config: what a hung network mount
does to open() and read(), which cannot be mounted here. Only the read itself is replaced
(supervisor.config.loading._read_regular); everything else is the real daemon or CLI."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from supervisor.cli.commands import main
from supervisor.config import loading

real_read = loading._read_regular


def hanging_read(file: Path) -> bytes:
    while (file.parent / "HANG").exists():
        time.sleep(0.05)
    return real_read(file)


if __name__ == "__main__":
    loading._read_regular = hanging_read
    args = sys.argv[1:]
    if args[1:3] == ["-m", "supervisor"]:  # the wrapped command line: python -m supervisor
        args = args[3:]
    sys.exit(main(args))
