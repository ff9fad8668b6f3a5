"""The claimer: claims rows for idle children, and a few ahead of need, and hands them out.

One statement claims for every idle child at once (a materialized CTE with SKIP LOCKED,
in a transaction so that a claim delivered late is rolled back). It wakes on NOTIFY, on a
child becoming idle, and polls as a fallback. Rows of a claim whose answer was lost (the
COMMIT went through, its reply did not) are given back at the next round.

Claiming ahead: while attempts are short, a claim also takes rows for children that are
still busy (held in the ledger): about ``claim_ahead_window`` (100 ms) of work at the current
pace, at most ``--claim-ahead`` (:func:`rows_ahead`). The pool starts one the moment a
child is free, without waiting for a round trip, and claims come in big batches (a claim
costs PostgreSQL mostly per statement, not per row). A held row is
``running`` in the database, so the window is bounded: rows are held only while attempts
typically take under half of ``claim_ahead_hold`` (1 s), and a row no child took within
that time (or a quarter of its heartbeat, if shorter) is given back at once, unspent. A
long attempt therefore never keeps a row from another supervisor for longer than that.

Limited rows (jobs declaring ``concurrency`` or ``rate``, queues with a limit) are claimed
by a statement of their own (``atlantis.claim_limited``), first and only for idle children:
they are never claimed ahead. Limits cost only the rows they limit: rows no limit applies
to (of jobs without limits, on queues without one) are claimed ahead as by a supervisor
that serves no limited job. So that its children still fall idle for limited rows:

- while the last limited claim filled every idle child it was offered (more may be waiting),
  nothing is held ahead, and every child that falls idle comes to it (limited rows first,
  as plain rows go first in no other way);
- otherwise (none waiting, or those waiting held back by their limits), rows are held ahead,
  and once a poll, or when the claim said a limit frees (``wake_in``), the claimer asks the
  pool for the next child that falls idle (``ClaimMode.idle_reserved``) and offers it to
  the limited claim before any held row takes it. The idle children a limited claim was
  offered stay kept while it is under way, so that its rows never wait for a child. A limited row enqueued while plain work
  keeps every child busy is therefore seen within about a poll.

The limits themselves are held by the database (the trigger jobs_limit_claim). No NOTIFY
announces that a rate window ended or that a contended key came free: the claim says when
to look again (``wake_in``), and the claimer comes back then.

One row never stops the claims of its queue: a claim that fails on a row's data
(:class:`StatementRejected`) fails whole, so the claimer then has the rows it would take
tried one by one (``atlantis.claim_isolate``); those no claim can take end ``dead`` with
error kind ``claim``, and the claims go on at once.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable

from atlantis.store import supervision as sql
from atlantis.store.supervision import ClaimedRow
from atlantis.supervisor import policy, tracing
from atlantis.supervisor.attempts import Attempt
from atlantis.supervisor.db import DATA_ERROR_CLASSES, DatabaseUnavailable, StatementRejected
from atlantis.supervisor.runtime import Runtime
from atlantis.supervisor.service import Loop, Service
from atlantis.supervisor.settings import Settings
from atlantis.supervisor.waiting import until_set
from atlantis.tracing import CLAIM_SPAN
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

    def __init__(self, rt: Runtime, jobs: Callable[[], list[str]], idle: Callable[[], int],
                 start: Callable[[], None]) -> None:
        super().__init__(rt)
        self.db = rt.db("claim")
        self.ledger = rt.ledger
        self.jobs = jobs
        """The jobs to claim now (they change with a reload, see supervisor/jobset.py)."""
        self.idle = idle
        """Children idle now (the pool's)."""
        self.start_held = start
        """Start held rows in idle children now (the pool's)."""
        self._orphans_possible = False
        self._claiming = False
        """A claim statement is under way."""
        self._stale_at: int | None = None
        """``ledger.attempts_ended`` when held rows last went stale: hold none until it moves."""
        self._limited_at = -math.inf
        """When rows of limited jobs were last claimed."""
        self._limited_full = True
        """The last limited claim got a row for every idle child it was offered: more may be
        waiting (or no limited claim ran yet)."""
        self._plain_at = -math.inf
        """When the plain claim last ran."""
        self._cursor: str | None = None
        """The group the last limited claim looked at last: the next one starts after it."""
        self._wake_at: float | None = None
        """When a limited claim asked to be tried again (a rate window ends, a key frees)."""

    def loops(self) -> list[Loop]:
        return [self._claim_loop]

    async def _claim_loop(self) -> None:
        rt = self.rt
        failures = 0
        while not rt.draining:
            if failures:
                await asyncio.sleep(policy.backoff(0.1, failures, cap=2.0))
            wait = rt.settings.poll_interval
            if self.ledger.held:  # come back in time to give a stale one back
                wait = min(wait, rt.settings.claim_ahead_hold / 4)
            if self._wake_at is not None:
                wait = max(0.0, min(wait, self._wake_at - rt.now()))
            await until_set(rt.wake, wait)
            rt.wake.clear()
            if rt.draining:
                return
            if self._wake_at is not None and rt.now() >= self._wake_at:
                self._wake_at = None
                self._limited_full = True  # a limit frees: look again before holding more
            self._give_back_stale()
            try:
                if self._orphans_possible:
                    await self._release_orphans()
                    self._orphans_possible = False
                await self._claim()
            except DatabaseUnavailable as exc:
                self._orphans_possible = self._orphans_possible or exc.sent
                rt.claim_mode.idle_reserved = 0  # no claim to offer them to: keep none idle
                failures += 1
                continue
            except StatementRejected as exc:
                log.error("a claim was refused by the database: %s", exc)
                rt.claim_mode.idle_reserved = 0
                if await self._isolate():
                    rt.wake.set()  # the rows it could not take are out of the way: again now
                    failures = 0
                    continue
                failures += 1
                continue
            failures = 0

    async def _isolate(self) -> bool:
        """A claim failed on a row's data, and with it every row of its queues: find the
        rows no claim can take and end them ``dead`` (kind ``claim``), so that the rest of the
        queue runs (``atlantis.claim_isolate``). Returns whether any was found."""
        rt = self.rt
        queues = [q for q in rt.settings.queues if q not in rt.paused]
        try:
            buried = await sql.claim_isolate(
                self.db, rt.worker_id, queues, self.jobs(),
                rt.settings.concurrency + rt.settings.ahead, rt.settings.claim_timeout,
                sorted(rt.claim_mode.limited_jobs), DATA_ERROR_CLASSES)
        except (DatabaseUnavailable, StatementRejected) as exc:
            log.error("could not look for the row the claim failed on: %s", exc)
            return False
        for row in buried:
            log.error("job=%d: ends dead (kind claim): %s", row.id, row.error)
        return bool(buried)

    def _ahead(self) -> int:
        """How many rows to hold ahead of need now (none after held rows went stale)."""
        if self._stale_at is not None:
            return 0
        return rows_ahead(self.rt.settings, self.ledger.typical_attempt)

    def _give_back_stale(self) -> None:
        given = self.ledger.give_back_held(stale_only=True)
        if given:
            # Every child is busy with something longer: claim no more ahead until one is free.
            self._stale_at = self.ledger.attempts_ended
            log.info("gave back %d rows claimed ahead: no child was free within %s",
                     given, format_duration(self.rt.settings.claim_ahead_hold))

    async def stop(self) -> None:
        """No more claims (the drain began): a claim under way is let finish, its rows given
        back, as are the rows held ahead, at once and unspent. Cancelling it instead could
        leave rows claimed for nobody, if its COMMIT went through."""
        self.ledger.give_back_held()
        self.rt.wake.set()
        await self.finish_loops(self.rt.settings.claim_timeout + 1 if self._claiming else 0)
        self.ledger.give_back_held()

    async def _claim(self) -> None:
        rt = self.rt
        if rt.held is not None:
            return  # an operator's drain or eviction (orders.py): nothing until resumed
        held = self.ledger.held
        if self._stale_at is not None and self.ledger.attempts_ended != self._stale_at:
            self._stale_at = None  # an attempt ended since: a child is free again
        idle = self.idle()
        queues = [q for q in rt.settings.queues if q not in rt.paused]
        if not queues:
            return
        jobs = self.jobs()
        limited = rt.claim_mode.limits_any(queues, jobs)
        # Limited rows waiting for children: hold nothing ahead, every idle child is theirs.
        crowded = limited and self._limited_full
        rt.claim_mode.ahead = not crowded
        ahead = 0 if crowded else self._ahead()
        rt.claim_mode.idle_reserved = int(limited and (
            crowded or rt.now() - self._limited_at >= rt.settings.poll_interval))
        if limited and idle:
            idle -= await self._claim_limited(queues, jobs, idle, serving=True)
        if not idle and len(held) > ahead // 2:
            return  # enough held: top up in batches, not one row per finished attempt
        want = idle + ahead - len(held)
        if want > 0:
            await self._claim_plain(queues, jobs, want, idle, limited)
        # Without limits of its own, a supervisor still looks for limited rows once a poll,
        # after its own work: rows marked by limits declared in a newer app, or by a queue
        # limit just removed.
        idle = self.idle()
        if not limited and idle and rt.now() - self._limited_at >= rt.settings.poll_interval:
            await self._claim_limited(queues, jobs, idle, serving=False)

    async def _claim_plain(self, queues: list[str], jobs: list[str], want: int, idle: int,
                           limited: bool) -> None:
        """Claim up to ``want`` rows no limit applies to: for the ``idle`` children, and held
        ahead for the busy ones."""
        rt = self.rt
        if not limited:
            await self._claim_rows(queues, jobs, want)
            return
        # A row of a limited job or queue enqueued as its limit was declared is not marked
        # yet, and only the plain claim finds it (and marks it, so that the limit trigger
        # decides it): once a poll, the plain claim looks at every job and queue served, for
        # the idle children only, since such a row must not be held ahead.
        if idle and rt.now() - self._plain_at >= rt.settings.poll_interval:
            self._plain_at = rt.now()
            got = await self._claim_rows(queues, jobs, idle)
            want -= got
            if got < idle:
                return  # nothing more is waiting
        # Otherwise only rows no limit applies to: of the jobs without limits, on the queues
        # without one. These alone may be held ahead.
        plain_queues, plain_jobs = rt.claim_mode.unlimited(queues, jobs)
        if want > 0 and plain_queues and plain_jobs:
            await self._claim_rows(plain_queues, plain_jobs, want)

    async def _claim_rows(self, queues: list[str], jobs: list[str], want: int) -> int:
        """Claim up to ``want`` rows of ``jobs`` on ``queues`` with the plain claim and hold
        them for the next idle children; returns how many came."""
        rt = self.rt
        # In a transaction: a claim abandoned on a link that delivers it late is rolled back.
        # Only a COMMIT whose answer is lost leaves rows claimed for nobody; the next round
        # gives those back (_release_orphans).
        self._claiming = True
        began = tracing.now_ns()
        try:
            rows = await sql.claim(self.db, rt.worker_id, queues, jobs, want,
                                   rt.settings.claim_timeout, sorted(rt.claim_mode.limited_jobs))
        finally:
            self._claiming = False
        t0 = self.db.sent_at  # not before the wait for a connection: see Db.sent_at
        self._traced([self._hold(row, t0) for row in rows], began, queues)
        self.start_held()
        if rows and len(rows) == want:
            rt.wake.set()  # more work may be waiting
        return len(rows)

    async def _claim_limited(self, queues: list[str], jobs: list[str], idle: int,
                             serving: bool) -> int:
        """Claim rows of limited jobs for ``idle`` children; returns how many came.
        ``serving``: the supervisor serves limited jobs or queues (else it only looks for
        rows marked by a newer app's limits, or by a queue limit just removed)."""
        rt = self.rt
        self._limited_at = rt.now()
        if serving:
            rt.claim_mode.idle_reserved = idle  # theirs until the claim answers
        self._claiming = True
        began = tracing.now_ns()
        try:
            got = await sql.claim_limited(self.db, rt.worker_id, queues, jobs, idle,
                                          rt.settings.claim_timeout, self._cursor)
        finally:
            self._claiming = False
        self._cursor = got.cursor
        if serving:
            self._limited_full = len(got.rows) == idle
            # The children it was offered run its rows, or are free for held rows now.
            rt.claim_mode.idle_reserved = int(self._limited_full)
        t0 = self.db.sent_at
        self._traced([self._hold(row, t0, limited=True) for row in got.rows], began, queues)
        self.start_held()
        if got.wake_in is not None:
            at = rt.now() + got.wake_in
            if self._wake_at is None or at < self._wake_at:
                self._wake_at = at
        if got.rows and len(got.rows) == idle:
            rt.wake.set()  # more work may be waiting
        return len(got.rows)

    def _traced(self, claimed: list[Attempt], began: int, queues: list[str]) -> None:
        """A claim that got rows: its span (OpenTelemetry), linked to their attempts'."""
        if claimed:
            self.ledger.tracing.batch(CLAIM_SPAN, claimed, began, {"atlantis.queues": queues})

    def _hold(self, row: ClaimedRow, t0: float, limited: bool = False) -> Attempt:
        """Hold a claimed row for the next idle child that can run it (``limited``: a row of
        the limited claim, claimed for an idle child: it goes first)."""
        rt = self.rt
        a = self.ledger.claimed(row, t0)
        a.limited = limited
        if not rt.claiming:  # claimed as a drain or an order began: give it back now
            self.ledger.end(a, policy.RELEASE)
            return a
        if policy.lease_lost(rt.now(), a.lease_end, a.heartbeat):
            # The answer came too late (a stalled supervisor, a slow link): an attempt
            # started now would be stopped at once, and the row may be rescued meanwhile.
            log.warning("job=%d: its claim was answered after %s, too late to start it; "
                        "giving it back", row.id, format_duration(rt.now() - t0))
            self.ledger.end(a, policy.RELEASE)
            return a
        self.ledger.hold(a)
        return a

    async def _release_orphans(self) -> None:
        """Give back rows claimed by a claim whose answer never arrived (see the query)."""
        rt = self.rt
        rows = await sql.release_orphans(self.db, rt.worker_id, self.ledger.known())
        if rows:
            log.warning("released %d rows claimed by a claim whose answer was lost: %s",
                        len(rows), ", ".join(str(r.id) for r in rows))
            rt.wake.set()
