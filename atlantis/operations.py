"""Cancel and retry jobs, pause and resume queues, limit them, on the caller's connection.

Each call runs one SQL function of store/live/operators.sql (``atlantis.cancel``,
``atlantis.retry``, ``atlantis.pause``, ``atlantis.resume``) or store/live/limited_claims.sql
(``atlantis.set_queue_limit``): the same
rules as for SQL callers, ``tide`` and the console. Like :func:`atlantis.enqueue`, nothing here commits: inside an open transaction
the change is made under a savepoint (a refused call leaves the transaction usable) and
becomes visible, and the supervisors are told, when the caller commits.

``by`` records who acted (``jobs.cancelled_by``, ``jobs.retried_by``,
``queues.changed_by``, ``queues.limit_by``); by default the database role of the connection.
"""

from __future__ import annotations

from typing import Any, LiteralString

import psycopg

from atlantis.errors import (
    JobEndedError,
    JobNotFoundError,
    UniqueKeyTakenError,
    ValidationError,
    WorkflowStateError,
)
from atlantis.store import caller
from atlantis.store.queries import Q
from atlantis.units import int_problem

UNIQUE_KEY_TAKEN = "ATL03"
NO_SUCH_JOB = "ATL04"
REFUSED_IN_WORKFLOW = "ATL05"
BAD_VALUE = "ATL02"
JOB_ENDED = "ATL22"
BAD_EVENT = "ATL23"


def translate(exc: psycopg.Error) -> BaseException:
    message = exc.diag.message_primary or str(exc)
    if exc.sqlstate == NO_SUCH_JOB:
        return JobNotFoundError(message)
    if exc.sqlstate == UNIQUE_KEY_TAKEN:
        return UniqueKeyTakenError(message)
    if exc.sqlstate == REFUSED_IN_WORKFLOW:
        return WorkflowStateError(message)
    if exc.sqlstate == JOB_ENDED:
        return JobEndedError(message)
    if exc.sqlstate == BAD_EVENT:
        return ValidationError(message)
    return exc


def row_id(value: object, name: str = "job_id") -> object:
    """``value`` (a job's or a workflow's id), refused with a ValidationError naming
    ``name`` when no row can have it.

    An id is a ``bigint``: PostgreSQL would find no function taking anything else, and
    say so in terms of the schema. An id in range that no row has is the function's to
    refuse (JobNotFoundError, WorkflowNotFoundError).
    """
    problem = int_problem(value, "bigint")
    if problem is not None:
        raise ValidationError(f"{name}: {problem}")
    return value


def call(conn: psycopg.Connection[Any], query: LiteralString, params: dict[str, Any], *,
         errors: caller.Translate = translate) -> Any:
    """The one value ``query`` returns, run as :mod:`atlantis.store.caller` runs it."""
    row = caller.fetch_one(conn, query, params, translate=errors)
    assert row is not None
    return row[0]


async def call_async(conn: psycopg.AsyncConnection[Any], query: LiteralString,
                     params: dict[str, Any], *, errors: caller.Translate = translate) -> Any:
    """The twin of :func:`call` for psycopg's ``AsyncConnection``."""
    row = await caller.fetch_one_async(conn, query, params, translate=errors)
    assert row is not None
    return row[0]


def cancel(conn: psycopg.Connection[Any], job_id: int, *, by: str | None = None) -> str | None:
    """Cancel a job; returns the state it is in afterwards.

    A step of a workflow (or a compensation) cancels its whole workflow
    (:func:`atlantis.cancel_workflow`): a step cancelled alone would strand its dependents.
    ``"cancelled"`` for a job that was waiting. ``"running"`` for a running one: its
    supervisor sets ``ctx.cancelled`` in the handler, stops the attempt after the cancel
    grace, and the job ends ``cancelled``. None when the job had finished already.
    Raises :class:`~atlantis.JobNotFoundError` for an unknown id, and
    :class:`~atlantis.ValidationError` for one no job can have (not a ``bigint``).
    """
    state: str | None = call(conn, Q.job_cancel, {"id": row_id(job_id), "by": by})
    return state


def retry(conn: psycopg.Connection[Any], job_id: int, *, by: str | None = None,
          fresh: bool = False) -> int | None:
    """Put a ``dead`` or ``cancelled`` job back to ``available`` with a fresh attempt budget.

    Clears its progress and last error, keeps its ``errors`` history. Its next run resumes
    from its handler step records; ``fresh`` drops them, so that it starts over. Returns the job's id,
    or None when it is in another state. Raises :class:`~atlantis.UniqueKeyTakenError`
    (naming the holder) when another waiting or running job holds its unique key, and
    :class:`~atlantis.JobNotFoundError` for an unknown id (ValidationError for one no job
    can have, as :func:`cancel`). A step's row is refused with
    :class:`~atlantis.WorkflowStateError` naming ``tide workflow retry``.
    """
    found: int | None = call(conn, Q.job_retry, {"id": row_id(job_id), "by": by,
                                                  "fresh": fresh})
    return found


async def cancel_async(conn: psycopg.AsyncConnection[Any], job_id: int, *,
                       by: str | None = None) -> str | None:
    """The twin of :func:`cancel` for psycopg's ``AsyncConnection``."""
    state: str | None = await call_async(conn, Q.job_cancel, {"id": row_id(job_id), "by": by})
    return state


async def retry_async(conn: psycopg.AsyncConnection[Any], job_id: int, *,
                      by: str | None = None, fresh: bool = False) -> int | None:
    """The twin of :func:`retry` for psycopg's ``AsyncConnection``."""
    found: int | None = await call_async(conn, Q.job_retry, {"id": row_id(job_id), "by": by,
                                                              "fresh": fresh})
    return found


def pause(conn: psycopg.Connection[Any], queue: str, *, reason: str | None = None,
          by: str | None = None) -> bool:
    """Stop supervisors claiming from ``queue`` (running attempts continue).

    Returns whether the queue was being served until now (False: it was paused already;
    the reason and who are updated).
    """
    changed: bool = call(conn, Q.operator_pause, {"queue": queue, "reason": reason, "by": by})
    return changed


def resume(conn: psycopg.Connection[Any], queue: str, *, by: str | None = None) -> bool:
    """Let supervisors claim from ``queue`` again. Returns whether it was paused."""
    changed: bool = call(conn, Q.operator_resume, {"queue": queue, "by": by})
    return changed


def _limit_errors(exc: psycopg.Error) -> BaseException:
    if exc.sqlstate == BAD_VALUE:
        return ValidationError(exc.diag.message_primary or str(exc))
    return translate(exc)


def set_queue_limit(conn: psycopg.Connection[Any], queue: str, concurrency: int | None, *,
                    by: str | None = None) -> int | None:
    """Let at most ``concurrency`` attempts of ``queue`` run at once, across every supervisor
    (None removes the queue's limit). Returns the limit it had (None: none).

    The limit is the database's: the queue's waiting rows are marked so that every claimer
    obeys it, and supervisors hear of it when the caller commits. Lowering it below what is
    running lets those attempts finish and claims nothing more until the count is under it.
    Raises :class:`~atlantis.ValidationError` for a ``concurrency`` under 1, or one that is
    not an ``int``.
    """
    if concurrency is not None:
        problem = int_problem(concurrency, "int")
        if problem is not None:
            raise ValidationError(f"queue {queue}: concurrency: {problem}")
    was: int | None = call(conn, Q.set_queue_limit,
                           {"queue": queue, "concurrency": concurrency, "by": by},
                           errors=_limit_errors)
    return was


def send_event(conn: psycopg.Connection[Any], job_id: int, event: str, payload: Any = None,
               *, by: str | None = None) -> int:
    """Send ``event`` to job ``job_id`` in the caller's transaction; returns the event's id.

    It is kept until the job's handler waits for an event of that name
    (``ctx.wait_for_event``), which consumes it once; a job that waits for it already is
    woken. ``payload`` is JSON (at most 64 KiB of it). Raises
    :class:`~atlantis.JobNotFoundError` for an unknown job, :class:`~atlantis.JobEndedError`
    for one that has ended, :class:`~atlantis.ValidationError` for a bad name, a payload
    too large, or a job already holding 1000 events it has not consumed.
    """
    found: int = call(conn, Q.event_send, {"job_id": row_id(job_id), "event": event,
                                          "payload": _payload(payload), "by": by})
    return found


async def send_event_async(conn: psycopg.AsyncConnection[Any], job_id: int, event: str,
                           payload: Any = None, *, by: str | None = None) -> int:
    """The twin of :func:`send_event` for psycopg's ``AsyncConnection``."""
    found: int = await call_async(conn, Q.event_send, {
        "job_id": row_id(job_id), "event": event, "payload": _payload(payload), "by": by})
    return found


def _payload(payload: Any) -> str | None:
    import orjson

    try:
        return None if payload is None else orjson.dumps(payload).decode()
    except TypeError as exc:
        raise ValidationError(f"an event's payload must be JSON: {exc}") from exc
