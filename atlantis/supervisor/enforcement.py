"""Enforcement: the limits of every attempt in flight, checked each tick.

Timeouts stop an attempt (SIGTERM, then SIGKILL after the kill grace), and so does a cancel
the handler did not honour within the cancel grace; memory and task limits kill it at once.
Each attempt says when it next needs a look (``next_check``): with hundreds of long
attempts, most ticks look at none. Leases are :mod:`leases`' business.
"""

from __future__ import annotations

import logging
import math
import signal
from operator import attrgetter

from atlantis.child.tree import last_pid, tasks_created
from atlantis.supervisor import policy
from atlantis.supervisor.attempts import Attempt, Soonest
from atlantis.supervisor.ledger import IDLE_TICK
from atlantis.supervisor.runtime import Runtime
from atlantis.supervisor.service import Loop, Service
from atlantis.units import format_duration, format_size

log = logging.getLogger("atlantis.supervisor")
NEXT_CHECK = attrgetter("next_check")


class Enforcement(Service):
    name = "enforcement"

    def __init__(self, rt: Runtime) -> None:
        super().__init__(rt)
        self.ledger = rt.ledger
        self._task_turn = 0
        self._pid_stamp: int | None = None
        self._counts_owed = False
        """More trees were due than a tick counts: the next tick goes on, moved or not."""
        self._moves = 0
        self._soonest: float = -math.inf
        """The least ``Child.tasks_recount_at`` of the trees in flight (see _check_tasks)."""
        self._started = -1
        """``ledger.attempts_started`` at the last walk over the attempts in flight."""

    def loops(self) -> list[Loop]:
        return [self._check_loop]

    async def _check_loop(self) -> None:
        rt = self.rt
        s = rt.settings
        last_memory = 0.0
        soonest = Soonest()
        while True:
            now = rt.now()
            for a in soonest.walk(now, self.ledger.in_flight.values(), NEXT_CHECK):
                self.check(a, now)
            if s.max_memory_per_child and now - last_memory >= s.memory_interval:
                last_memory = now
                self._check_memory()
            if s.max_tasks_per_child:
                self._check_tasks()
            await self.ledger.tick(s.tick, IDLE_TICK)

    def check(self, a: Attempt, now: float) -> None:
        """Stop ``a`` if one of its limits is reached; set when it next needs a look."""
        if a.lost:
            a.next_check = math.inf
            return
        s = self.rt.settings
        if a.stop_reason is None and a.child is not None and policy.timed_out(now, a.started, a.timeout):
            log.warning("%s: timeout after %s; terminating it", a.tag(),
                        format_duration(a.timeout), extra=a.log_extra())
            a.stop("timeout", now)
        if a.stop_reason is None and policy.cancel_grace_over(now, a.cancel_heard_at,
                                                              s.cancel_grace):
            log.warning("%s: the handler did not return within the cancel grace of %s; "
                        "terminating it", a.tag(), format_duration(s.cancel_grace),
                        extra=a.log_extra())
            a.stop("cancel", now)
        if not a.killed and policy.kill_due(now, a.term_sent_at, s.kill_grace):
            a.stop(a.stop_reason or "timeout", now, sig=signal.SIGKILL)
        nxt = math.inf
        if a.stop_reason is None and a.child is not None:
            nxt = min(nxt, a.started + a.timeout)
        if a.stop_reason is None and a.cancel_heard_at is not None:
            nxt = min(nxt, a.cancel_heard_at + s.cancel_grace)
        if not a.killed and a.term_sent_at is not None:
            nxt = min(nxt, a.term_sent_at + s.kill_grace)
        a.next_check = nxt

    def _check_memory(self) -> None:
        limit = self.rt.settings.max_memory_per_child
        for a in list(self.ledger.in_flight.values()):
            if a.child is None or a.stop_reason is not None:
                continue
            rss = a.child.rss()
            if rss > limit:
                log.warning("%s: child uses %s, over the memory limit of %s; killing it",
                            a.tag(), format_size(rss), format_size(limit), extra=a.log_extra())
                a.stop("memory", self.rt.now(), sig=signal.SIGKILL)

    def _check_tasks(self) -> None:
        """A tree grows fast (a fork bomb forks every few milliseconds), and a count costs
        little (:func:`atlantis.child.tree.count_tasks`): each tick, up to
        ``--task-counts-per-tick`` trees that may be past the limit, taking turns (with 500
        in flight and 32 a tick, each every 16 ticks, 0.8 s).

        Nothing is counted while the host's last process id stays put
        (:func:`atlantis.child.tree.last_pid`): no task was created anywhere, so no tree grew
        (hundreds of sleeping attempts cost nothing to watch). When it moves, a tree is
        counted again only if it may have grown past the limit: a tree of ``n`` tasks
        cannot pass ``limit`` before the host created ``limit - n + 1`` more tasks, which
        the kernel's count of tasks created (:func:`atlantis.child.tree.tasks_created`,
        which never wraps) tells (``Child.tasks_recount_at``). Where that count is missing,
        every tree is counted again after each move."""
        s = self.rt.settings
        limit = s.max_tasks_per_child
        stamp = last_pid()
        if stamp is not None and stamp == self._pid_stamp and not self._counts_owed:
            return
        if stamp is None or stamp != self._pid_stamp:
            self._pid_stamp = stamp
            self._moves += 1
        created = tasks_created()
        seen = created if created is not None else self._moves
        started = self.ledger.attempts_started
        if seen < self._soonest and started == self._started and not self._counts_owed:
            return  # no tree may have passed the limit, and no attempt came since the last look
        self._started = started
        due: list[Attempt] = []
        soonest = math.inf
        for a in self.ledger.in_flight.values():
            if a.child is None or a.killed:
                continue
            if a.child.tasks_recount_at <= seen:
                due.append(a)
            else:
                soonest = min(soonest, a.child.tasks_recount_at)
        per_tick = s.task_counts_per_tick
        if len(due) > per_tick:
            start = self._task_turn % len(due)
            due = (due[start:] + due[:start])[:per_tick]
            self._task_turn = start + per_tick
            self._counts_owed = True
        else:
            self._counts_owed = False
        self._soonest = -math.inf if self._counts_owed else soonest
        for a in due:
            assert a.child is not None
            if not a.child.pid:  # a zygote's fork not reported yet: its tree is not known,
                self._soonest = -math.inf  # so it stays due, and the next tick looks again
                continue
            count = a.child.tasks(limit)
            if count > limit:
                log.warning("%s: the child runs more than %d tasks (processes and threads), "
                            "over --max-tasks-per-child; killing its whole tree", a.tag(), limit,
                            extra=a.log_extra())
                a.stop("tasks", self.rt.now(), sig=signal.SIGKILL)
                continue
            if created is not None:  # it cannot pass the limit before this many more
                a.child.tasks_recount_at = created + limit + 1 - count
            else:
                a.child.tasks_recount_at = self._moves + 1  # after the next move
            self._soonest = min(self._soonest, a.child.tasks_recount_at)
