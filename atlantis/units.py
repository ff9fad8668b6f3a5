"""Durations (`500ms`, `1h30m`), sizes (`512MB`) and whole numbers, read the same way everywhere.

Both parsers refuse what no setting can mean: negative, non-finite (``nan``, ``inf``,
``1e999``) and absurdly large values, with a ValueError that names the text. Every duration
a user writes (``.atl`` modifiers, ``tide`` and ``atlantis-supervise`` options) is read
here, so :data:`MAX_DURATION` is the one limit they all share. Whole numbers that go to
the database as ``int`` (priorities, attempt numbers) or ``bigint`` (job ids) are checked
against its ranges by :func:`int_problem` before they are sent: PostgreSQL would otherwise
find no function taking the ``numeric`` psycopg sends for them.
"""

from __future__ import annotations

import math
import operator
import re
from datetime import timedelta
from decimal import Decimal
from typing import SupportsIndex

_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_DURATION_HINT = "use e.g. 500ms, 30s, 10m, 2h, 1d, 1h30m"
#: The longest duration accepted: 100 years (``36500d``). Durations end up added to and
#: subtracted from PostgreSQL's ``now()`` (a lease's end, a deadline, a prune's cutoff, a
#: stall threshold of three heartbeats), whose ``timestamptz`` reaches back only to 4713 BC;
#: Python's ``datetime`` ends at year 9999 and a thread's wait at 292 years. A century keeps
#: every such sum in range with room to spare, and is longer than any timeout, lease or
#: retention means; a longer one would fail later, in the database, with a raw error.
MAX_DURATION = 36_500 * 86_400.0
#: How :data:`MAX_DURATION` is written in messages.
MAX_TEXT = "36500d, 100 years"

_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*(B|KB|KIB|K|MB|MIB|M|GB|GIB|G|TB|TIB|T)?", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "B": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
_SIZE_HINT = "use e.g. 512MB, 2GB"
#: The largest size accepted: what a PostgreSQL ``bigint`` holds.
MAX_SIZE = 2**63 - 1

#: What PostgreSQL's integer types hold, by name.
INT_RANGES = {"int": (-(2**31), 2**31 - 1), "bigint": (-(2**63), 2**63 - 1)}


class DurationTooLongError(ValueError):
    """A well-formed duration longer than :data:`MAX_DURATION`."""


def parse_duration(text: str) -> float:
    """Seconds in a duration such as ``30s``, ``10m``, ``2h`` or ``1h30m``.

    A bare number means seconds. Raises ValueError naming the text for anything else, and
    for negative, non-finite (``nan``, ``inf``, ``1e999``) or overlong durations (a
    DurationTooLongError, past :data:`MAX_DURATION`).
    """
    s = text.strip()
    if not s:
        raise ValueError("empty duration")
    try:
        value = float(s)
    except ValueError:
        value = _duration_parts(s, text)
    return _checked_duration(value, text)


def _duration_parts(s: str, text: str) -> float:
    pos = 0
    total = 0.0
    for m in _DURATION_PART.finditer(s):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _DURATION_UNITS[m.group(2)]
        pos = m.end()
    if pos != len(s) or pos == 0:
        if s.startswith("-"):
            raise ValueError(f"negative duration {text!r}")
        raise ValueError(f"invalid duration {text!r} ({_DURATION_HINT})")
    return total


def _checked_duration(value: float, text: str) -> float:
    if math.isnan(value) or math.isinf(value):
        raise ValueError(f"invalid duration {text!r}: not a finite number ({_DURATION_HINT})")
    if value < 0:
        raise ValueError(f"negative duration {text!r}")
    if value > MAX_DURATION:
        raise DurationTooLongError(f"duration {text!r} is too long (at most {MAX_TEXT})")
    return value + 0.0  # -0.0 reads as 0.0


def duration_timedelta(text: str) -> timedelta:
    return timedelta(seconds=parse_duration(text))


def format_duration(seconds: float) -> str:
    """The shortest exact spelling of a duration: 7200 -> ``2h``, 90 -> ``1m30s``."""
    if seconds < 1 and seconds != 0:
        return f"{round(seconds * 1000)}ms"
    ms = round(seconds * 1000)
    parts = []
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        n, ms = divmod(ms, size)
        if n:
            parts.append(f"{n}{unit}")
    if ms:
        parts.append(f"{ms}ms")
    return "".join(parts) or "0s"


def parse_size(text: str) -> int:
    """Bytes in a size such as ``512MB`` or ``2GB`` (powers of 1024).

    Raises ValueError naming the text for anything else, and for negative, non-finite or
    overlarge sizes (more than a bigint holds).
    """
    s = text.strip()
    m = _SIZE.fullmatch(s)
    if not m:
        try:
            value: float | None = float(s)  # what the pattern refuses: nan, inf, 1e999, -5
        except ValueError:
            value = None
        if value is not None and not math.isfinite(value):
            raise ValueError(f"invalid size {text!r}: not a finite number ({_SIZE_HINT})")
        if s.startswith("-"):
            raise ValueError(f"negative size {text!r}")
        raise ValueError(f"invalid size {text!r} ({_SIZE_HINT})")
    unit = (m.group(2) or "").upper()
    multiplier = _SIZE_UNITS["" if unit == "B" else unit.removesuffix("B").removesuffix("I")]
    # Exact decimal arithmetic: no float overflow to inf, no rounding of large integers.
    size = int(Decimal(m.group(1)) * multiplier)
    if size > MAX_SIZE:
        raise ValueError(f"size {text!r} is too large (at most {MAX_SIZE} bytes)")
    return size


def format_size(n: int) -> str:
    """A byte count in the units ``parse_size`` reads: 536870912 -> ``512MB``."""
    for unit, size in (("TB", 1024**4), ("GB", 1024**3), ("MB", 1024**2), ("KB", 1024)):
        if n >= size:
            value = n / size
            return f"{value:.0f}{unit}" if value == int(value) else f"{value:.1f}{unit}"
    return f"{n}B"


def int_problem(value: object, kind: str) -> str | None:
    """Why `value` cannot be sent as PostgreSQL's `kind` (``int`` or ``bigint``), or None."""
    # An int, or what stands for one (numpy's integers); a bool is no number here.
    if isinstance(value, bool) or not isinstance(value, SupportsIndex):
        return f"expected an integer, got {type(value).__name__}"
    number = operator.index(value)
    low, high = INT_RANGES[kind]
    if number > high:
        return f"{_short(number)} is out of range for {kind} (at most {high})"
    if number < low:
        return f"{_short(number)} is out of range for {kind} (at least {low})"
    return None


def _short(value: int) -> str:
    """An integer as a message shows it: its first and last digits when it is very long."""
    text = str(Decimal(value))  # str(int) refuses more than 4300 digits; Decimal does not
    return text if len(text) <= 40 else f"{text[:18]}...{text[-18:]} ({len(text)} digits)"
