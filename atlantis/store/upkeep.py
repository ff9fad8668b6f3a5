"""The supervisor's housekeeping statements: its worker row and gauges, attempt logs,
schedules and retention (:mod:`atlantis.store.supervision` holds those of an attempt's
life: claims, renewals, finishes, rescues). Same door, same rules: a typed function per
statement of ``queries.sql``, on a :class:`~atlantis.store.supervision.Connection`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from atlantis.store.queries import Q
from atlantis.store.supervision import Connection
from atlantis.store.workflows import counts_from_rows, counts_params


@dataclass(frozen=True, slots=True)
class WorkerReport:
    """What a supervisor run writes of itself into its ``atlantis.workers`` row (what
    operators read back is :class:`atlantis.store.fleet.WorkerRow`)."""

    id: str
    host: str
    pid: int
    queues: list[str]
    concurrency: int
    in_flight: int
    status: str
    ttl: float
    jobs: list[dict[str, Any]]
    """The attempts in flight: job_id, attempt, child_pid, rss."""
    job_types: list[str]
    liveness_interval: float
    """Seconds between its marks of life (migration 0029)."""
    boot_id: str | None
    """Which boot of its host it runs in (/proc/sys/kernel/random/boot_id)."""
    name: str
    """Its name, kept across its restarts (``--name``; migration 0032)."""


async def worker_upsert(db: Connection, w: WorkerReport) -> None:
    await db.fetch(Q.worker_upsert, {
        "id": w.id, "host": w.host, "pid": w.pid, "queues": w.queues,
        "concurrency": w.concurrency, "in_flight": w.in_flight, "status": w.status,
        "ttl": w.ttl, "jobs": Jsonb(w.jobs), "job_types": w.job_types,
        "liveness_interval": w.liveness_interval, "boot_id": w.boot_id, "name": w.name,
    }, timeout=5)


async def worker_delete(db: Connection, worker: str, timeout: float) -> None:
    await db.fetch(Q.worker_delete, {"id": worker}, timeout=timeout)


async def queue_gauges(db: Connection, queues: list[str]) -> tuple[int, int]:
    """(stalled, dead) rows of ``queues``."""
    rows = await db.fetch(Q.queue_gauges, {"queues": queues}, timeout=5)
    return rows[0][0], rows[0][1]


async def queue_asleep(db: Connection, queues: list[str]
                       ) -> dict[tuple[str, str, str], int]:
    """The durable waits of ``queues``: ``(what, queue, label)`` to a count, where ``what``
    is ``suspended`` (label: what the jobs wait for, ``sleep``, ``event`` or ``join``),
    ``events`` (label ``pending`` or ``delivered``) or ``children`` (label: their state)."""
    rows = await db.fetch(Q.queue_asleep, {"queues": queues}, timeout=5)
    return {(str(r[0]), str(r[1]), str(r[2])): int(r[3]) for r in rows}


async def limit_gauges(db: Connection, queues: list[str]) -> dict[str, tuple[int | None, int]]:
    """Per queue of ``queues``: (its concurrency limit, None for none; due waiting rows of
    limited jobs or queues not running yet), from ``atlantis.limit_usage``."""
    rows = await db.fetch(Q.limit_usage, {"queues": queues}, timeout=5)
    return {r[0]: (r[1], int(r[4])) for r in rows}


async def workflow_gauges(db: Connection) -> dict[str, int]:
    """How many workflows are in each state (every state named, 0 when none is), each
    count at most ``workflows.COUNT_CAP``."""
    return counts_from_rows(await db.fetch(Q.workflow_counts, counts_params(), timeout=5))


async def log_insert(db: Connection, lines: Sequence[tuple[int, int, int, datetime, str, str]]
                     ) -> None:
    """Output lines, each (job_id, run, attempt, at, stream, text)."""
    await db.fetch(Q.log_insert, {
        "job_ids": [x[0] for x in lines], "runs": [x[1] for x in lines],
        "attempts": [x[2] for x in lines], "ats": [x[3] for x in lines],
        "streams": [x[4] for x in lines], "lines": [x[5] for x in lines]}, timeout=10)


async def log_trim(db: Connection, key: tuple[int, int, int], keep: int) -> None:
    """Keep the newest ``keep`` lines of the attempt ``key`` (job_id, run, attempt); 0: none."""
    await db.fetch(Q.log_trim, {"job_id": key[0], "run": key[1], "attempt": key[2],
                                "keep": keep}, timeout=10)


@dataclass(frozen=True, slots=True)
class CaughtUp:
    outcome: str
    """done, stale (the schedule's cursor moved: another supervisor fired a slot, or it was
    enabled again), disabled (an operator's switch) or busy."""
    last_slot: datetime | None
    job_ids: list[int]
    job_slots: list[datetime]
    """The slot of each of ``job_ids``."""
    skipped: int
    """Slots skipped (overlap skip) while ``open_job`` was waiting or running."""
    open_job: int | None


@dataclass(frozen=True, slots=True)
class LatestSlot:
    job: str
    slot: datetime


async def database_now(db: Connection) -> datetime:
    rows = await db.fetch(Q.schedule_now, timeout=10)
    when: datetime = rows[0][0]
    return when


async def latest_slots(db: Connection, jobs: list[str]) -> list[LatestSlot]:
    """Where each of ``jobs`` that fired once stands: the latest slot it dealt with, or the
    moment it was enabled again (``atlantis.schedule_cursor``)."""
    return await db.fetch_rows(LatestSlot, Q.schedule_latest, {"jobs": jobs}, timeout=30)


async def schedule_advance(db: Connection, job: str, after: datetime | None,
                           missed_from: datetime | None, missed_to: datetime | None,
                           missed: int, due: list[datetime], overlap: str) -> list[CaughtUp]:
    """Hand the slots of one schedule to ``atlantis.schedule_advance`` (live/schedules.sql)."""
    return await db.fetch_rows(CaughtUp, Q.schedule_advance, {
        "job": job, "after": after, "missed_from": missed_from, "missed_to": missed_to,
        "missed": missed, "due": due, "overlap": overlap}, timeout=30)


async def prune_jobs(db: Connection, states: list[str], older_than: float, lock: int,
                     batch: int) -> int:
    """Delete up to ``batch`` jobs in ``states`` finished more than ``older_than`` seconds
    ago, under the advisory lock ``lock``: how many, or -1 if another session holds it."""
    rows = await db.fetch(Q.retention_prune, {"states": states, "older_than": older_than,
                                              "lock": lock, "batch": batch},
                          timeout=120, transaction=True)
    return int(rows[0][0])


async def prune_schedule_runs(db: Connection, older_than: float, lock: int, batch: int) -> int:
    """As :func:`prune_jobs`, for the record of schedule slots."""
    rows = await db.fetch(Q.retention_prune_schedule_runs, {"older_than": older_than,
                                                            "lock": lock, "batch": batch},
                          timeout=120, transaction=True)
    return int(rows[0][0])
