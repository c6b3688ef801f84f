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
    seconds = _seconds(text)
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_TIMEOUT):
        raise argparse.ArgumentTypeError(
            f"expected seconds, more than 0 and at most {MAX_TIMEOUT:g}, got {text!r}")
    return seconds


def wait_seconds(text: str) -> float:
    """reload's --wait: a finite number of seconds, 0 or more (nan would never run out)."""
    seconds = _seconds(text)
    if not math.isfinite(seconds) or seconds < 0:
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds >= 0, got {text!r}")
    return seconds


def _seconds(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
