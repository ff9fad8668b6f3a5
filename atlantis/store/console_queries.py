"""The queries only the web console (``tide console``) runs, with their typed rows.

Single jobs, logs of one attempt, queues, workers and schedules come from
:mod:`atlantis.store.admin`, :mod:`atlantis.store.fleet` and :mod:`atlantis.store.schedules`,
and every change of a job's or queue's state from :mod:`atlantis.operations` (the SQL
functions every path shares). Here: keyset pages of jobs with filters (args by jsonb
containment), the ids a bulk action touches, deletion of finished jobs, the dead-letter
queue grouped by error fingerprint, throughput per minute, the planner's estimate of the
table's size, log lines of many jobs at once, a job's children, the console's audit table,
and the LISTEN of its live pages. Every statement is a named query of ``console.sql`` but the
children's, ``children.sql``'s ``job_children_list``. Nothing here commits.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import class_row
from psycopg.types.json import Jsonb

from atlantis.store.admin import FINISHED, JobRow, LogLine
from atlantis.store.queries import Q
from atlantis.store.typed_rows import known_columns_row

Conn = psycopg.Connection[Any]

#: The states each action applies to: a bulk action's dry run counts jobs in them.
ACTION_STATES: dict[str, tuple[str, ...]] = {
    "retry": ("dead", "cancelled"),
    "cancel": ("available", "running"),
    "delete": FINISHED,
}


@dataclass(frozen=True, slots=True)
class JobFilter:
    """What the jobs page and a bulk action "by filter" select. ``args`` is a JSON object the
    job's args must contain (``args @> ...``); None fields do not filter."""

    state: str | None = None
    queue: str | None = None
    job: str | None = None
    args: dict[str, Any] | None = None

    def params(self) -> dict[str, Any]:
        return {"state": self.state, "queue": self.queue, "job": self.job,
                "args": None if self.args is None else Jsonb(self.args)}


@dataclass(frozen=True, slots=True)
class DlqGroup:
    """Dead jobs sharing a fingerprint: job, queue, the last error's kind and first line."""

    queue: str
    job: str
    kind: str
    first_line: str
    count: int
    newest_id: int
    newest_at: datetime | None


@dataclass(frozen=True, slots=True)
class Throughput:
    """Jobs of ``queue`` completed in the minute ``minutes_ago`` minutes back (0: this one)."""

    queue: str
    minutes_ago: int
    count: int


@dataclass(frozen=True, slots=True)
class ConsoleLogLine(LogLine):
    """A log line with its job (``admin.LogLine`` is one job's)."""

    job_id: int


@dataclass(frozen=True, slots=True)
class AuditRow:
    """One write the console made (``atlantis.console_audit``)."""

    id: int
    at: datetime
    action: str
    target: str
    detail: dict[str, Any]
    client: str | None
    label: str | None
    outcome: str


@dataclass(frozen=True, slots=True)
class ChildRow:
    """One of a job's children (a job its handler spawned, ``ctx.spawn``)."""

    id: int
    job: str
    state: str


@dataclass(frozen=True, slots=True)
class _Id:
    id: int


@dataclass(frozen=True, slots=True)
class _Deleted:
    deleted: int


@dataclass(frozen=True, slots=True)
class _Estimate:
    estimate: int


#: A page filtered by job name or args (which no index serves) searches at most this many
#: ids, newest first; its ``next_before`` then continues below the window.
SCAN_WINDOW = 100_000


@dataclass(frozen=True, slots=True)
class JobsPage:
    """One page of jobs, newest first. ``next_before``: the ``before`` of the next page
    (None: no older job matches). ``searched_from``: the smallest id this page searched when
    the filter searches by window (None: the page searched down to the oldest job)."""

    rows: list[JobRow]
    next_before: int | None
    searched_from: int | None


def jobs_page(conn: Conn, flt: JobFilter, *, before: int | None = None,
              limit: int = 50) -> JobsPage:
    """Up to ``limit`` jobs matching ``flt`` with ids below ``before``, newest first. A job
    name or args filter searches the :data:`SCAN_WINDOW` ids below ``before`` only, so a
    page costs the same on a table of any size; a page with fewer rows than ``limit`` may
    then still have older matches, and ``next_before`` says where to go on."""
    floor: int | None = None
    if flt.args is not None or flt.job is not None:
        top = before
        if top is None:
            row = conn.execute(Q.console_max_id).fetchone()
            top = int(row[0]) + 1 if row else 1
        floor = max(1, top - SCAN_WINDOW)
    cur = conn.cursor(row_factory=known_columns_row(JobRow))
    rows = cur.execute(Q.console_jobs_page, {**flt.params(), "before": before, "floor": floor,
                                             "limit": limit}).fetchall()
    if len(rows) == limit:
        return JobsPage(rows, rows[-1].id, floor)
    return JobsPage(rows, floor if floor is not None and floor > 1 else None, floor)


def matching_ids(conn: Conn, flt: JobFilter, states: tuple[str, ...], *,
                 limit: int) -> list[int]:
    """Ids of jobs matching ``flt`` and in ``states``, newest first, at most ``limit``."""
    cur = conn.cursor(row_factory=class_row(_Id))
    rows = cur.execute(Q.console_job_ids,
                       {**flt.params(), "states": list(states), "limit": limit}).fetchall()
    return [r.id for r in rows]


def ids_in_states(conn: Conn, ids: list[int], states: tuple[str, ...]) -> list[int]:
    """Of ``ids``, those of jobs in ``states``, newest first."""
    cur = conn.cursor(row_factory=class_row(_Id))
    rows = cur.execute(Q.console_ids_in_states, {"ids": ids, "states": list(states)}).fetchall()
    return [r.id for r in rows]


def delete_finished(conn: Conn, ids: list[int]) -> int:
    """Delete the finished jobs among ``ids`` with their attempts and logs; how many went."""
    row = conn.cursor(row_factory=class_row(_Deleted)).execute(
        Q.console_delete_finished, {"ids": ids}).fetchone()
    return 0 if row is None else row.deleted


def dlq_groups(conn: Conn, *, queue: str | None = None, limit: int = 200) -> list[DlqGroup]:
    """The dead-letter queue grouped by fingerprint, largest group first."""
    return conn.cursor(row_factory=class_row(DlqGroup)).execute(
        Q.console_dlq_groups, {"queue": queue, "limit": limit}).fetchall()


def throughput(conn: Conn) -> list[Throughput]:
    """Completions per queue and minute over the last hour (empty minutes absent)."""
    return conn.cursor(row_factory=class_row(Throughput)).execute(Q.console_throughput).fetchall()


def estimated_jobs(conn: Conn) -> int | None:
    """The planner's estimate of the jobs table's rows; None before its first ANALYZE."""
    row = conn.cursor(row_factory=class_row(_Estimate)).execute(
        Q.console_estimated_jobs).fetchone()
    return None if row is None or row.estimate < 0 else row.estimate


def logs_since(conn: Conn, ids: list[int], after: int, *,
               limit: int = 2000) -> list[ConsoleLogLine]:
    """Lines of any job in ``ids`` written after line id ``after``, in order."""
    return conn.cursor(row_factory=class_row(ConsoleLogLine)).execute(
        Q.console_logs_since, {"ids": ids, "after": after, "limit": limit}).fetchall()


def log_tail(conn: Conn, job_id: int, attempt: int, *, run: int,
             limit: int = 200) -> list[ConsoleLogLine]:
    """The newest ``limit`` lines of attempt ``attempt`` of run ``run``, oldest first."""
    rows = conn.cursor(row_factory=class_row(ConsoleLogLine)).execute(
        Q.console_log_tail, {"job_id": job_id, "run": run, "attempt": attempt,
                             "limit": limit}).fetchall()
    rows.reverse()
    return rows


def job_children(conn: Conn, job_id: int, *, limit: int = 100) -> list[ChildRow]:
    """The first ``limit`` children of job ``job_id``, oldest first (by jobs_children_idx)."""
    return conn.cursor(row_factory=class_row(ChildRow)).execute(
        Q.job_children_list, {"job_id": job_id, "limit": limit}).fetchall()


def last_log_id(conn: Conn) -> int:
    """The newest log line's id anywhere, 0 when there is none."""
    row = conn.cursor(row_factory=class_row(_Id)).execute(Q.console_log_last_id).fetchone()
    return 0 if row is None else row.id


def audit(conn: Conn, *, action: str, target: str, outcome: str, client: str | None,
          label: str | None, detail: dict[str, Any] | None = None) -> int:
    """Record one write; returns the audit row's id."""
    row = conn.cursor(row_factory=class_row(_Id)).execute(Q.console_audit_insert, {
        "action": action, "target": target, "detail": Jsonb(detail or {}), "client": client,
        "label": label, "outcome": outcome}).fetchone()
    assert row is not None
    return row.id


def audit_log(conn: Conn, *, before: int | None = None, limit: int = 100) -> list[AuditRow]:
    """The newest recorded writes first."""
    return conn.cursor(row_factory=class_row(AuditRow)).execute(
        Q.console_audit_list, {"before": before, "limit": limit}).fetchall()


async def listen(conn: psycopg.AsyncConnection[Any]) -> None:
    """Subscribe ``conn`` (autocommit) to the notifications the console follows: work
    enqueued, cancel, pause and resume, and jobs whose row changed (``console_listen``)."""
    await conn.execute(Q.console_listen)
