"""The supervisor's one door to SQL: a typed function per statement it runs.

Each function takes the connection it runs on (anything with ``fetch``/``fetch_rows``, as
the supervisor's :class:`~atlantis.supervisor.db.Db`: bounded waits, reconnection, outages
reported) and returns typed rows, read by column name (``psycopg.rows.class_row``), never
by position. The statements themselves are in ``queries.sql``; the parameters of the
batched ones are built here, so that the column order of each ``unnest`` lives next to its
statement's reader. No module of the supervisor names a statement of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, LiteralString, Protocol, TypeVar

import orjson

from atlantis.limits import clamp_pct
from atlantis.store.queries import Q

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ClaimedRow:
    id: int
    job: str
    queue: str
    args: str
    """The row's args as JSON text, passed to the child untouched."""
    attempt: int
    max_attempts: int
    cancel_requested: bool
    timeout: float
    heartbeat: float
    backoff: float
    deadline: datetime
    run: int = 1
    """The job's run (1, then one more after each retry): with ``attempt``, which attempt
    this is; every write made for it is fenced on both."""
    workflow: str | None = None
    """A workflow step's context (``atlantis.step_context``) as JSON text, passed to the
    child untouched; None outside workflows."""
    workflow_id: int | None = None
    """The step's workflow; None outside workflows."""
    trace_context: dict[str, str] | None = None
    """The enqueuer's W3C trace context (migration 0019); None when it traced nothing."""
    run_id: str | None = None
    """The claim's run id (migration 0026), as text: the child's handler steps are fenced
    on it, and the supervisor's writes; it is never read, only passed on."""


@dataclass(frozen=True, slots=True)
class FinishedRow:
    id: int
    state: str


@dataclass(frozen=True, slots=True)
class RescuedRow:
    id: int
    state: str
    queue: str


@dataclass(frozen=True, slots=True)
class ReleasedRow:
    id: int


@dataclass(frozen=True, slots=True)
class AttemptStateRow:
    state: str
    attempt: int
    claimed_by: str | None
    run: int


@dataclass(frozen=True, slots=True)
class Progress:
    pct: float
    msg: str


@dataclass(frozen=True, slots=True)
class Renewal:
    job_id: int
    attempt: int
    progress: Progress | None
    run: int = 1
    run_id: str | None = None
    """The claim's run id (``ClaimedRow.run_id``): the renewal is fenced on it too."""


@dataclass(frozen=True, slots=True)
class Result:
    """One attempt's outcome as the finish statement writes it."""

    job_id: int
    attempt: int
    state: str
    spent: bool
    delay: float
    error: dict[str, Any] | None
    progress: Progress | None
    label: str = ""
    """How the attempt ended (atlantis.attempts.outcome): complete, failed, snooze, ..."""
    child_pid: int | None = None
    log_lines: int = 0
    log_dropped: int = 0
    run: int = 1
    """The run of the attempt (``ClaimedRow.run``): the write is fenced on it."""
    result: str | None = None
    """The handler's return value as JSON text, checked (``policy.completed``): written
    as the row's ``result`` if the row ends ``complete``."""
    backoff: float | None = None
    """Given (a failed attempt going back to ``available``): the row waits the job's
    backoff for this attempt, at most this many seconds (``atlantis.retry_delay``), not
    ``delay``."""
    workflow_id: int | None = None
    """The workflow of a step (or compensation): the finish statement locks it
    (:func:`finish_params` orders the batch by it)."""
    run_id: str | None = None
    """The claim's run id (``ClaimedRow.run_id``): the write is fenced on it too (a resume
    spends no attempt, so run and attempt may repeat across two claims of a row)."""
    wake: str | None = None
    """A suspended run (``suspend``): when the row runs again (its run_at)."""
    waits: str | None = None
    """A suspended run: what it waits for (the row's suspended_for)."""
    warning: str | None = None
    """What atlantis had to end that the attempt left running (its attempt's ``warning``,
    migration 0030)."""


def renew_params(worker: str, batch: Sequence[Renewal]) -> dict[str, Any]:
    """The renewal's parameters: the batch as one JSON array (as :func:`finish_params`), not
    seven arrays psycopg would dump element by element on every tick."""
    return {
        "renewals": orjson.dumps([{
            "id": r.job_id, "run": r.run, "attempt": r.attempt,
            "run_id": r.run_id,  # text (the claim reads it as text)
            "has_progress": r.progress is not None,
            # Clamped here: JSON has no NaN or infinity (orjson writes null for them).
            "pct": clamp_pct(r.progress.pct) if r.progress else None,
            "msg": r.progress.msg if r.progress else None,
        } for r in batch]).decode(),
        "worker": worker,
    }


def finish_params(worker: str, batch: Sequence[Result], host: str | None = None,
                  pid: int | None = None) -> dict[str, Any]:
    """The finish statement's parameters. The results go as one JSON array (orjson: fast,
    and it refuses lone surrogates rather than writing invalid JSON: TypeError). A
    handler's result is JSON text already, checked: it goes in as it is (a Fragment).

    Steps of workflows go in the order of their workflows' ids: the finish statement
    writes the rows in the array's order, and ending a step locks its workflow (the trigger
    ``jobs_workflow_advance``, atlantis.workflow_advance in functions.sql); two batches that took the locks of two
    workflows in opposite orders would deadlock (PostgreSQL would abort one, and it would
    be written again a second later). The lock order is the store's, as the trigger is."""
    if any(r.workflow_id is not None for r in batch):
        batch = sorted(batch, key=lambda r: r.workflow_id or 0)
    return {
        "results": orjson.dumps([{
            "id": r.job_id, "run": r.run, "attempt": r.attempt, "state": r.state, "spent": r.spent,
            "delay": r.delay, "backoff": r.backoff, "error": r.error, "has_progress": r.progress is not None,
            "pct": clamp_pct(r.progress.pct) if r.progress else None,  # as in renew_params
            "msg": r.progress.msg if r.progress else None,
            "label": r.label or r.state, "child_pid": r.child_pid,
            "log_lines": r.log_lines, "log_dropped": r.log_dropped,
            "result": None if r.result is None else orjson.Fragment(r.result),
            "wake": r.wake, "waits": r.waits,
            "run_id": r.run_id,
            "warning": r.warning,
        } for r in batch]).decode(),
        "host": host,
        "pid": pid,
        "worker": worker,
    }


# ---- the statements ------------------------------------------------------------------------

class Connection(Protocol):
    """What the door needs of a connection: one statement at a time, within a timeout."""

    async def fetch(self, query: LiteralString, params: dict[str, Any] | None = None, *,
                    timeout: float = 30.0, transaction: bool = False) -> list[tuple[Any, ...]]: ...

    async def fetch_rows(self, row: type[T], query: LiteralString,
                         params: dict[str, Any] | None = None, *, timeout: float = 30.0,
                         transaction: bool = False) -> list[T]: ...


def in_time(timeout: float) -> float:
    """How long a claim may run on the server (``atlantis.claim_in_time``'s ``within``) when
    this side waits ``timeout`` for its answer: half of it, so that a claim the server
    commits is answered before this side stops waiting, but on a link that holds the answer."""
    return timeout / 2


async def claim(db: Connection, worker: str, queues: list[str], jobs: list[str], limit: int,
                timeout: float, limited: Sequence[str] = ()) -> list[ClaimedRow]:
    """Claim up to ``limit`` rows of ``jobs`` on ``queues`` that no limit applies to.
    ``limited``: the jobs declaring limits (a row of theirs not yet marked is marked, so that
    the limit trigger decides it). One statement, as :func:`claim_limited`: the database
    rolls back a claim that ran past half of ``timeout`` (``atlantis.claim_in_time``)."""
    return await db.fetch_rows(ClaimedRow, Q.claim, {
        "queues": queues, "jobs": jobs, "limit": limit, "worker": worker,
        "limited": list(limited), "within": in_time(timeout),
    }, timeout=timeout)


@dataclass(frozen=True, slots=True)
class LimitedRow(ClaimedRow):
    """A row of ``atlantis.claim_limited``, read by column name: a claimed row, or the last
    one, the hint, whose ``id`` is NULL and which carries only ``wake_in`` and ``cursor``."""

    wake_in: float | None = None
    cursor: str | None = None


@dataclass(frozen=True, slots=True)
class LimitedClaim:
    """What :func:`claim_limited` got: the rows; when to try again (seconds; None: no need
    to before the next NOTIFY or poll); where the next call starts (its ``after``)."""

    rows: list[ClaimedRow]
    wake_in: float | None
    cursor: str | None


async def claim_limited(db: Connection, worker: str, queues: list[str], jobs: list[str],
                        limit: int, timeout: float, after: str | None = None) -> LimitedClaim:
    """Claim up to ``limit`` rows of limited jobs (``atlantis.claim_limited``); only for
    children idle now. ``after``: the ``cursor`` of the previous call (the groups take turns
    across calls). One statement, without BEGIN ... COMMIT (every idle child waits for it):
    the database rolls back a claim that ran past half of ``timeout`` from its start
    (``atlantis.claim_in_time``), so one whose answer this side stops waiting for at
    ``timeout`` had committed by then, and is given back by the release of orphans."""
    got = await db.fetch_rows(LimitedRow, Q.claim_limited, {
        "queues": queues, "jobs": jobs, "limit": limit, "worker": worker, "after": after,
        "within": in_time(timeout),
    }, timeout=timeout)
    rows: list[ClaimedRow] = [row for row in got if row.id is not None]
    hint = next((row for row in got if row.id is None), None)
    wake_in = hint.wake_in if hint is not None else None
    cursor = hint.cursor if hint is not None else after
    return LimitedClaim(rows, wake_in, cursor)


@dataclass(frozen=True, slots=True)
class BuriedRow:
    id: int
    error: str


async def claim_isolate(db: Connection, worker: str, queues: list[str], jobs: list[str],
                        limit: int, timeout: float, limited: Sequence[str],
                        rejected: Sequence[str]) -> list[BuriedRow]:
    """After a claim failed on a row's data: try the rows the claims would take, one by one
    (up to ``limit`` plain rows a queue and the first of each limited group); those whose
    claim fails with an error of the SQLSTATE classes ``rejected`` end ``dead`` (kind
    ``claim``). Returns them, with the cause."""
    return await db.fetch_rows(BuriedRow, Q.claim_isolate, {
        "queues": queues, "jobs": jobs, "worker": worker, "limit": limit,
        "limited": list(limited), "rejected": list(rejected),
    }, timeout=timeout, transaction=True)


async def release_orphans(db: Connection, worker: str, known: list[int]) -> list[ReleasedRow]:
    """Give back rows ``worker`` claimed that are none of ``known`` (a lost claim's)."""
    return await db.fetch_rows(ReleasedRow, Q.release_orphans,
                               {"worker": worker, "known": known}, timeout=5)


async def renew(db: Connection, worker: str, batch: Sequence[Renewal],
                timeout: float) -> dict[int, bool]:
    """Renew every lease of ``batch`` and record its checkpoints: whether a cancel was
    requested, by job id; a job missing from the answer has lost its lease. (Plain rows, no
    row objects: hundreds of them on every tick.)"""
    rows = await db.fetch(Q.renew, renew_params(worker, batch), timeout=timeout)
    return {int(r[0]): bool(r[1]) for r in rows}


async def finish(db: Connection, worker: str, batch: Sequence[Result], host: str, pid: int,
                 timeout: float) -> list[FinishedRow]:
    """Write the outcomes of ``batch``, fenced on each attempt still owning its row.
    TypeError: a result cannot be encoded as JSON (see :func:`finish_params`)."""
    return await db.fetch_rows(FinishedRow, Q.finish, finish_params(worker, batch, host, pid),
                               timeout=timeout)


async def attempt_state(db: Connection, job_id: int) -> AttemptStateRow | None:
    rows = await db.fetch_rows(AttemptStateRow, Q.attempt_state, {"id": job_id}, timeout=5)
    return rows[0] if rows else None


async def rescue(db: Connection, worker: str, limit: int, max_backoff: float
                 ) -> list[RescuedRow]:
    """Rows whose lease expired, any worker's: failed (or dead, or cancelled) and back, at
    once, or after the job's backoff (at most ``max_backoff`` seconds) when the previous
    attempt's lease expired too."""
    return await db.fetch_rows(RescuedRow, Q.rescue, {"limit": limit, "worker": worker,
                                                      "max_backoff": max_backoff}, timeout=10)


async def workflow_sweep(db: Connection, batch: int) -> int:
    """What only time finds in workflows (atlantis.workflow_sweep): deadlines passed, and
    cancels a race left unsent. Returns how many workflows it acted on."""
    rows = await db.fetch(Q.workflow_sweep, {"batch": batch}, timeout=10)
    return int(rows[0][0]) if rows else 0


async def event_sweep(db: Connection, batch: int) -> int:
    """Wake the jobs that wait for an event already sent (atlantis.event_sweep: one sent
    while the run that waits for it was suspending). Returns how many it woke."""
    rows = await db.fetch(Q.event_sweep, {"limit": batch}, timeout=10)
    return int(rows[0][0]) if rows else 0


async def join_sweep(db: Connection, batch: int) -> int:
    """Wake the jobs whose join can go on although no child's end woke them
    (atlantis.join_sweep). Returns how many it woke."""
    rows = await db.fetch(Q.join_sweep, {"limit": batch}, timeout=10)
    return int(rows[0][0]) if rows else 0


async def cancel_requests(db: Connection, worker: str) -> list[int]:
    """Jobs running under ``worker`` that an operator asked to cancel."""
    return [job_id for (job_id,) in await db.fetch(Q.cancel_requests, {"worker": worker},
                                                    timeout=5)]


async def queue_flags(db: Connection, queues: list[str]) -> tuple[set[str], set[str]]:
    """Those of ``queues`` an operator paused, and those with a queue-wide concurrency limit
    (tide queue limit)."""
    rows = await db.fetch(Q.queue_flags, {"queues": queues}, timeout=5)
    return {q for q, paused, _ in rows if paused}, {q for q, _, limited in rows if limited}


async def limit_sweep(db: Connection, batch: int) -> int:
    """Forget rate windows that ended (atlantis.limit_sweep); returns how many went."""
    rows = await db.fetch(Q.limit_sweep, {"batch": batch}, timeout=10)
    return int(rows[0][0]) if rows else 0


async def listen(db: Connection) -> None:
    """LISTEN on the channels of new work and of operators' requests."""
    await db.fetch(Q.listen, timeout=5)
