"""Parsing and formatting of sizes (bytes) and durations (seconds).

Sizes accept plain bytes or a number with a unit: decimal (kB, MB, GB, TB) or binary
(KiB, MiB, GiB, TiB). Durations accept plain seconds or a number with ms, s, m, h or d.
Both must be finite: a size at most MAX_SIZE (2**63-1 bytes, what an int64 holds), a
duration at most MAX_DURATION (10 years; longer is "never", which is what null says).
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "k": 1024,
    "kib": 1024,
    "m": 1024**2,
    "mib": 1024**2,
    "g": 1024**3,
    "gib": 1024**3,
    "tib": 1024**4,
}
_DURATION_UNITS = {"": 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_NUMBER_UNIT = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$")
# Longest number accepted in a string: a longer one is a typo or an attack, never a setting
# (and Python refuses to convert more than 4300 digits anyway).
_MAX_DIGITS = 64

MAX_SIZE = 2**63 - 1
MAX_DURATION = 10 * 365 * 86400.0  # 10 years, in seconds
_SIZE_FORMS = "expected a size such as 512MiB, 2GB or a number of bytes"
_DURATION_FORMS = "expected a duration such as 30s, 5m, 24h or a number of seconds"


def parse_size(value: object) -> int:
    """Return a size in bytes; raise ValueError with the accepted forms otherwise."""
    number = _quantity(value, "size", _SIZE_UNITS, _SIZE_FORMS)
    if number > MAX_SIZE:
        raise ValueError("expected a size of at most 2**63-1 bytes (8 EiB)")
    return int(number)


def parse_duration(value: object) -> float:
    """Return a duration in seconds; raise ValueError with the accepted forms otherwise."""
    number = _quantity(value, "duration", _DURATION_UNITS, _DURATION_FORMS)
    if number > MAX_DURATION:
        raise ValueError("expected a duration of at most 10 years (null turns a limit off)")
    return float(number)


def _quantity(value: object, what: str, units: dict[str, float] | dict[str, int],
              forms: str) -> Fraction:
    """A non-negative exact number from a number or a string with a unit."""
    if isinstance(value, bool):
        raise ValueError(forms)
    if isinstance(value, int | float):
        number = _finite(value, what)
    elif isinstance(value, str):
        number = _number_with_unit(value, units, forms)
    else:
        raise ValueError(forms)
    if number < 0:
        raise ValueError(f"expected a {what} >= 0")
    return number


def _finite(value: int | float, what: str) -> Fraction:
    """An exact number (no float overflow or rounding on the way); NaN and infinities are
    refused."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"expected a finite {what}")
    return Fraction(value)


def _number_with_unit(text: str, units: dict[str, float] | dict[str, int],
                      forms: str) -> Fraction:
    match = _NUMBER_UNIT.match(text)
    if not match or match.group(2).lower() not in units or len(match.group(1)) > _MAX_DIGITS:
        raise ValueError(forms)
    return Fraction(match.group(1)) * Fraction(str(units[match.group(2).lower()]))


def format_size(nbytes: float | None) -> str:
    """Human-readable binary size, e.g. 1.5GiB; '-' for None."""
    if nbytes is None:
        return "-"
    sign = "-" if nbytes < 0 else ""
    value = abs(float(nbytes))
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{sign}{value:.0f}{unit}" if unit == "B" else f"{sign}{value:.1f}{unit}"
        value /= 1024
    return f"{sign}{value:.1f}TiB"


def format_duration(seconds: float | None) -> str:
    """Compact duration, e.g. 42s, 3m10s, 5h02m, 2d03h; '-' for None."""
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600:02d}h"
