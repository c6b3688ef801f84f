"""Runs the command line it is given (`python -m supervisor ...`) with the config file's
reads blocking while a file named HANG exists beside the config, and the code fingerprint's
reads while a file named HANG_CODE does: what a hung network mount does to open() and
read(), which cannot be mounted here. Only the reads themselves are replaced
(supervisor.config.loading._read_regular, supervisor.config.fingerprint._read); everything
else is the real daemon or CLI."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from supervisor.cli.commands import main
from supervisor.config import fingerprint, loading

real_read = loading._read_regular
real_code_read = fingerprint._read
hang_code: list[Path] = []  # the HANG_CODE file: known once the config is read


def hanging_read(file: Path) -> bytes:
    while (file.parent / "HANG").exists():
        time.sleep(0.05)
    hang_code[:] = [file.parent / "HANG_CODE"]
    return real_read(file)


def hanging_code_read(path: Path) -> bytes:
    while hang_code and hang_code[0].exists():
        time.sleep(0.05)
    return real_code_read(path)


if __name__ == "__main__":
    loading._read_regular = hanging_read
    fingerprint._read = hanging_code_read
    args = sys.argv[1:]
    if args[1:3] == ["-m", "supervisor"]:  # the wrapped command line: python -m supervisor
        args = args[3:]
    sys.exit(main(args))
