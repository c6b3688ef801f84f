from __future__ import annotations

import re

import pytest

from supervisor.config.units import (
    MAX_DURATION,
    MAX_SIZE,
    format_duration,
    format_size,
    parse_duration,
    parse_size,
)


@pytest.mark.parametrize(("raw", "expected"), [
    (0, 0), (1024, 1024), ("512MiB", 512 * 1024**2), ("2GB", 2 * 10**9), ("1.5GiB", 3 * 2**29),
    ("64 KiB", 65536), ("10kb", 10_000), ("7", 7), ("3b", 3), ("2g", 2 * 1024**3),
])
def test_sizes(raw: object, expected: int) -> None:
    assert parse_size(raw) == expected


@pytest.mark.parametrize("raw", ["", "MiB", "12 parsecs", "-5", -1, True, None, [1], "1e9"])
def test_bad_sizes(raw: object) -> None:
    with pytest.raises(ValueError, match="expected a size"):
        parse_size(raw)


@pytest.mark.parametrize(("raw", "expected"), [
    (30, 30.0), (0.5, 0.5), ("30s", 30.0), ("5m", 300.0), ("24h", 86400.0), ("250ms", 0.25),
    ("2d", 172800.0), ("90", 90.0),
])
def test_durations(raw: object, expected: float) -> None:
    assert parse_duration(raw) == pytest.approx(expected)


@pytest.mark.parametrize("raw", ["soon", "5 weeks", -1, False, "", None])
def test_bad_durations(raw: object) -> None:
    with pytest.raises(ValueError, match="expected a duration"):
        parse_duration(raw)


def test_formatting() -> None:
    assert format_size(None) == "-"
    assert format_size(512) == "512B"
    assert format_size(3 * 2**29) == "1.5GiB"
    assert format_size(-2 * 2**20) == "-2.0MiB"
    assert format_duration(42) == "42s"
    assert format_duration(190) == "3m10s"
    assert format_duration(5 * 3600 + 120) == "5h02m"
    assert format_duration(None) == "-"


@pytest.mark.parametrize(("raw", "fragment"), [
    (float("inf"), "finite size"), (float("-inf"), "finite size"), (float("nan"), "finite size"),
    (10**400, "at most 2**63-1"), (2**63, "at most 2**63-1"), ("9" * 400, "expected a size"),
    ("8EiB", "expected a size"), ("9223372036854775808", "at most 2**63-1"),
    ("8388608TiB", "at most 2**63-1"), (-0.5, ">= 0"),
])
def test_sizes_are_finite_and_fit_int64(raw: object, fragment: str) -> None:
    with pytest.raises(ValueError, match=re.escape(fragment)):
        parse_size(raw)


def test_size_bounds_are_exact() -> None:
    assert parse_size(MAX_SIZE) == MAX_SIZE == 2**63 - 1
    assert parse_size(str(MAX_SIZE)) == MAX_SIZE  # no float rounding on the way
    assert parse_size("0.1kb") == 100 and parse_size(2.9) == 2
    assert parse_size("8388607TiB") == 8388607 * 1024**4


@pytest.mark.parametrize(("raw", "fragment"), [
    (float("inf"), "finite duration"), (float("nan"), "finite duration"),
    (float("-inf"), "finite duration"), (10**400, "at most 10 years"),
    ("3651d", "at most 10 years"), (1e300, "at most 10 years"), ("9" * 400, "expected a duration"),
])
def test_durations_are_finite_and_bounded(raw: object, fragment: str) -> None:
    with pytest.raises(ValueError, match=re.escape(fragment)):
        parse_duration(raw)


def test_duration_bound() -> None:
    assert parse_duration(MAX_DURATION) == MAX_DURATION == 10 * 365 * 86400
    assert parse_duration("3650d") == MAX_DURATION
    assert parse_duration("1ms") == 0.001
