"""The claimer: claims rows for idle children, and a few ahead of need, and hands them out.

One statement claims for every idle child at once (a materialized CTE with SKIP LOCKED,
in a transaction so that a claim delivered late is rolled back). It wakes on NOTIFY, on a
child becoming idle, and polls as a fallback. Rows of a claim whose answer was lost (the
COMMIT went through, its reply did not) are given back at the next round.

Claiming ahead: while attempts are short, a claim also takes rows for children that are
still busy (``rt.held``): about ``claim_ahead_window`` (100 ms) of work at the current
pace, at most ``--claim-ahead`` (:func:`rows_ahead`). The pool starts one the moment a
child is free, without waiting for a round trip, and claims come in big batches (a claim
costs PostgreSQL mostly per statement, not per row). A held row is
``running`` in the database, so the window is bounded: rows are held only while attempts
typically take under half of ``claim_ahead_hold`` (1 s), and a row no child took within
that time (or a quarter of its heartbeat, if shorter) is given back at once, unspent. A
long attempt therefore never keeps a row from another supervisor for longer than that.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable

from atlantis.store.jobs import ClaimedRow, ReleasedRow
from atlantis.store.queries import Q
from atlantis.supervisor import policy
from atlantis.supervisor.attempts import Attempt
from atlantis.supervisor.completer import Completer
from atlantis.supervisor.db import DatabaseUnavailable, StatementRejected
from atlantis.supervisor.pool import Pool
from atlantis.supervisor.runtime import Runtime
from atlantis.supervisor.service import Loop, Service
from atlantis.supervisor.settings import Settings
from atlantis.units import format_duration

log = logging.getLogger("atlantis.supervisor")


def rows_ahead(s: Settings, typical: float | None) -> int:
    """Rows to hold ahead of need: none until attempts proved short (their moving average
    ``typical`` under half of ``claim_ahead_hold``), then about ``claim_ahead_window`` of
    work at the current pace (``concurrency / typical`` attempts a second), at least one
    and at most ``--claim-ahead``."""
    if typical is None or typical >= s.claim_ahead_hold / 2 or not s.ahead:
        return 0
    pace = math.ceil(s.concurrency * s.claim_ahead_window / max(typical, 1e-6))
    return min(s.ahead, max(1, pace))


class Claimer(Service):
    name = "claimer"

    def __init__(self, rt: Runtime, pool: Pool, completer: Completer,
                 jobs: Callable[[], list[str]]) -> None:
        super().__init__(rt)
        self.db = rt.db("claim")
        self.pool = pool
        self.completer = completer
        self.jobs = jobs
        """The jobs to claim now (they change with a reload, see supervisor/jobset.py)."""
        self._orphans_possible = False
        self._stale_at: int | None = None
        """``rt.attempts_ended`` when held rows last went stale: hold none until it moves."""

    def loops(self) -> list[Loop]:
        return [self._claim_loop]

    async def _claim_loop(self) -> None:
        rt = self.rt
        failures = 0
        while not rt.draining:
            if failures:
                await asyncio.sleep(policy.backoff(0.1, failures, cap=2.0))
            wait = rt.settings.poll_interval
            if rt.held:  # come back in time to give a stale one back
                wait = min(wait, rt.settings.claim_ahead_hold / 4)
            try:
                await asyncio.wait_for(rt.wake.wait(), wait)
            except TimeoutError:
                pass
            rt.wake.clear()
            if rt.draining:
                return
            self.give_back_held(stale_only=True)
            try:
                if self._orphans_possible:
                    await self._release_orphans()
                    self._orphans_possible = False
                await self._claim()
            except DatabaseUnavailable as exc:
                self._orphans_possible = self._orphans_possible or exc.sent
                failures += 1
                continue
            except StatementRejected as exc:
                log.error("a claim was refused by the database: %s", exc)
                failures += 1
                continue
            failures = 0

    def _ahead(self) -> int:
        """How many rows to hold ahead of need now (none after held rows went stale)."""
        if self._stale_at is not None:
            return 0
        return rows_ahead(self.rt.settings, self.rt.typical_attempt)

    def give_back_held(self, *, stale_only: bool = False) -> None:
        """Give held rows back (unspent): the stale ones, or all of them (a drain)."""
        rt = self.rt
        now = rt.now()
        keep = []
        for a in rt.held:
            if stale_only and not policy.held_too_long(now, a.renewed_at, a.heartbeat,
                                                       rt.settings.claim_ahead_hold):
                keep.append(a)
            else:
                self.completer.record(a, policy.RELEASE)
        given = len(rt.held) - len(keep)
        rt.held.clear()
        rt.held.extend(keep)
        if given and stale_only:
            # Every child is busy with something longer: claim no more ahead until one is free.
            self._stale_at = rt.attempts_ended
            log.info("gave back %d rows claimed ahead: no child was free within %s",
                     given, format_duration(rt.settings.claim_ahead_hold))

    async def _claim(self) -> None:
        rt = self.rt
        if self._stale_at is not None and rt.attempts_ended != self._stale_at:
            self._stale_at = None  # an attempt ended since: a child is free again
        self.pool.feed()
        idle = len(self.pool.idle())
        ahead = self._ahead()
        if not idle and len(rt.held) > ahead // 2:
            return  # enough held: top up in batches, not one row per finished attempt
        want = idle + ahead - len(rt.held)
        queues = [q for q in rt.settings.queues if q not in rt.paused]
        if want <= 0 or not queues:
            return
        # In a transaction: a claim abandoned on a link that delivers it late is rolled back.
        # Only a COMMIT whose answer is lost leaves rows claimed for nobody; the next round
        # gives those back (_release_orphans).
        rows = await self.db.fetch_rows(ClaimedRow, Q.claim, {
            "queues": queues, "jobs": self.jobs(), "limit": want,
            "worker": rt.worker_id,
        }, timeout=rt.settings.claim_timeout, transaction=True)
        t0 = self.db.sent_at  # not before the wait for a connection: see Db.sent_at
        for row in rows:
            self._dispatch(row, t0)
        self.pool.feed()
        if rows and len(rows) == want:
            rt.wake.set()  # more work may be waiting

    def _dispatch(self, row: ClaimedRow, t0: float) -> None:
        rt = self.rt
        a = Attempt(row=row, lease_end=t0 + row.heartbeat, renewed_at=t0)
        if rt.draining:  # claimed as the drain began: give it back now
            self.completer.record(a, policy.RELEASE)
            return
        if policy.lease_lost(rt.now(), a.lease_end, a.heartbeat):
            # The answer came too late (a stalled supervisor, a slow link): an attempt
            # started now would be stopped at once, and the row may be rescued meanwhile.
            log.warning("job=%d: its claim was answered after %s, too late to start it; "
                        "giving it back", row.id, format_duration(rt.now() - t0))
            self.completer.record(a, policy.RELEASE)
            return
        if rt.held or not self.pool.assign(a):
            # Every child is busy (or one died while we claimed, or no idle one has its
            # handler yet during a reload): the next free one that can run it starts it.
            rt.held.append(a)

    async def _release_orphans(self) -> None:
        """Give back rows claimed by a claim whose answer never arrived (see the query)."""
        rt = self.rt
        # Lost attempts did run: their rows are left to be rescued as failures, not released.
        known = [*rt.in_flight, *(a.job_id for a in rt.held),
                 *(a.job_id for a in self.completer.pending), *rt.lost_ids]
        rows = await self.db.fetch_rows(ReleasedRow, Q.release_orphans,
                                        {"worker": rt.worker_id, "known": known}, timeout=5)
        if rows:
            log.warning("released %d rows claimed by a claim whose answer was lost: %s",
                        len(rows), ", ".join(str(r.id) for r in rows))
            rt.wake.set()
