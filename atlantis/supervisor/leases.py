"""Leases: renewal, lost leases, timeouts, memory and task limits of the attempts in flight.

One statement renews every lease that is due (every heartbeat/3) and carries the
checkpoints that came in meanwhile (coalesced per attempt). A renewal that does not come
back in time, or comes back without a row, means the lease is lost: the attempt is
killed at once and nothing more of it is written. Timeouts stop an attempt (SIGTERM,
then SIGKILL after the kill grace); memory and task limits kill it at once.
"""

from __future__ import annotations

import asyncio
import logging
import math
import signal

from atlantis.child.tree import last_pid
from atlantis.store.jobs import Renewal, RenewedRow, touch_params
from atlantis.store.queries import Q
from atlantis.supervisor import policy
from atlantis.supervisor.attempts import Attempt
from atlantis.supervisor.db import DatabaseUnavailable, StatementRejected
from atlantis.supervisor.runtime import Runtime
from atlantis.supervisor.service import Loop, Service
from atlantis.units import format_duration, format_size

log = logging.getLogger("atlantis.supervisor")


def cancel(rt: Runtime, a: Attempt) -> None:
    """An operator cancelled ``a``'s job: tell the handler; the grace starts now."""
    if a.request_cancel(rt.now()):
        log.info("%s: cancelled by an operator; the handler has %s to return", a.tag(),
                 format_duration(rt.settings.cancel_grace), extra=a.log_extra())


class Leases(Service):
    name = "leases"

    def __init__(self, rt: Runtime) -> None:
        super().__init__(rt)
        self.db = rt.db("lease")
        self._touching: asyncio.Task[None] | None = None
        self._task_turn = 0
        self._pid_stamp: int | None = None
        self._counts_owed = 0

    def loops(self) -> list[Loop]:
        return [self._tick_loop]

    async def _tick_loop(self) -> None:
        rt = self.rt
        last_memory = 0.0
        while True:
            now = rt.now()
            due = False
            for a in list(rt.in_flight.values()):
                if now >= a.next_check:
                    due = self.check(a, now) or due
            if rt.settings.max_memory_per_child and now - last_memory >= rt.settings.memory_interval:
                last_memory = now
                self._check_memory()
            if rt.settings.max_tasks_per_child:
                self._check_tasks()
            if due and (self._touching is None or self._touching.done()):
                batch = self._due(now)
                if batch:
                    self._touching = asyncio.create_task(self._touch(batch), name="leases.touch")
            await asyncio.sleep(rt.settings.tick)

    def check(self, a: Attempt, now: float) -> bool:
        """Act on what is due for ``a``; True if its lease or checkpoint should be written.
        Sets ``a.next_check``: with hundreds of long attempts, most ticks look at none."""
        if a.lost:
            a.next_check = math.inf
            return False
        self._enforce(a, now)
        if a.lost:
            a.next_check = math.inf
            return False
        s = self.rt.settings
        renew_at = a.renewed_at + a.heartbeat / 3
        nxt = min(a.lease_end - policy.lease_margin(a.heartbeat), renew_at)
        if a.progress_dirty:
            nxt = min(nxt, a.progress_since + s.progress_interval)
        if a.stop_reason is None and a.child is not None:
            nxt = min(nxt, a.started + a.timeout)
        if a.stop_reason is None and a.cancel_heard_at is not None:
            nxt = min(nxt, a.cancel_heard_at + s.cancel_grace)
        if not a.killed and a.term_sent_at is not None:
            nxt = min(nxt, a.term_sent_at + s.kill_grace)
        a.next_check = nxt
        return not a.finished and now >= min(renew_at, a.progress_since + s.progress_interval
                                              if a.progress_dirty else math.inf)

    def _enforce(self, a: Attempt, now: float) -> None:
        if policy.lease_lost(now, a.lease_end, a.heartbeat):
            self.lose(a, "the lease could not be renewed in time; killing the attempt so that "
                         "no other worker runs the row alongside it")
            return
        if a.stop_reason is None and a.child is not None and policy.timed_out(now, a.started, a.timeout):
            log.warning("%s: timeout after %s; terminating it", a.tag(),
                        format_duration(a.timeout), extra=a.log_extra())
            a.stop("timeout", now)
        if a.stop_reason is None and policy.cancel_grace_over(now, a.cancel_heard_at,
                                                              self.rt.settings.cancel_grace):
            log.warning("%s: the handler did not return within the cancel grace of %s; "
                        "terminating it", a.tag(), format_duration(self.rt.settings.cancel_grace),
                        extra=a.log_extra())
            a.stop("cancel", now)
        if not a.killed and policy.kill_due(now, a.term_sent_at, self.rt.settings.kill_grace):
            a.stop(a.stop_reason or "timeout", now, sig=signal.SIGKILL)

    def lose(self, a: Attempt, why: str) -> None:
        """The attempt no longer owns its row: kill it at once; nothing more is written."""
        a.lost = True
        self.rt.lost_ids.add(a.job_id)
        self.rt.metrics.leases_lost.inc()
        log.error("%s: %s", a.tag(), why, extra=a.log_extra())
        a.stop("lease", self.rt.now(), sig=signal.SIGKILL)

    def _check_memory(self) -> None:
        limit = self.rt.settings.max_memory_per_child
        for a in list(self.rt.in_flight.values()):
            if a.child is None or a.stop_reason is not None:
                continue
            rss = a.child.rss()
            if rss > limit:
                log.warning("%s: child uses %s, over the memory limit of %s; killing it",
                            a.tag(), format_size(rss), format_size(limit), extra=a.log_extra())
                a.stop("memory", self.rt.now(), sig=signal.SIGKILL)

    #: Trees counted per tick at most: every tick up to this many attempts in flight; beyond,
    #: in turn (with 500 in flight, each every 16 ticks, 0.8 s), so that the counting costs
    #: the supervisor a bounded few percent of a core however many attempts it runs.
    TASK_COUNTS_PER_TICK = 32

    def _check_tasks(self) -> None:
        """A tree grows fast (a fork bomb forks every few milliseconds), and a count costs
        little (:func:`atlantis.child.tree.count_tasks`): each tick, up to
        :data:`TASK_COUNTS_PER_TICK` attempts, taking turns, while a round is owed.

        A round (one count of every tree) is owed whenever the host's last process id
        moved (:func:`atlantis.child.tree.last_pid`): while it stays put, no task was
        created anywhere, so no tree grew and nothing is counted (hundreds of sleeping
        attempts cost nothing to watch)."""
        limit = self.rt.settings.max_tasks_per_child
        stamp = last_pid()
        if stamp is None or stamp != self._pid_stamp:
            self._pid_stamp = stamp
            self._counts_owed = len(self.rt.in_flight)
        if self._counts_owed <= 0:
            return
        running = [a for a in self.rt.in_flight.values() if a.child is not None and not a.killed]
        if len(running) > self.TASK_COUNTS_PER_TICK:
            start = self._task_turn % len(running)
            running = (running[start:] + running[:start])[:self.TASK_COUNTS_PER_TICK]
            self._task_turn = start + self.TASK_COUNTS_PER_TICK
        self._counts_owed -= len(running)
        for a in running:
            assert a.child is not None
            if a.child.tasks(limit) > limit:
                log.warning("%s: the child runs more than %d tasks (processes and threads), "
                            "over --max-tasks-per-child; killing its whole tree", a.tag(), limit,
                            extra=a.log_extra())
                a.stop("tasks", self.rt.now(), sig=signal.SIGKILL)

    def _due(self, now: float) -> list[Attempt]:
        live = [a for a in self.rt.in_flight.values() if not a.lost and not a.finished]
        if any(policy.renewal_due(now, a.renewed_at, a.heartbeat) for a in live):
            return live
        return [a for a in live if a.progress_dirty
                and now - a.progress_since >= self.rt.settings.progress_interval]

    async def _touch(self, batch: list[Attempt]) -> None:
        rt = self.rt
        t0 = rt.now()
        # The renewal must be answered before the first of these attempts is killed for want
        # of it: a renewal that lands after the kill would only hold the dead row back.
        budget = min(a.lease_end - policy.lease_margin(a.heartbeat) for a in batch) - t0
        if budget <= 0:
            return
        renewals = [Renewal(a.job_id, a.attempt, a.progress if a.progress_dirty else None, a.run)
                    for a in batch]
        for a in batch:
            a.progress_dirty = False
        try:
            try:
                rows = await self.db.fetch_rows(RenewedRow, Q.touch,
                                                touch_params(rt.worker_id, renewals), timeout=budget)
            except StatementRejected as exc:
                # A checkpoint the database refuses must not cost the leases: renew without.
                log.error("checkpoints refused by the database (%s); renewing the leases "
                          "without them", exc)
                renewals = [Renewal(r.job_id, r.attempt, None, r.run) for r in renewals]
                budget = min(a.lease_end - policy.lease_margin(a.heartbeat) for a in batch) - rt.now()
                rows = await self.db.fetch_rows(RenewedRow, Q.touch,
                                                touch_params(rt.worker_id, renewals),
                                                timeout=max(budget, 0.001))
        except (DatabaseUnavailable, StatementRejected):
            for a, r in zip(batch, renewals, strict=True):
                if r.progress is not None and not a.progress_dirty:
                    a.progress_dirty = True
                    a.progress_since = t0
                    a.next_check = 0.0
            return
        rt.metrics.renewals.inc()
        rt.metrics.leases_renewed.inc(len(rows))
        renewed = {r.id: r.cancel_requested for r in rows}
        sent = self.db.sent_at  # the renewal counts from when it went out, not from before
        for a in batch:
            if a.lost or a.finished:
                continue  # ended while the renewal was on its way
            if a.job_id in renewed:
                a.lease_end = sent + a.heartbeat
                a.renewed_at = sent
                if a.child is not None:
                    a.child.set_lease(a.lease_end)
                if renewed[a.job_id]:
                    cancel(rt, a)
            else:
                self.lose(a, "the lease is gone (the row was rescued or changed); killing the "
                             "attempt, nothing of it will be written")
