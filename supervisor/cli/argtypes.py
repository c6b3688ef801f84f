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


# infer --random's rows at most: past this the arrays the CLI would draw outgrow any sane
# request (and the default max_message_size) before a byte is sent.
MAX_BATCH = 100_000


def batch_rows(text: str) -> int:
    """infer's --batch: a whole number of rows, 1 to MAX_BATCH (negative failed in numpy with
    a traceback; 10^8 tried to allocate tens of GiB)."""
    try:
        rows = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of rows, got {text!r}") \
            from None
    if not 1 <= rows <= MAX_BATCH:
        raise argparse.ArgumentTypeError(f"expected 1 to {MAX_BATCH} rows, got {text!r}")
    return rows
