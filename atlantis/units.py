"""Durations (`500ms`, `1h30m`) and sizes (`512MB`), parsed the same way everywhere."""

from __future__ import annotations

import re
from datetime import timedelta

_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*(B|KB|KIB|K|MB|MIB|M|GB|GIB|G|TB|TIB|T)?", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "B": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


def parse_duration(text: str) -> float:
    """Seconds in a duration such as ``30s``, ``10m``, ``2h`` or ``1h30m``.

    A bare number means seconds. Raises ValueError naming the text otherwise.
    """
    s = text.strip()
    if not s:
        raise ValueError("empty duration")
    try:
        value = float(s)
    except ValueError:
        pass
    else:
        if value < 0:
            raise ValueError(f"negative duration {text!r}")
        return value
    pos = 0
    total = 0.0
    for m in _DURATION_PART.finditer(s):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _DURATION_UNITS[m.group(2)]
        pos = m.end()
    if pos != len(s) or pos == 0:
        raise ValueError(f"invalid duration {text!r} (use e.g. 500ms, 30s, 10m, 2h, 1d, 1h30m)")
    return total


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
    """Bytes in a size such as ``512MB`` or ``2GB`` (powers of 1024)."""
    m = _SIZE.fullmatch(text.strip())
    if not m:
        raise ValueError(f"invalid size {text!r} (use e.g. 512MB, 2GB)")
    unit = (m.group(2) or "").upper().rstrip("B").rstrip("I") if m.group(2) else ""
    if m.group(2) and m.group(2).upper() == "B":
        unit = ""
    return int(float(m.group(1)) * _SIZE_UNITS[unit])


def format_size(n: int) -> str:
    """A byte count in the units ``parse_size`` reads: 536870912 -> ``512MB``."""
    for unit, size in (("TB", 1024**4), ("GB", 1024**3), ("MB", 1024**2), ("KB", 1024)):
        if n >= size:
            value = n / size
            return f"{value:.0f}{unit}" if value == int(value) else f"{value:.1f}{unit}"
    return f"{n}B"
