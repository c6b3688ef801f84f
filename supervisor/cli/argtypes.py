"""Argument types shared by the CLI's commands."""

from __future__ import annotations

import argparse
import math

# The longest --timeout: ZeroMQ's poll takes whole milliseconds in a C int64, and a thread's
# join refuses more than threading.TIMEOUT_MAX; a day is far beyond any command's wait.
MAX_TIMEOUT = 86400.0


def timeout_seconds(text: str) -> float:
    """--timeout (and top's --interval): a finite number of seconds, more than 0 and at most
    a day. nan never runs out, inf and 1e300 overflow the poll, 0 or less gives up before
    asking."""
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_TIMEOUT):
        raise argparse.ArgumentTypeError(
            f"expected seconds, more than 0 and at most {MAX_TIMEOUT:g}, got {text!r}")
    return seconds
