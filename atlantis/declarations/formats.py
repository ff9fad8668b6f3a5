"""What a `timestamptz`, a `date` and a `uuid` value may be written as: one set of rules.

The database checks every enqueued value with the same patterns (``atlantis.type_mismatch``,
store/live/types.sql); the `.atl` checker uses these functions for defaults. The reasons returned
are the ones the database gives, after the quoted value, so that a default and an enqueued
value are refused alike. tests/test_unique_values.py checks that both sides agree.

* ``timestamptz``: RFC 3339, ``YYYY-MM-DD``, ``T`` or a space (or ``t``), ``HH:MM:SS``, an
  optional fraction, then ``Z`` or an offset (``+HH:MM``, ``+HHMM`` or ``+HH``). Without an
  offset the value is refused: it would otherwise be read in the server's time zone.
  PostgreSQL's special words (``now``, ``tomorrow``, ``infinity``, ``epoch``, Julian days,
  ``BC``) are refused.
* ``date``: ``YYYY-MM-DD``.
"""

from __future__ import annotations

import re
from datetime import date

__all__ = ["date_problem", "timestamptz_problem", "uuid_problem"]

TIMESTAMPTZ = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ]([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]"
    r"(\.[0-9]+)?([Zz]|[+-][0-9]{2}(:?[0-9]{2})?)", re.ASCII)
#: A date and a time without an offset: refused with a message that says what is missing.
NO_OFFSET = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}(:[0-9]{2}(\.[0-9]+)?)?",
                       re.ASCII)
DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", re.ASCII)

#: PostgreSQL's limit on a time zone offset (15:59 either way).
_MAX_OFFSET_HOURS = 15

NO_OFFSET_REASON = ("has no time zone offset: a timestamptz needs Z or an offset such as "
                    "+02:00 (RFC 3339)")
TIMESTAMPTZ_REASON = ('is not a valid timestamptz: expected RFC 3339 with Z or an offset, '
                      'such as "2024-01-31T12:00:00Z"')
DATE_REASON = 'is not a valid date: expected YYYY-MM-DD, such as "2024-01-31"'
UUID_REASON = "is not a valid uuid"


def _valid_date(text: str) -> bool:
    try:
        date(int(text[0:4]), int(text[5:7]), int(text[8:10]))
    except ValueError:
        return False
    return True


def date_problem(value: str) -> str | None:
    """Why `value` is no `date` (the reason after the quoted value), or None."""
    if DATE.fullmatch(value) and _valid_date(value):
        return None
    return DATE_REASON


def timestamptz_problem(value: str) -> str | None:
    """Why `value` is no `timestamptz` (the reason after the quoted value), or None."""
    match = TIMESTAMPTZ.fullmatch(value)
    if match and _valid_date(value) and _valid_offset(match.group(3)):
        return None
    if NO_OFFSET.fullmatch(value):
        return NO_OFFSET_REASON
    return TIMESTAMPTZ_REASON


def _valid_offset(offset: str) -> bool:
    if offset in ("Z", "z"):
        return True
    digits = offset[1:].replace(":", "")
    hours, minutes = int(digits[:2]), int(digits[2:] or "0")
    return hours <= _MAX_OFFSET_HOURS and minutes <= 59


def uuid_problem(value: str) -> str | None:
    """Why `value` is no `uuid` as PostgreSQL reads one (32 hex digits, optionally in braces,
    hyphens after any group of four), or None."""
    text = value[1:-1] if value.startswith("{") and value.endswith("}") else value
    if re.fullmatch(r"[0-9A-Fa-f]{4}(-?[0-9A-Fa-f]{4}){7}", text, re.ASCII):
        return None
    return UUID_REASON
