"""CURVE certificate files, read only when they are small regular files.

``zmq.auth.load_certificate`` opens the path it is given and reads it whole: a FIFO named as
a key waited for a writer (``tfsupervisor check`` hung, and so would the daemon's start), and
a device such as /dev/zero or a huge file would swamp whoever reads it. The daemon (server
key, client keys), the CLI's preflight and the client all read certificates through here.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import zmq.auth

MAX_KEY_FILE = 64 * 1024  # a certificate is a few hundred bytes


def load_certificate(path: str | os.PathLike[str]) -> tuple[bytes, bytes | None]:
    """(public key, secret key or None); ValueError if the path is not a regular file of at
    most MAX_KEY_FILE bytes (stat never blocks on a FIFO), OSError if it cannot be read.
    The error does not name the path: callers say which setting it came from."""
    file = Path(path)
    info = file.stat()
    if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_KEY_FILE:
        raise ValueError(f"not a regular file of at most {MAX_KEY_FILE} bytes")
    return zmq.auth.load_certificate(file)
