"""Parsing and formatting of sizes (bytes) and durations (seconds).

Sizes accept plain bytes or a number with a unit: decimal (kB, MB, GB, TB) or binary
(KiB, MiB, GiB, TiB). Durations accept plain seconds or a number with ms, s, m, h or d.
"""

from __future__ import annotations

import re

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


def parse_size(value: object) -> int:
    """Return a size in bytes; raise ValueError with the accepted forms otherwise."""
    if isinstance(value, bool):
        raise ValueError("expected a size such as 512MiB, 2GB or a number of bytes")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError("expected a size >= 0")
        return int(value)
    if isinstance(value, str):
        match = _NUMBER_UNIT.match(value)
        if match and match.group(2).lower() in _SIZE_UNITS:
            return int(float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()])
    raise ValueError("expected a size such as 512MiB, 2GB or a number of bytes")


def parse_duration(value: object) -> float:
    """Return a duration in seconds; raise ValueError with the accepted forms otherwise."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 30s, 5m, 24h or a number of seconds")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError("expected a duration >= 0")
        return float(value)
    if isinstance(value, str):
        match = _NUMBER_UNIT.match(value)
        if match and match.group(2).lower() in _DURATION_UNITS:
            return float(match.group(1)) * _DURATION_UNITS[match.group(2).lower()]
    raise ValueError("expected a duration such as 30s, 5m, 24h or a number of seconds")


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
