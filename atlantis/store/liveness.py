"""Liveness: supervisors' marks of life, the silent ones, and the same-host rescue of one
that is provably gone (issue 36, migration 0029; the statements are ``liveness.sql``'s).

A worker row is *silent* when it was not refreshed for two of its own liveness intervals,
by the database's clock (``now() - seen_at > 2 * liveness_interval``). The supervisor's
side (its mark of life, the lock files that prove a supervisor gone) is
:mod:`atlantis.supervisor.identity`; what operators read is here: a running job's holder
(:func:`job_holder`), the jobs of silent holders (:func:`orphaned_jobs`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from atlantis.store.admin import JobRow
from atlantis.store.queries import Q
from atlantis.store.supervision import Connection, RescuedRow
from atlantis.store.typed_rows import all_rows, one_row

Conn = psycopg.Connection[Any]


@dataclass(frozen=True, slots=True)
class Holder:
    """A running job's holder as the fleet sees it."""

    worker: str
    registered: bool
    """Whether its worker row exists (a row is kept while it holds running rows)."""
    liveness_interval: float | None
    """Seconds between its marks of life (None: a supervisor of an earlier release)."""
    seen_seconds: float | None
    """Seconds since its last mark of life (None: no worker row)."""
    silent: bool
    """Not seen for two of its liveness intervals (or no worker row)."""
    lease_left: float | None
    """Seconds until the job's lease ends (negative: ended, not rescued yet)."""



def holder_document(holder: Holder | None) -> dict[str, Any]:
    """The keys ``tide job status --json`` and the console's job add: ``holder_silent``
    (None: not running), ``holder_silent_seconds`` (None unless silent; None too when the
    holder has no worker row) and ``lease_ends_in_seconds`` (negative: ended, not rescued
    yet)."""
    if holder is None:
        return {"holder_silent": None, "holder_silent_seconds": None,
                "lease_ends_in_seconds": None}
    return {"holder_silent": holder.silent,
            "holder_silent_seconds": holder.seen_seconds if holder.silent else None,
            "lease_ends_in_seconds": holder.lease_left}


def job_holder(conn: Conn, job_id: int) -> Holder | None:
    """The holder of job ``job_id`` if it is running, else None."""
    return one_row(conn, Holder, Q.job_holder, {"id": job_id})


def orphaned_jobs(conn: Conn, *, queue: str | None = None, limit: int = 50) -> list[JobRow]:
    """Running jobs whose holder is silent, newest first."""
    return all_rows(conn, JobRow, Q.job_list_orphaned, {"queue": queue, "limit": limit})


# ---- the supervisor's statements ---------------------------------------------------------

async def worker_alive(db: Connection, worker: str, ttl: float) -> None:
    """The supervisor's mark of life (seen_at), every liveness interval."""
    await db.fetch(Q.worker_alive, {"id": worker, "ttl": ttl}, timeout=5)


async def gone_candidates(db: Connection, worker: str, host: str, boot_id: str) -> list[str]:
    """Other supervisors of this host and boot that hold running rows."""
    rows = await db.fetch(Q.worker_gone_candidates,
                          {"id": worker, "host": host, "boot_id": boot_id}, timeout=5)
    return [str(r[0]) for r in rows]


async def rescue_gone(db: Connection, gone: str, rescuer: str, max_backoff: float
                      ) -> list[RescuedRow]:
    """The running rows of the supervisor ``gone``, released at once (atlantis.rescue_gone)."""
    return await db.fetch_rows(RescuedRow, Q.rescue_gone, {
        "worker": gone, "rescuer": rescuer, "max_backoff": max_backoff}, timeout=10)
