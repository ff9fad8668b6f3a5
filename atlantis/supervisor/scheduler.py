"""The scheduler: jobs declared with ``schedule "CRON"`` enqueued once per slot.

About once a second (``schedule_interval``) it reads the database's clock and, for each
scheduled job of the served queues, works out the slots since the latest one recorded
(``atlantis.declarations.cron``: the job's ``tz``, UTC by default; DST handled there), not
only the latest one: a round that comes late (a stopped or busy supervisor, a slow
database, a sleep that drifted) still fires every slot in between. They go to
``atlantis.schedule_advance`` (store/live/schedules.sql) in one transaction, with the
schedule's cursor that they follow (the latest slot it dealt with, or the moment it was
enabled again): slots more than ``schedule_grace`` before the clock are recorded as one row
that counts them (``missed``, from ``missed_from`` to ``slot``; never a row, nor a step, per
slot: they are counted arithmetically), and each later slot is a row of
``atlantis.schedule_runs`` and a job with its default args, unless the job's ``overlap`` is
``skip`` (the default) and a run of the schedule has not ended: that slot is only counted as
skipped. The function holds the schedule's locks (not waited for: 'busy', try again next
round), does nothing while an operator has switched the schedule off ('disabled': asked again
at its next slot) and nothing if another supervisor recorded a slot first, or it was enabled
again ('stale'): this one then goes on from the new cursor. So however many supervisors run,
each slot is enqueued or counted once, and none of them is a leader that could die.

A schedule that never ran does not count its past: only its latest slot runs, if it is
within the grace. A paused queue still gets its scheduled jobs; they wait like any other.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from atlantis.declarations.cron import count_slots, latest_slot, next_slot
from atlantis.declarations.model import JobDecl
from atlantis.store import upkeep as sql
from atlantis.supervisor.db import DatabaseUnavailable, StatementRejected
from atlantis.supervisor.policy import backoff
from atlantis.supervisor.runtime import Runtime
from atlantis.supervisor.service import Loop, Service

log = logging.getLogger("atlantis.supervisor")

MIN_INTERVAL = 0.05
"""The shortest pause between two rounds, whatever ``schedule_interval`` says."""
_TICK = timedelta(microseconds=1)


@dataclass(frozen=True, slots=True)
class _Plan:
    """What follows ``after`` (the latest slot recorded) up to the database's clock."""

    after: datetime | None
    missed: int  # slots past the grace, from missed_from to missed_to
    missed_from: datetime | None
    missed_to: datetime | None
    due: list[datetime]  # slots within the grace, in order


@dataclass
class _State:
    """What this supervisor knows of one schedule."""

    decl: JobDecl
    known: bool = False  # whether done was read from the database
    done: datetime | None = None  # the latest slot recorded (by us or by anyone)
    due: datetime | None = None  # the next slot after the last round that handled one
    failures: int = 0
    retry_at: float = 0.0  # loop time; after a refused enqueue
    disabled: bool = False  # the database said so at the last round that asked
    skipping: int | None = None  # the open run the last slots were skipped for (said once)


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
            self.start_loops()

    async def _schedule_loop(self) -> None:
        names = ", ".join(f"{name} ({state.decl.schedule}"
                          f"{', ' + state.decl.tz if state.decl.tz else ''})"
                          for name, state in sorted(self.schedules.items()))
        log.info("scheduling %s", names)
        while True:
            await self.tick()
            await asyncio.sleep(max(self.rt.settings.schedule_interval, MIN_INTERVAL))

    async def tick(self) -> None:
        """One round: every schedule with a slot since the latest recorded is handed to the
        database, with all its slots since then."""
        try:
            now = await sql.database_now(self.db)
            unknown = [name for name, state in self.schedules.items() if not state.known]
            if unknown:
                latest = await sql.latest_slots(self.db, unknown)
        except (DatabaseUnavailable, StatementRejected):
            return  # the outage is reported by the connection; try again next round
        if unknown:
            found = {row.job: row.slot for row in latest}
            for name in unknown:
                self.schedules[name].done = found.get(name)
                self.schedules[name].known = True
        for name, state in self.schedules.items():
            expr = state.decl.schedule
            assert expr is not None
            if (state.due is not None and now < state.due) or self.rt.now() < state.retry_at:
                continue  # nothing new before the next slot: no cron arithmetic every round
            for _ in range(3):  # 'stale': another supervisor was first; go on from its slot
                plan = self._plan(name, state, now)
                if plan is None:
                    break
                outcome = await self.catch_up(name, state, plan)
                if outcome is None:
                    return  # the database is away: the rest waits for the next round
                if outcome != "stale":
                    break
            if state.failures:
                continue  # refused; retried after a backoff
            state.due = next_slot(expr, state.decl.tz,
                                  now if state.done is None or state.disabled else state.done)

    def _plan(self, name: str, state: _State, now: datetime) -> _Plan | None:
        """The slots of one schedule after the latest recorded, up to ``now``; None if none."""
        expr, tz = state.decl.schedule, state.decl.tz
        assert expr is not None
        cutoff = now - timedelta(seconds=self.rt.settings.schedule_grace)
        if state.done is None:
            # Never ran: its past is not missed; its latest slot runs if within the grace.
            latest = latest_slot(expr, tz, now)
            if latest is None:
                return None
            if latest < cutoff:
                log.debug("schedule %s: its latest slot %s is past; the next one will run",
                          name, _show(latest), extra={"queue": state.decl.queue})
                return None
            return _Plan(None, 0, None, None, [latest])
        first = next_slot(expr, tz, state.done)
        if first is None or first > now:
            return None
        missed, missed_to = 0, latest_slot(expr, tz, cutoff - _TICK)  # slots before cutoff
        if missed_to is not None and missed_to > state.done:
            missed = count_slots(expr, tz, state.done, missed_to)
        if not missed:
            missed_to = None
        due: list[datetime] = []
        moment = missed_to if missed_to is not None else state.done
        while len(due) < self.rt.settings.schedule_due_max:
            slot = next_slot(expr, tz, moment)
            if slot is None or slot > now:
                break
            due.append(slot)
            moment = slot
        if not missed and not due:
            return None
        return _Plan(state.done, missed, first if missed else None, missed_to, due)

    async def catch_up(self, name: str, state: _State, plan: _Plan) -> str | None:
        """Hand a schedule's slots to the database: 'done', 'stale' (its cursor moved: another
        supervisor recorded a later slot, or it was enabled again; ``state`` follows it),
        'busy' (another supervisor is recording slots of it now), 'disabled' (switched off by
        an operator), 'refused', or None when the database could not be reached."""
        rt = self.rt
        slot = plan.due[-1] if plan.due else plan.missed_to
        assert slot is not None
        try:
            rows = await sql.schedule_advance(self.db, name, plan.after, plan.missed_from,
                                              plan.missed_to, plan.missed, plan.due,
                                              state.decl.overlap or "skip")
        except DatabaseUnavailable as exc:
            if rt.health.down_since is not None:
                return None  # an outage, reported by the connection: next round
            # The server answered and refused (an unknown job, args the database no longer
            # accepts), or the connection dropped under the statement: say so, and try these
            # slots again after a backoff (the first one short).
            self._refused(name, state, slot, str(exc))
            return "refused"
        except StatementRejected as exc:
            self._refused(name, state, slot, str(exc))
            return "refused"
        result = rows[0]
        state.failures = 0
        state.retry_at = 0.0
        if result.outcome == "busy":
            return result.outcome  # another supervisor is at it: see what it did next round
        state.done = result.last_slot
        self._switch(name, state, result.outcome == "disabled")
        if result.outcome != "done":
            return result.outcome
        self._report(name, state, plan, result)
        return result.outcome

    def _switch(self, name: str, state: _State, disabled: bool) -> None:
        """Follow the operator's switch, saying so when it changed."""
        if disabled != state.disabled:
            log.info("schedule %s is %s", name,
                     "disabled by an operator: its slots are neither enqueued nor counted "
                     f"until `tide schedule enable {name}`" if disabled else
                     "enabled again: the slots since it was disabled are not back-filled",
                     extra={"queue": state.decl.queue})
        state.disabled = disabled

    def _report(self, name: str, state: _State, plan: _Plan, result: sql.CaughtUp) -> None:
        """Log and count what a round that was 'done' did: missed, enqueued, skipped."""
        rt = self.rt
        extra = {"queue": state.decl.queue}
        if plan.missed and plan.after is not None:
            rt.metrics.schedule_missed.labels(name).inc(plan.missed)
            assert plan.missed_from is not None and plan.missed_to is not None
            what = (f"slot {_show(plan.missed_to)}" if plan.missed == 1 else
                    f"{plan.missed} slots from {_show(plan.missed_from)} to "
                    f"{_show(plan.missed_to)}")
            log.warning("schedule %s: %s missed (more than %gs late when first seen); not run "
                        "late", name, what, rt.settings.schedule_grace, extra=extra)
        for due, job_id in zip(result.job_slots, result.job_ids, strict=True):
            log.info("schedule %s: slot %s enqueued as job=%s", name, _show(due), job_id,
                     extra={**extra, "job_id": job_id})
        if not result.skipped:
            state.skipping = None
            return
        rt.metrics.schedule_skipped.labels(name).inc(result.skipped)
        enqueued = set(result.job_slots)
        skipped = [s for s in plan.due if s not in enqueued][-result.skipped:]
        what = (f"slot {_show(skipped[-1])}" if len(skipped) == 1 else
                f"{len(skipped)} slots from {_show(skipped[0])} to {_show(skipped[-1])}")
        # Said once per run waited for; a slot a second would otherwise be a line a second.
        level = logging.DEBUG if result.open_job == state.skipping else logging.INFO
        log.log(level, "schedule %s: %s skipped: its run job=%s has not ended (overlap skip)",
                name, what, result.open_job, extra=extra)
        state.skipping = result.open_job

    def _refused(self, name: str, state: _State, slot: datetime, error: str) -> None:
        state.failures += 1
        delay = backoff(1.0, state.failures, cap=self.rt.settings.schedule_retry_max)
        state.retry_at = self.rt.now() + delay
        log.error("schedule %s: slot %s could not be enqueued: %s; trying again in %.0fs",
                  name, _show(slot), error, delay, extra={"queue": state.decl.queue})


def _show(slot: datetime) -> str:
    return slot.isoformat()
