"""Schedules as operators' tools see them (``tide schedule list|disable|enable``, the
console).

The statements are named queries of ``schedules.sql``; rows are read into the dataclasses
below by column name. Next runs are computed here from the stored cron expression and the
database's clock, with the same function the supervisors' scheduler uses. The operator's
switch is ``atlantis.schedule_set_enabled`` (live/schedules.sql); nothing here commits.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import class_row

from atlantis.declarations.cron import next_slot
from atlantis.errors import AtlantisError
from atlantis.store import caller
from atlantis.store.queries import Q

Conn = psycopg.Connection[Any]

#: SQLSTATE of a switch flipped for a job that has no schedule (or is not declared).
NO_SUCH_SCHEDULE = "ATL31"


class ScheduleNotFoundError(AtlantisError):
    """No scheduled job of that name: not declared in the database, or without a schedule."""


@dataclass(frozen=True, slots=True)
class _ScheduleRow:
    job: str
    queue: str
    schedule: str
    tz: str | None
    overlap: str
    enabled: bool
    switched_by: str | None
    switched_at: datetime | None
    skipped: int
    last_skipped: datetime | None
    last_run: datetime | None
    last_job_id: int | None
    last_state: str | None
    missed: int
    missed_ranges: int
    last_missed_from: datetime | None
    last_missed: datetime | None
    last_missed_count: int
    db_now: datetime


@dataclass(frozen=True, slots=True)
class Schedule:
    """One scheduled job.

    ``tz`` is None for UTC. ``next_run`` is the next slot after the database's clock (None if
    the expression cannot be read, say after a downgrade, and while the schedule is
    disabled). ``last_run`` is the latest slot that enqueued a job, ``last_job_id`` that job
    and ``last_state`` its state (None once the job was pruned); ``missed`` counts the slots
    recorded as missed that are still kept, in ``missed_ranges`` runs of consecutive slots
    (an outage is one run, however long); the latest run is ``last_missed_count`` slots from
    ``last_missed_from`` to ``last_missed`` (all three None or 0 when no slot was missed).
    ``overlap`` is the job's declaration (``skip`` or ``allow``); ``skipped`` counts the slots
    ``skip`` did not enqueue because a run had not ended, ``last_skipped`` the latest of them.
    ``enabled`` is the operator's switch, flipped last by ``switched_by`` at ``switched_at``
    (None: never).
    """

    job: str
    queue: str
    schedule: str
    tz: str | None
    next_run: datetime | None
    last_run: datetime | None
    last_job_id: int | None
    last_state: str | None
    missed: int
    missed_ranges: int = 0
    last_missed_from: datetime | None = None
    last_missed: datetime | None = None
    last_missed_count: int = 0
    overlap: str = "skip"
    skipped: int = 0
    last_skipped: datetime | None = None
    enabled: bool = True
    switched_by: str | None = None
    switched_at: datetime | None = None

    def document(self) -> dict[str, Any]:
        """The fields by name, for ``--json`` and the API."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def list_schedules(conn: Conn) -> tuple[list[Schedule], datetime]:
    """Every scheduled job in the database, by name, and the database's clock."""
    from datetime import UTC

    rows = conn.cursor(row_factory=class_row(_ScheduleRow)).execute(Q.schedule_list).fetchall()
    now = rows[0].db_now if rows else _now(conn)
    found = []
    for r in rows:
        try:
            upcoming = next_slot(r.schedule, r.tz, r.db_now) if r.enabled else None
        except Exception:  # a stored expression or zone this version cannot read
            upcoming = None
        found.append(Schedule(
            job=r.job, queue=r.queue, schedule=r.schedule, tz=r.tz,
            next_run=upcoming.astimezone(UTC) if upcoming is not None else None,
            last_run=r.last_run, last_job_id=r.last_job_id, last_state=r.last_state,
            missed=r.missed, missed_ranges=r.missed_ranges,
            last_missed_from=r.last_missed_from, last_missed=r.last_missed,
            last_missed_count=r.last_missed_count, overlap=r.overlap, skipped=r.skipped,
            last_skipped=r.last_skipped, enabled=r.enabled, switched_by=r.switched_by,
            switched_at=r.switched_at))
    return found, now


_errors = caller.raising(NO_SUCH_SCHEDULE, ScheduleNotFoundError)


def set_enabled(conn: Conn, job: str, enabled: bool, *, by: str | None = None) -> bool:
    """Switch the schedule of ``job`` on or off (``by``: who, recorded with the moment; None:
    the database role). Returns whether it changed; :class:`ScheduleNotFoundError` when
    ``job`` has no schedule. Enabling it again back-fills nothing: its next round goes on
    from now."""
    row = caller.fetch_one(conn, Q.schedule_set_enabled,
                           {"job": job, "enabled": enabled, "by": by}, translate=_errors)
    assert row is not None
    return bool(row[0])


def _now(conn: Conn) -> datetime:
    row = conn.execute(Q.schedule_now).fetchone()
    assert row is not None
    value: datetime = row[0]
    return value
