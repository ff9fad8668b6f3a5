"""What a handler hands back (exceptions, reasons, delays, progress) made fit for a message.

Every function here accepts anything and never raises, except :class:`Terminated`, which is
let through so that a SIGTERM still ends the attempt: a ``__str__`` or ``__repr__`` that
raises, a str subclass with hostile methods, a metaclass with an odd ``__name__``, a NaN.
Every string it returns is an exact ``str`` passed through :func:`messages.clean` (no NUL,
no lone surrogate) and clipped, so ``encode()`` of a message built from them cannot fail
and the frame stays far below the events pipe's frame limit.
"""

from __future__ import annotations

import math
import traceback
from collections.abc import Callable

from atlantis.child.exits import Terminated
from atlantis.limits import MAX_CHECKPOINT_CHARS, MAX_ERROR_TEXT, clamp_pct
from atlantis.protocol.framing import clean
from atlantis.protocol.messages import ChildError, ErrorKind, clip

#: Error messages and tracebacks past this size are cut (see :mod:`atlantis.limits`).
MAX_ERROR_CHARS = MAX_ERROR_TEXT
#: A leftover's description is cut to this.
MAX_LEFTOVER_CHARS = 200
#: The longest snooze the child reports: ten years (the supervisor clamps further).
MAX_SNOOZE = 315_360_000.0
UNPRINTABLE = "<unprintable>"

_type_name = type.__dict__["__name__"].__get__


def text_of(value: object, convert: Callable[[object], str] = str,
            fallback: str = UNPRINTABLE) -> str:
    """``convert(value)`` as an exact, cleaned ``str``; ``fallback`` if that fails."""
    if type(value) is str and convert is str:
        return clean(value)
    try:
        text = convert(value)
        # An exact copy: a str subclass may override replace, encode, slicing...
        return clean(str.__add__("", text))
    except Terminated:
        raise
    except BaseException:  # a handler's object may raise anything, SystemExit included
        return fallback


def type_name(value: object) -> str:
    """The name of ``value``'s class, whatever its metaclass makes of ``__name__``."""
    try:
        return text_of(_type_name(type(value)), fallback="<unknown type>")
    except Terminated:
        raise
    except BaseException:
        return "<unknown type>"


def describe(exc: BaseException) -> str:
    """``Type: message``, even for an exception whose ``__str__`` itself raises."""
    name = type_name(exc)
    text = text_of(exc, fallback=f"<unprintable {name}>")
    return f"{name}: {text}" if text else name


def format_traceback(exc: BaseException) -> str | None:
    try:
        return text_of("".join(traceback.format_exception(exc)), fallback="")
    except Terminated:
        raise
    except BaseException:  # same: an unprintable exception still fails cleanly
        return None


def child_error(kind: ErrorKind, message: object, exc: BaseException | None = None,
                tail: int = MAX_ERROR_CHARS // 4) -> ChildError:
    """The error of a failed attempt: message and traceback cleaned and clipped."""
    tb = format_traceback(exc) if exc is not None else None
    return ChildError(
        kind=kind,
        message=clip(text_of(message), MAX_ERROR_CHARS),
        # The frames are at the top, the exception's own text at the bottom: keep both ends.
        traceback=clip(tb, MAX_ERROR_CHARS - tail, tail) if tb else None,
    )


def snooze_delay(seconds: object) -> float:
    """A finite, non-negative delay: NaN or negative gives 0, +inf or huge ten years."""
    try:
        value = float(seconds)  # type: ignore[arg-type]  # anything a handler assigned
    except Terminated:
        raise
    except BaseException:
        return 0.0
    if math.isnan(value) or value < 0:
        return 0.0
    return min(value, MAX_SNOOZE)


def snooze_problem(seconds: object) -> str | None:
    """Why ``Snooze(seconds)`` asks for no delay at all (NaN, an infinity, a negative or
    something that is no number), or None. Such a snooze fails its attempt instead."""
    try:
        value = float(seconds)  # type: ignore[arg-type]  # anything a handler assigned
    except Terminated:
        raise
    except BaseException:
        value = math.nan
    if math.isfinite(value) and value >= 0:
        return None
    shown = text_of(seconds, repr)
    return (f"invalid Snooze({clip(shown, 40)}): the delay must be a finite number of seconds, "
            "0 or more")


def checkpoint_pct(pct: object) -> float | None:
    """``None`` for NaN (as the protocol says), infinities clamped to 0 or 100 (JSON cannot
    carry them; the row keeps :func:`~atlantis.limits.clamp_pct` of the rest)."""
    try:
        value = float(pct)  # type: ignore[arg-type]
    except Terminated:
        raise
    except BaseException:
        return None
    if math.isnan(value):
        return None
    if math.isinf(value):
        return float(clamp_pct(value))
    return value


def checkpoint_msg(msg: object) -> str:
    return text_of(msg)[:MAX_CHECKPOINT_CHARS]


def leftover(text: object) -> str:
    return clip(text_of(text), MAX_LEFTOVER_CHARS)
