"""Enqueue jobs on the caller's connection, inside the caller's transaction.

The rows are written by ``atlantis.enqueue_many`` in SQL, which validates the arguments
against the declarations stored in the database: the same rules as for SQL callers and
``tide job enqueue``. These functions never commit.

Arguments are sent as JSON written by orjson. ``decimal.Decimal`` values (what a handler
gets for a ``numeric`` field) are written digit for digit, and so are integers beyond 64
bits; NaN and infinities, which JSON cannot carry, are refused here with the field named.

With OpenTelemetry loaded and a span current, the row also keeps the span's W3C trace
context (``atlantis.jobs.trace_context``): the job's attempts are traced as its children.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, TypedDict, Unpack

import orjson
import psycopg
from psycopg.types.json import Jsonb

from atlantis import limits, tracing
from atlantis.errors import UnknownJobError, ValidationError
from atlantis.limits import json_depth, too_deep
from atlantis.store import caller
from atlantis.store.queries import Q
from atlantis.units import MAX_DURATION, MAX_TEXT, int_problem

UNKNOWN_JOB = "ATL01"
INVALID_ARGS = "ATL02"

# The database refuses numbers longer than 4000 characters and jsonb nested deeper than 64
# levels (store/live/types.sql). Python only refuses, with the same message, what never gets that
# far: numbers PostgreSQL cannot even read (more than 16383 digits after the point), and
# nesting orjson cannot write (255 levels).
MAX_NUMBER_CHARS = limits.MAX_NUMBER_CHARS
_UNREADABLE_NUMBER_CHARS = 16_000

_INT64_MIN = -(2**63)
_UINT64_MAX = 2**64 - 1


class EnqueueOptions(TypedDict, total=False):
    """What every enqueue takes besides the job and its args, written once: the core API
    (:func:`enqueue`, :func:`enqueue_many` and their async twins) and the Django and
    SQLAlchemy helpers take these keywords (``**options``) and pass them on; :func:`_params`
    checks them, once, for all."""

    delay: float | timedelta | None
    """Run no sooner than this long after the enqueue (seconds, or a timedelta)."""
    run_at: datetime | None
    """Run no sooner than this instant (a datetime with a time zone)."""
    priority: int | None
    """Replaces the declared priority for these jobs: lower runs first."""
    queue: str | None
    """Replaces the declared queue for these jobs."""


_OPTIONS = frozenset(EnqueueOptions.__annotations__)


def _params(job: str, args_list: Iterable[Mapping[str, Any]],
            options: EnqueueOptions) -> dict[str, Any]:
    unknown = sorted(options.keys() - _OPTIONS)
    if unknown:
        raise TypeError(f"enqueue got an unexpected keyword argument {unknown[0]!r}")
    delay = _delay(job, options.get("delay"))
    run_at, priority = options.get("run_at"), options.get("priority")
    _check_run_at(job, run_at)
    _check_priority(priority)
    return {
        "job": job,
        "args": [Jsonb(_encode(job, a), dumps=_as_is) for a in args_list],
        "run_at": run_at,
        "priority": priority,
        "queue": options.get("queue"),
        "delay": delay,
        "trace_context": trace_context(),
    }


def trace_context() -> Jsonb | None:
    """The enqueuer's W3C trace context (OpenTelemetry, when it is loaded and a span is
    current; :mod:`atlantis.tracing`), kept in the row: the attempt's span is its child.
    Workflows keep their starter's the same way, for every step's row."""
    carrier = tracing.enqueue_context()
    return None if carrier is None else Jsonb(carrier)


def args_json(name: str, args: Mapping[str, Any]) -> Jsonb:
    """``args`` as the enqueue functions send them (checked and written as above; errors
    name ``name``): for other callers of the caller's-transaction API (workflows)."""
    return Jsonb(_encode(name, args), dumps=_as_is)


def _check_priority(priority: object) -> None:
    """A priority is an ``int`` in the database (lower runs first); PostgreSQL would find no
    enqueue function taking anything else, and say so in terms of the schema."""
    if priority is not None:
        problem = int_problem(priority, "int")
        if problem is not None:
            raise ValidationError(f"priority: {problem}")


def _delay(job: str, delay: object) -> timedelta | None:
    """`delay` as a timedelta: a finite number of seconds or a timedelta, 0 or more."""
    if delay is None:
        return None
    if isinstance(delay, bool) or not isinstance(delay, int | float | timedelta):
        raise ValidationError(f"job {job}: delay must be a number of seconds or a timedelta, "
                              f"got {type(delay).__name__}")
    if isinstance(delay, timedelta):
        seconds = delay.total_seconds()
    else:
        try:
            seconds = float(delay)
        except OverflowError:  # an int past a float's range
            seconds = math.inf
    if not math.isfinite(seconds) or seconds < 0:
        raise ValidationError(
            f"job {job}: delay must be a finite number of seconds, 0 or more, not {delay!r}")
    if seconds > MAX_DURATION:
        raise ValidationError(f"job {job}: delay of {delay!r} is too long (at most {MAX_TEXT})")
    if isinstance(delay, timedelta):
        return delay
    try:
        return timedelta(seconds=seconds)
    except OverflowError:
        raise ValidationError(f"job {job}: delay of {delay!r} seconds is out of range") from None


def _check_run_at(job: str, run_at: object) -> None:
    """A run_at must say which instant it is: a datetime with a time zone."""
    if run_at is None:
        return
    if not isinstance(run_at, datetime):
        raise ValidationError(
            f"job {job}: run_at must be a datetime with a time zone, got {type(run_at).__name__}")
    if run_at.tzinfo is None or run_at.utcoffset() is None:
        raise ValidationError(
            f"job {job}: run_at must be a datetime with a time zone (tzinfo), not a naive "
            "datetime: it would be read in the server's time zone")


def _as_is(text: str) -> str:
    return text


# --------------------------------------------------------------------------- JSON


class _UnsendableError(Exception):
    """A value JSON cannot carry; the message says why, and the caller names the field."""


def _encode(job: str, args: Mapping[str, Any]) -> str:
    """`args` as JSON text; ValidationError naming the field for what JSON cannot carry."""
    if not isinstance(args, Mapping):
        raise ValidationError(
            f"job {job}: args must be a mapping (a JSON object), got {type(args).__name__}")
    doc = dict(args)
    try:
        data = orjson.dumps(doc, default=_default)
    except TypeError:  # orjson.JSONEncodeError: a long integer, a non-str key, a bad value
        data = _encode_carefully(job, doc)
    if b"null" in data:  # orjson writes NaN and the infinities as null
        for key, value in doc.items():
            where = _first(value, _is_non_finite)
            if where is not None:
                suffix, number = where
                raise ValidationError(
                    f"job {job}: field {key}{suffix}: float({str(number)!r}) cannot be "
                    "enqueued: JSON numbers must be finite"
                )
    if b"\\u0000" in data:  # PostgreSQL's text and jsonb cannot hold NUL
        for key, value in doc.items():
            where = ("", key) if _has_nul(key) else _first(value, _has_nul)
            if where is not None:
                name = repr(key) if _has_nul(key) else key
                raise ValidationError(
                    f"job {job}: field {name}{where[0]}: text with a NUL character (\\u0000) "
                    "cannot be enqueued: PostgreSQL cannot store it")
    return data.decode()


def _default(value: Any) -> Any:
    """orjson's hook for the types it does not know: a Decimal is written as its digits."""
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise _UnsendableError(f"{value!r} cannot be enqueued: JSON numbers must be finite")
        _check_length(_decimal_chars(value))
        return orjson.Fragment(str(value))
    raise TypeError(f"Type is not JSON serializable: {type(value).__name__}")


def _encode_carefully(job: str, doc: dict[str, Any]) -> bytes:
    """The slow way, for what orjson refuses by default: integers beyond 64 bits and
    non-string keys (written as json.dumps would); otherwise the field at fault is named."""
    try:
        return orjson.dumps(_compatible(doc), default=_default, option=orjson.OPT_NON_STR_KEYS)
    except (TypeError, ValueError, RecursionError, _UnsendableError):
        pass
    for key, value in doc.items():
        try:
            orjson.dumps(_compatible(value), default=_default, option=orjson.OPT_NON_STR_KEYS)
        except (TypeError, ValueError, RecursionError, _UnsendableError) as exc:
            raise ValidationError(f"job {job}: field {key}: {_reason(exc, value)}") from None
    raise ValidationError(f"job {job}: args cannot be written as JSON")  # pragma: no cover


def _compatible(value: Any) -> Any:
    """`value` with integers beyond 64 bits as JSON fragments (orjson refuses them)."""
    if isinstance(value, int) and not isinstance(value, bool):
        if _INT64_MIN <= value <= _UINT64_MAX:
            return value
        text = str(Decimal(value))  # int -> str is limited to 4300 digits; Decimal is not
        _check_length(len(text))
        return orjson.Fragment(text)
    if isinstance(value, list | tuple):
        return [_compatible(v) for v in value]
    if isinstance(value, dict):
        return {k: _compatible(v) for k, v in value.items()}
    return value


def _check_length(chars: int) -> None:
    if chars > _UNREADABLE_NUMBER_CHARS:
        raise _UnsendableError(
            f"a number {chars} characters long, more than the limit of {MAX_NUMBER_CHARS}"
        )


def _decimal_chars(value: Decimal) -> int:
    """How many characters PostgreSQL writes for finite `value` (it never uses an exponent)."""
    sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)  # finite
    significant = len(digits)
    for digit in digits:  # leading zeros are not written
        if digit:
            break
        significant -= 1
    minus = 1 if sign and significant else 0
    if exponent >= 0:
        return minus + (significant + exponent if significant else 1)
    scale = -exponent
    return minus + max(significant - scale, 1) + 1 + scale


def _reason(exc: BaseException, value: Any) -> str:
    cause = exc.__cause__
    if isinstance(cause, _UnsendableError):
        return str(cause)
    if isinstance(exc, _UnsendableError):
        return str(exc)
    if isinstance(exc, RecursionError) or "Recursion limit" in str(exc):
        return too_deep(json_depth(value))
    return f"cannot be written as JSON: {exc}"


def _is_non_finite(value: Any) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


def _has_nul(value: Any) -> bool:
    return isinstance(value, str) and "\x00" in value


def _first(value: Any, bad: Callable[[Any], bool]) -> tuple[str, Any] | None:
    """Where in `value` the first item that is ``bad`` sits (as a suffix like ``[2]``,
    empty for `value` itself), and that item; keys of dicts are looked at too."""
    if bad(value):
        return "", value
    if isinstance(value, list | tuple):
        items: Iterable[tuple[str, Any]] = ((f"[{i}]", v) for i, v in enumerate(value))
    elif isinstance(value, dict):
        items = ((f"[{k!r}]", x) for k, v in value.items() for x in (k, v))
    else:
        return None
    for step, item in items:
        found = _first(item, bad)
        if found is not None:
            return step + found[0], found[1]
    return None


def translate(exc: psycopg.Error) -> BaseException:
    diag = exc.diag
    message = diag.message_primary or str(exc)
    if exc.sqlstate == UNKNOWN_JOB:
        hint = f"; {diag.message_hint}" if diag.message_hint else ""
        return UnknownJobError(message + hint)
    if exc.sqlstate == INVALID_ARGS:
        return ValidationError(message)
    return exc


def one_params(job: str, args: Mapping[str, Any] | None,
               options: EnqueueOptions) -> dict[str, Any]:
    """The checked parameters of one enqueue (``args``: one JSON value), for a statement of
    atlantis's own that enqueues in SQL (``ctx.spawn``)."""
    params = _params(job, [args or {}], options)
    params["args"] = params["args"][0]
    return params


def many_params(job: str, args_list: Iterable[Mapping[str, Any]],
                options: EnqueueOptions) -> dict[str, Any]:
    """The checked parameters of a batch (``args``: a list of JSON values), for a statement
    of atlantis's own that enqueues in SQL (``ctx.spawn_many``)."""
    return _params(job, args_list, options)


def _ids(row: tuple[Any, ...] | None) -> list[int]:
    assert row is not None
    return list(row[0])


def enqueue_many(
    conn: psycopg.Connection[Any],
    job: str,
    args_list: Iterable[Mapping[str, Any]],
    **options: Unpack[EnqueueOptions],
) -> list[int]:
    """Insert one row per args in one round trip; returns the ids in order.

    ``priority`` (an ``int``) replaces the declared one for these jobs: lower runs first.

    A refused batch writes nothing (it is one statement) and leaves the caller's
    transaction usable: inside an open transaction a savepoint undoes the statement; with
    none open, the implicit transaction that held only this statement is rolled back.
    """
    params = _params(job, args_list, options)
    return _ids(caller.fetch_one(conn, Q.enqueue_many, params, translate=translate))


def enqueue(
    conn: psycopg.Connection[Any],
    job: str,
    args: Mapping[str, Any] | None = None,
    **options: Unpack[EnqueueOptions],
) -> int:
    """Enqueue one job; returns its id. Visible to workers when the caller commits.

    ``priority`` (an ``int``) replaces the declared one for this job: lower runs first.
    """
    return enqueue_many(conn, job, [args or {}], **options)[0]


async def enqueue_many_async(
    conn: psycopg.AsyncConnection[Any],
    job: str,
    args_list: Iterable[Mapping[str, Any]],
    **options: Unpack[EnqueueOptions],
) -> list[int]:
    """The twin of :func:`enqueue_many` for psycopg's ``AsyncConnection``."""
    params = _params(job, args_list, options)
    return _ids(await caller.fetch_one_async(conn, Q.enqueue_many, params, translate=translate))


async def enqueue_async(
    conn: psycopg.AsyncConnection[Any],
    job: str,
    args: Mapping[str, Any] | None = None,
    **options: Unpack[EnqueueOptions],
) -> int:
    """The twin of :func:`enqueue` for psycopg's ``AsyncConnection``."""
    return (await enqueue_many_async(conn, job, [args or {}], **options))[0]
