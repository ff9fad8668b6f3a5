"""The scheduler: jobs declared with ``schedule "CRON"`` enqueued once per slot.

About once a second (``schedule_interval``) it reads the database's clock and, for each
scheduled job of the served queues, works out the latest slot at or before it
(``atlantis.declarations.cron``: the job's ``tz``, UTC by default; DST handled there). A slot
not handled yet goes to ``atlantis.schedule_fire`` (migration 0006), which records
``(job, slot)`` in ``atlantis.schedule_runs`` and enqueues the job with its default args in
one transaction, only if the row was new: however many supervisors run, the primary key
lets exactly one of them enqueue a slot, and none of them is a leader that could die.

Slots missed while nothing ran are not back-filled: a slot first seen more than
``schedule_grace`` after its time is recorded without a job and counted as missed
(``atlantis_schedule_slots_missed_total``), unless the schedule never ran before (a new
schedule does not count its first, long past, slot as missed). A paused queue still gets
its scheduled jobs; they wait like any other.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from atlantis.declarations.cron import latest_slot, next_slot
from atlantis.declarations.model import JobDecl
from atlantis.store.queries import Q
from atlantis.supervisor.db import DatabaseUnavailable, StatementRejected
from atlantis.supervisor.policy import backoff
from atlantis.supervisor.runtime import Runtime
from atlantis.supervisor.service import Loop, Service

log = logging.getLogger("atlantis.supervisor")

MIN_INTERVAL = 0.05
"""The shortest pause between two rounds, whatever ``schedule_interval`` says."""
RETRY_MAX = 60.0
"""Longest wait before trying again a slot whose enqueue the database refused."""


@dataclass(frozen=True, slots=True)
class _Fired:
    outcome: str  # enqueued, missed, skipped, taken
    job_id: int | None


@dataclass
class _State:
    """What this supervisor knows of one schedule."""

    decl: JobDecl
    done: datetime | None = None  # the latest slot handled (by us or by anyone)
    due: datetime | None = None  # the next slot after the last round that handled one
    failures: int = 0
    retry_at: float = 0.0  # loop time; after a refused enqueue


class Scheduler(Service):
    name = "scheduler"

    def __init__(self, rt: Runtime, decls: Iterable[JobDecl]) -> None:
        super().__init__(rt)
        queues = set(rt.settings.queues)
        self.schedules = {d.qualified_name: _State(d) for d in decls
                          if d.schedule is not None and d.queue in queues}
        self.db = rt.db("scheduler")

    def loops(self) -> list[Loop]:
        return [self._schedule_loop] if self.schedules else []

    def update(self, decls: Iterable[JobDecl]) -> None:
        """A reload: follow the schedules of the app as loaded now. A schedule kept keeps
        the slots it handled; one whose declaration changed is worked out afresh."""
        queues = set(self.rt.settings.queues)
        wanted = {d.qualified_name: d for d in decls
                  if d.schedule is not None and d.queue in queues}
        for name in [n for n in self.schedules if n not in wanted]:
            del self.schedules[name]
        for name, decl in wanted.items():
            state = self.schedules.get(name)
            if state is None:
                self.schedules[name] = _State(decl)
            elif state.decl != decl:
                self.schedules[name] = _State(decl, done=state.done)
        if self.schedules and not self._tasks:
            self.start()

    async def _schedule_loop(self) -> None:
        names = ", ".join(f"{name} ({state.decl.schedule}"
                          f"{', ' + state.decl.tz if state.decl.tz else ''})"
                          for name, state in sorted(self.schedules.items()))
        log.info("scheduling %s", names)
        while True:
            await self.tick()
            await asyncio.sleep(max(self.rt.settings.schedule_interval, MIN_INTERVAL))

    async def tick(self) -> None:
        """One round: every schedule whose latest slot is new to us is handed to the database."""
        try:
            rows = await self.db.fetch(Q.schedule_now, timeout=10)
        except (DatabaseUnavailable, StatementRejected):
            return  # the outage is reported by the connection; try again next round
        now: datetime = rows[0][0]
        for name, state in self.schedules.items():
            expr = state.decl.schedule
            assert expr is not None
            if (state.due is not None and now < state.due) or self.rt.now() < state.retry_at:
                continue  # nothing new before the next slot: no cron arithmetic every round
            slot = latest_slot(expr, state.decl.tz, now)
            if slot is None:
                continue
            # Never go back (a clock that stepped backwards), never do a slot twice.
            if state.done is None or slot > state.done:
                if not await self.fire(name, state, slot):
                    return  # the database is away: the rest waits for the next round
                if state.done != slot:
                    continue  # refused; retried after a backoff
            state.due = next_slot(expr, state.decl.tz, now)

    async def fire(self, name: str, state: _State, slot: datetime) -> bool:
        """Hand one slot to the database; False when the database could not be reached."""
        rt = self.rt
        try:
            rows = await self.db.fetch_rows(_Fired, Q.schedule_fire, {
                "job": name, "slot": slot, "grace": rt.settings.schedule_grace}, timeout=30)
        except DatabaseUnavailable as exc:
            if rt.health.down_since is not None:
                return False  # an outage, reported by the connection: next round
            # The server answered and refused (an unknown job, args the database no longer
            # accepts), or the connection dropped under the statement: say so, and try this
            # slot again after a backoff (the first one short).
            self._refused(name, state, slot, str(exc))
            return True
        except StatementRejected as exc:
            self._refused(name, state, slot, str(exc))
            return True
        fired = rows[0]
        state.done = slot
        state.failures = 0
        state.retry_at = 0.0
        extra = {"queue": state.decl.queue}
        if fired.outcome == "enqueued":
            log.info("schedule %s: slot %s enqueued as job=%s", name, _show(slot), fired.job_id,
                     extra={**extra, "job_id": fired.job_id})
        elif fired.outcome == "missed":
            rt.metrics.schedule_missed.labels(name).inc()
            log.warning("schedule %s: slot %s missed (first seen more than %gs late); not run "
                        "late", name, _show(slot), rt.settings.schedule_grace, extra=extra)
        elif fired.outcome == "skipped":
            log.debug("schedule %s: its latest slot %s is past; the next one will run", name,
                      _show(slot), extra=extra)
        return True

    def _refused(self, name: str, state: _State, slot: datetime, error: str) -> None:
        state.failures += 1
        delay = backoff(1.0, state.failures, cap=RETRY_MAX)
        state.retry_at = self.rt.now() + delay
        log.error("schedule %s: slot %s could not be enqueued: %s; trying again in %.0fs",
                  name, _show(slot), error, delay, extra={"queue": state.decl.queue})


def _show(slot: datetime) -> str:
    return slot.isoformat()
