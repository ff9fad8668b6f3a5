"""Cron schedules: what a ``schedule "CRON"`` may say, and the instants of its slots.

Expressions have five fields (minute hour day-of-month month day-of-week, read by croniter
as standard cron does) or six, the first then giving seconds (``*/2 * * * * *``: every two
seconds; meant for tests and sub-minute schedules).

A slot is a wall-clock time in the schedule's time zone (UTC unless ``tz`` says otherwise),
and becomes one instant:

- a wall-clock time that happens twice (the hour repeated when summer time ends) is one
  slot, at its first occurrence: the repeated hour runs once;
- a wall-clock time that does not happen (the hour skipped when summer time starts) runs at
  the next valid time, the instant the clocks jump; several such slots are that one slot.

The slots of a schedule are therefore strictly increasing instants, each at most once,
whatever the time zone does. croniter is fed naive wall-clock times (on which it does plain
arithmetic) and this module maps them to instants, so no DST rule of croniter's is relied on.
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

__all__ = ["FIELD_NAMES", "count_slots", "cron_problem", "latest_slot", "next_slot", "slots",
           "zone", "zone_problem"]

#: The fields of a five-field expression, in order.
FIELD_NAMES = ("minute", "hour", "day-of-month", "month", "day-of-week")

# Walking across a repeated hour of a seconds schedule takes up to 3600 steps; past this
# many the schedule is treated as having no slot in reach (it cannot happen with real zones).
_MAX_STEPS = 20_000
_SECOND = timedelta(seconds=1)
# A fixed start for checking that an expression ever matches.
_PROBE_START = datetime(2000, 1, 1)


def _fields(expr: str) -> list[str]:
    return expr.split()


def _seconds(expr: str) -> bool:
    """Whether the expression has the leading seconds field."""
    return len(_fields(expr)) == 6


def _names(expr: str) -> tuple[str, ...]:
    return ("second", *FIELD_NAMES) if _seconds(expr) else FIELD_NAMES


def cron_problem(expr: str) -> str | None:
    """Why ``expr`` is not a schedule this module runs, or None when it is."""
    from croniter import CroniterBadDateError, croniter

    fields = _fields(expr)
    if len(fields) not in (5, 6):
        return (f"{len(fields)} field{'s' if len(fields) != 1 else ''}, expected 5 "
                f"({' '.join(FIELD_NAMES)}) or 6 with seconds first")
    seconds = len(fields) == 6
    names = _names(expr)
    for i, value in enumerate(fields):
        alone = ["*"] * len(fields)
        alone[i] = value
        if not croniter.is_valid(" ".join(alone), second_at_beginning=seconds):
            return f"field {i + 1} ({names[i]}) '{value}' is not valid"
    if not croniter.is_valid(expr, second_at_beginning=seconds):
        return "not a valid cron expression"
    try:
        croniter(expr, _PROBE_START, second_at_beginning=seconds).get_next(datetime)
    except CroniterBadDateError:
        return "it never matches a date"
    except (ValueError, KeyError, IndexError) as exc:  # croniter's other refusals
        return f"not a valid cron expression ({exc})"
    return None


def zone_problem(name: str) -> str | None:
    """Why ``name`` is not a time zone (an IANA name such as ``Europe/Paris``), or None."""
    try:
        zone(name)
    except (ZoneInfoNotFoundError, ValueError):
        return 'not a known time zone (use an IANA name such as "Europe/Paris" or "UTC")'
    return None


@functools.cache
def zone(name: str | None) -> tzinfo:
    """The time zone called ``name``; UTC for None."""
    if name is None:
        return UTC
    if not name or name.startswith("/") or ".." in name.split("/"):
        raise ValueError(f"not a time zone name: {name!r}")
    return ZoneInfo(name)


def _iter(expr: str, start: datetime) -> _Walk:
    return _Walk(expr, start)


class _Walk:
    """croniter over naive wall-clock times."""

    def __init__(self, expr: str, start: datetime) -> None:
        from croniter import croniter

        self._it = croniter(expr, start, second_at_beginning=_seconds(expr))

    def prev(self) -> datetime:
        value: datetime = self._it.get_prev(datetime)
        return value

    def next(self) -> datetime:
        value: datetime = self._it.get_next(datetime)
        return value


def _wall(instant: datetime, tz: tzinfo) -> datetime:
    """The naive wall-clock time of ``instant`` in ``tz``."""
    return instant.astimezone(tz).replace(tzinfo=None, fold=0)


def instant(wall: datetime, tz: tzinfo) -> datetime:
    """The instant (UTC) of the slot at wall-clock time ``wall`` in ``tz`` (see the module)."""
    first = wall.replace(tzinfo=tz, fold=0).astimezone(UTC)
    if _wall(first, tz) == wall:
        return first  # exists: its only, or its first, occurrence
    # In a gap: fold=0 reads it with the offset from before the jump, fold=1 with the one
    # from after; the jump lies between those two readings. Find it to the second.
    low = wall.replace(tzinfo=tz, fold=1).astimezone(UTC)  # before the jump
    high = first  # after it
    if low > high:
        low, high = high, low
    while high - low > _SECOND:
        middle = low + (high - low) / 2
        middle = middle.replace(microsecond=0)
        if middle <= low:
            middle = low + _SECOND
        if _wall(middle, tz) >= wall:
            high = middle
        else:
            low = middle
    return high


def _floor(moment: datetime) -> datetime:
    return moment.replace(microsecond=0)


def latest_slot(expr: str, tz: str | None, now: datetime) -> datetime | None:
    """The instant (UTC) of the latest slot at or before ``now`` (an aware datetime)."""
    zone_ = zone(tz)
    now = now.astimezone(UTC)
    wall = _floor(_wall(now, zone_))
    walk = _iter(expr, wall + _SECOND)  # get_prev is strict: slots <= wall
    try:
        candidate = walk.prev()
    except (ValueError, OverflowError):
        return None
    best = instant(candidate, zone_)
    # Right after clocks went back, later wall times (of the repeated hour) are slots that
    # already happened, at their first occurrence: walk forward over them.
    forward = _iter(expr, candidate)
    for _ in range(_MAX_STEPS):
        try:
            following = instant(forward.next(), zone_)
        except (ValueError, OverflowError):
            break
        if following > now:
            break
        best = max(best, following)
    return best


def next_slot(expr: str, tz: str | None, now: datetime) -> datetime | None:
    """The instant (UTC) of the first slot after ``now`` (an aware datetime), if any."""
    zone_ = zone(tz)
    now = now.astimezone(UTC)
    walk = _iter(expr, _floor(_wall(now, zone_)))
    for _ in range(_MAX_STEPS):
        try:
            candidate = instant(walk.next(), zone_)
        except (ValueError, OverflowError):
            return None
        if candidate > now:
            return candidate
    return None


def slots(expr: str, tz: str | None, start: datetime, end: datetime) -> list[datetime]:
    """The slots after ``start`` and at or before ``end``, in order (for tests and tools)."""
    found: list[datetime] = []
    moment = start
    while True:
        slot = next_slot(expr, tz, moment)
        if slot is None or slot > end:
            return found
        found.append(slot)
        moment = slot


def count_slots(expr: str, tz: str | None, after: datetime, until: datetime) -> int:
    """How many slots fall after ``after`` and at or before ``until`` (aware datetimes).

    The same slots as :func:`slots` walks one by one, counted arithmetically instead: the
    slots of a day are the product of the second, minute and hour sets, so the work is one
    step per matching day (a day of a per-second schedule is one step, not 86,400), plus a
    few per change of UTC offset in the range (a skipped hour's slots are one slot, a
    repeated hour's are counted once).
    """
    zone_ = zone(tz)
    low = _floor(after.astimezone(UTC))
    high = _floor(until.astimezone(UTC))
    if high <= low:
        return 0
    times = _Times(expr)
    changes = _offset_changes(zone_, low - timedelta(days=1), high)
    total = 0
    # Pieces of constant UTC offset: the first before any change, then one from each change.
    starts: list[datetime | None] = [None, *changes]
    for i, start in enumerate(starts):
        end = starts[i + 1] if i + 1 < len(starts) else None
        first = low if start is None else max(low, start - _SECOND)  # exclusive
        last = high if end is None else min(high, end - _SECOND)  # inclusive
        if last <= first:
            continue
        offset = _offset(zone_, first + _SECOND)
        lower = (first + offset).replace(tzinfo=None)
        upper = (last + offset).replace(tzinfo=None)
        if start is not None:
            before = (start + _offset(zone_, start - _SECOND)).replace(tzinfo=None)
            after_change = (start + offset).replace(tzinfo=None)
            if after_change > before:  # clocks jumped: the skipped walls are one slot
                if start > low:
                    total += 1 if times.count(before - _SECOND, after_change) else 0
                    lower = max(lower, after_change)
            else:  # clocks went back: the repeated walls ran before the change
                lower = max(lower, before - _SECOND)
        total += times.count(lower, upper)
    return total


def _offset(zone_: tzinfo, moment: datetime) -> timedelta:
    value = moment.astimezone(zone_).utcoffset()
    assert value is not None
    return value


def _offset_changes(zone_: tzinfo, start: datetime, end: datetime) -> list[datetime]:
    """The instants in (start, end] at which ``zone_``'s UTC offset changes, to the second."""
    if zone_ is UTC:
        return []
    step = timedelta(hours=6)
    found: list[datetime] = []
    moment = start
    offset = _offset(zone_, moment)
    while moment < end:
        following = min(moment + step, end)
        later = _offset(zone_, following)
        if later != offset:
            low, high = moment, following  # offset(low) == offset, offset(high) != offset
            while high - low > _SECOND:
                middle = (low + (high - low) / 2).replace(microsecond=0)
                if middle <= low:
                    middle = low + _SECOND
                if _offset(zone_, middle) == offset:
                    low = middle
                else:
                    high = middle
            found.append(high)
            # Two changes within one step (not seen in real zones) are taken one at a time.
            following = high
            later = _offset(zone_, high)
        moment, offset = following, later
    return found


class _Times:
    """The wall-clock slots of an expression, counted between two wall-clock times."""

    def __init__(self, expr: str) -> None:
        from croniter import croniter

        fields = _fields(expr)
        seconds = len(fields) == 6
        expanded = croniter(expr, _PROBE_START, second_at_beginning=seconds).expanded

        def values(index: int, top: int) -> list[int]:
            found = expanded[index]
            if found == ["*"]:
                return list(range(top))
            return sorted({int(v) for v in found})

        self.hours = values(1, 24)
        self.minutes = values(0, 60)
        self.seconds = values(5, 60) if seconds else [0]
        self.per_day = len(self.hours) * len(self.minutes) * len(self.seconds)
        self.days = "0 0 " + " ".join(fields[-3:])  # day-of-month month day-of-week

    def _upto(self, moment: datetime) -> int:
        """The slots of a matching day at or before the time of day of ``moment``."""
        from bisect import bisect_left, bisect_right

        minutes, seconds = len(self.minutes), len(self.seconds)
        found = bisect_left(self.hours, moment.hour) * minutes * seconds
        if moment.hour in self.hours:
            found += bisect_left(self.minutes, moment.minute) * seconds
            if moment.minute in self.minutes:
                found += bisect_right(self.seconds, moment.second)
        return found

    def count(self, lower: datetime, upper: datetime) -> int:
        """Slots at wall-clock times after ``lower`` and at or before ``upper`` (naive)."""
        from croniter import croniter

        if upper <= lower:
            return 0
        total = 0
        first, last = lower.date(), upper.date()
        walk = croniter(self.days, datetime.combine(first, datetime.min.time()) - _SECOND)
        while True:
            try:
                day = walk.get_next(datetime).date()
            except (ValueError, OverflowError):
                break
            if day > last:
                break
            top = self.per_day if day < last else self._upto(upper)
            bottom = 0 if day > first else self._upto(lower)
            total += top - bottom
        return total
