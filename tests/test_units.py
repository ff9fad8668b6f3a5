"""Durations and sizes: the spellings every option and declaration accepts, and what they refuse."""

from __future__ import annotations

import pytest

from atlantis.units import (
    MAX_DURATION,
    MAX_SIZE,
    duration_timedelta,
    format_duration,
    format_size,
    parse_duration,
    parse_size,
)


@pytest.mark.parametrize(("text", "seconds"), [
    ("500ms", 0.5), ("30s", 30.0), ("10m", 600.0), ("2h", 7200.0), ("1d", 86400.0),
    ("1h30m", 5400.0), ("1m30s250ms", 90.25), ("1.5s", 1.5), ("5", 5.0), ("0.25", 0.25),
    ("0", 0.0), (" 7 ", 7.0), ("0s", 0.0),
])
def test_durations_accepted(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", [
    "nan", "NaN", "-nan", "inf", "-inf", "Infinity", "infinity", "1e999", "-1e999", "1e309",
    "9" * 400 + "s", "9" * 400 + "d",
])
def test_non_finite_durations_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a finite number") as refused:
        parse_duration(text)
    assert repr(text) in str(refused.value)


@pytest.mark.parametrize("text", ["-1", "-0.5", "-5s", "-1h30m", "-1e3"])
def test_negative_durations_refused(text: str) -> None:
    with pytest.raises(ValueError, match="negative duration") as refused:
        parse_duration(text)
    assert repr(text) in str(refused.value)


@pytest.mark.parametrize("text", ["", "  ", "abc", "5x", "1h 30m", "s", "1.s", "10 minutes"])
def test_malformed_durations_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_overlong_duration_refused_and_the_longest_fits_a_timedelta() -> None:
    assert duration_timedelta(str(MAX_DURATION)).total_seconds() == MAX_DURATION
    with pytest.raises(ValueError, match="too long"):
        parse_duration("1e15")
    with pytest.raises(ValueError, match="too long"):
        duration_timedelta("999999999999d")


def test_negative_zero_reads_as_zero() -> None:
    assert str(parse_duration("-0")) == "0.0"


@pytest.mark.parametrize(("text", "size"), [
    ("512MB", 512 * 1024**2), ("2GB", 2 * 1024**3), ("1KiB", 1024), ("1.5k", 1536),
    ("10 MB", 10 * 1024**2), ("100", 100), ("5b", 5), ("0", 0), ("1T", 1024**4),
])
def test_sizes_accepted(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["nan", "NaN", "inf", "-inf", "infinity", "1e999"])
def test_non_finite_sizes_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a finite number") as refused:
        parse_size(text)
    assert repr(text) in str(refused.value)


@pytest.mark.parametrize("text", ["-1", "-1MB", "-0.5GB"])
def test_negative_sizes_refused(text: str) -> None:
    with pytest.raises(ValueError, match="negative size") as refused:
        parse_size(text)
    assert repr(text) in str(refused.value)


@pytest.mark.parametrize("text", ["", "MB", "12 parsecs", "1e3", "nanMB", "infGB"])
def test_malformed_sizes_refused(text: str) -> None:
    with pytest.raises(ValueError, match="invalid size"):
        parse_size(text)


def test_overlarge_size_refused_exactly() -> None:
    assert parse_size(str(MAX_SIZE)) == MAX_SIZE
    for text in (str(MAX_SIZE + 1), "9" * 400 + "GB"):
        with pytest.raises(ValueError, match="too large"):
            parse_size(text)


def test_formats_read_back() -> None:
    for seconds in (0.5, 30, 600, 5400, 90061.25):
        assert parse_duration(format_duration(seconds)) == seconds
    for size in (512, 1024, 512 * 1024**2, 3 * 1024**3):
        assert parse_size(format_size(size)) == size
