"""The ledger: every attempt this supervisor holds, from its claim to its written outcome.

One owner for the bookkeeping of attempts; the services ask it and tell it, and none of them
keeps attempts of its own:

    held       claimed ahead of need, waiting for a free child (the claimer holds, the pool
               takes); given back unspent when no child took them in time
    in flight  running in a child (the pool starts them; leases renew and enforcement stops
               them)
    ended      their outcome decided, waiting to be written (the completer takes batches)
    lost       their lease is gone: never written, never released, left to be rescued

A cancel request reaches an attempt through :meth:`Ledger.cancel`, whoever heard of it (a
NOTIFY, a renewal, the poll).
"""

from __future__ import annotations

import asyncio
import logging
import math
import signal
from collections import deque
from collections.abc import Callable, Iterable

from atlantis.store.supervision import ClaimedRow, Result
from atlantis.supervisor import policy
from atlantis.supervisor.attempts import Attempt
from atlantis.supervisor.metrics import Metrics
from atlantis.supervisor.settings import Settings
from atlantis.supervisor.tracing import Tracing
from atlantis.supervisor.waiting import until_set
from atlantis.units import format_duration

#: At most how long a loop that looks at each attempt in flight every tick waits while none
#: is (:meth:`Ledger.tick`): the start of one wakes it at once.
IDLE_TICK = 1.0

log = logging.getLogger("atlantis.supervisor")

class Ledger:
    def __init__(self, settings: Settings, metrics: Metrics, now: Callable[[], float],
                 worker: str = "") -> None:
        self.settings = settings
        self.metrics = metrics
        self.now = now
        self.worker = worker
        self.tracing = Tracing()
        """The attempts' spans (OpenTelemetry), from claim to end."""
        self.held: deque[Attempt] = deque()
        """Claimed ahead of need, oldest first. Their leases are not renewed: each is
        started or given back within ``claim_ahead_hold``, well inside its first lease."""
        self._stale_from = math.inf
        """No held row is stale before this time (it may be later: rows left since): the
        claimer's wake-ups, one per attempt ended, skip the walk over every held row."""
        self.in_flight: dict[int, Attempt] = {}
        self.flying = asyncio.Event()
        """Set while an attempt is in flight: the loops that look at each one every tick
        wait on it while none is (:meth:`tick`)."""
        self.ended: list[tuple[Attempt, Result]] = []
        """Outcomes decided, not yet taken by the completer."""
        self.writing: list[tuple[Attempt, Result]] = []
        """Outcomes the completer is writing now."""
        self.lost: dict[int, float] = {}
        """Job ids whose attempt lost its lease, with when."""
        self.typical_attempt: float | None = None
        """A moving average of how long attempts take (seconds): rows are claimed ahead only
        while it is short."""
        self.attempts_ended = 0
        """Attempts that ended in a child so far (a child became free)."""
        self.attempts_started = 0
        """Attempts that went in flight so far."""
        self.on_ended: Callable[[], None] = lambda: None
        """Called when an outcome is waiting to be written (the completer wakes)."""
        self.on_change: Callable[[], None] = lambda: None
        """Called when an attempt leaves flight (a drain waits for that)."""

    # ---- claimed ----------------------------------------------------------------------------

    def claimed(self, row: ClaimedRow, sent_at: float) -> Attempt:
        """A row just claimed: an attempt whose lease counts from when the claim went out."""
        self.lost.pop(row.id, None)  # back to us: an older loss of it is over
        a = Attempt(row=row)
        a.leased(sent_at)
        self.tracing.begin(a, self.worker)
        return a

    def hold(self, a: Attempt) -> None:
        """Hold ``a`` for the next idle child: a row of a limited job (claimed for an idle
        child, never ahead) goes before the rows held ahead."""
        if a.limited:
            self.held.appendleft(a)
        else:
            self.held.append(a)
        self._stale_from = min(self._stale_from, self._stale_at(a))

    def _stale_at(self, a: Attempt) -> float:
        return a.renewed_at + policy.hold_limit(a.heartbeat, self.settings.claim_ahead_hold)

    def stale(self, a: Attempt, now: float) -> bool:
        """Held too long to start (:func:`policy.hold_limit`): give it back instead."""
        return now >= self._stale_at(a)

    def take_held(self, free: Callable[[Attempt], bool], start: Callable[[Attempt], bool]
                  ) -> tuple[int, int]:
        """Start held attempts, oldest first, while ``free(next)`` (a child is idle for it): ``start``
        says whether one took it (no idle child may have its handler yet, during a reload:
        it waits). Stale ones are given back instead. Returns how many were given back, and
        of those how many had (nearly) outlived their leases."""
        now = self.now()
        given = expired = 0
        kept: list[Attempt] = []
        while self.held and free(self.held[0]):
            a = self.held.popleft()
            if self.stale(a, now):
                self.end(a, policy.RELEASE)
                given += 1
                expired += policy.lease_lost(now, a.lease_end, a.heartbeat)
            elif a.row.cancel_requested or a.cancelled_while_held:
                # Cancelled before any child took it (a workflow that stopped, say): it
                # never starts, and ends cancelled as a cancelled attempt does.
                self.end(a, policy.Verdict("cancelled", True, error=policy.cancel_error(a.facts)))
            elif not start(a):
                kept.append(a)
        self.held.extendleft(reversed(kept))
        return given, expired

    def give_back_held(self, *, stale_only: bool = False) -> int:
        """Give held rows back, unspent: the stale ones, or all of them (a drain)."""
        now = self.now()
        if stale_only and now < self._stale_from:
            return 0  # none can be stale yet
        keep: list[Attempt] = []
        give: list[Attempt] = []
        for a in self.held:
            (keep if stale_only and not self.stale(a, now) else give).append(a)
        self.held.clear()
        self.held.extend(keep)
        self._stale_from = min(map(self._stale_at, keep), default=math.inf)
        for a in give:
            self.end(a, policy.RELEASE)
        return len(give)

    # ---- in flight --------------------------------------------------------------------------

    def started(self, a: Attempt) -> None:
        self.in_flight[a.job_id] = a
        self.attempts_started += 1
        self.flying.set()

    async def tick(self, tick: float, idle: float) -> None:
        """A tick of a loop that looks at each attempt in flight; while none is, until one
        starts (at most ``idle``): an idle supervisor is not woken by them every tick."""
        if self.in_flight:
            await asyncio.sleep(tick)
            return
        await until_set(self.flying, idle)

    def attempt_of(self, job_id: int, child: object) -> Attempt | None:
        """The attempt in flight for ``job_id`` if it runs in ``child``."""
        a = self.in_flight.get(job_id)
        return a if a is not None and a.child is child else None

    def ran(self, took: float) -> None:
        """An attempt ended in its child after ``took`` seconds: a child is free."""
        self.attempts_ended += 1
        self.typical_attempt = took if self.typical_attempt is None else (
            0.9 * self.typical_attempt + 0.1 * took)

    def cancel(self, job_id: int) -> None:
        """An operator cancelled the job: tell its attempt here, if any; the grace starts. A
        row held ahead ends cancelled instead of starting (:meth:`take_held`)."""
        for held in self.held:
            if held.job_id == job_id:
                held.cancelled_while_held = True
        a = self.in_flight.get(job_id)
        if a is not None and a.request_cancel(self.now()):
            log.info("%s: cancelled by an operator; the handler has %s to return", a.tag(),
                     format_duration(self.settings.cancel_grace), extra=a.log_extra())

    def lose(self, a: Attempt, why: str) -> None:
        """The attempt no longer owns its row: kill it at once; nothing more is written."""
        a.lost = True
        self.lost[a.job_id] = self.now()
        self.metrics.leases_lost.inc()
        log.error("%s: %s", a.tag(), why, extra=a.log_extra())
        a.stop("lease", self.now(), sig=signal.SIGKILL)

    def rescued(self, job_ids: Iterable[int]) -> None:
        """Rows a rescue gave back: a loss of ours among them is over."""
        for job_id in job_ids:
            self.lost.pop(job_id, None)

    # ---- ended ------------------------------------------------------------------------------

    def end(self, a: Attempt, outcome: policy.Verdict) -> None:
        """The attempt ended (or was given back): out of flight, its outcome to be written."""
        self.in_flight.pop(a.job_id, None)
        if not self.in_flight:
            self.flying.clear()
        a.finished = True
        self.on_change()
        self.metrics.attempt_ended(a.queue, a.job, "lost" if a.lost else outcome.label,
                                   self.now() - a.started if a.started else None)
        self.tracing.end(a, outcome.label, outcome.error, a.lost)
        if a.lost:
            log.warning("%s: the lease was lost; its result is not written", a.tag(),
                        extra=a.log_extra())
            return
        checkpoint = a.checkpoint if a.checkpoint_dirty or a.checkpoint_sent else None
        self.ended.append((a, Result(a.job_id, a.attempt, outcome.state, outcome.spent,
                                     outcome.delay, outcome.error, checkpoint, outcome.label,
                                     a.child_pid, a.log_lines, a.log_dropped, a.run,
                                     outcome.result, outcome.backoff, a.row.workflow_id,
                                     a.row.run_id, outcome.wake, outcome.waits,
                                     a.warning)))
        self.on_ended()

    def take_ended(self, most: int) -> list[tuple[Attempt, Result]]:
        """The next batch to write (the completer): at most ``most`` outcomes. (The store
        orders them for the statement: :func:`atlantis.store.supervision.finish_params`.)"""
        self.writing, self.ended = self.ended[:most], self.ended[most:]
        return self.writing

    def written(self, *, again: bool = False) -> None:
        """The batch taken is written, or (``again``) is to be written again first."""
        if again:
            self.ended = self.writing + self.ended
        self.writing = []

    @property
    def unwritten(self) -> list[Attempt]:
        """Attempts whose outcome is not written yet."""
        return [a for a, _ in self.ended + self.writing]

    # ---- what the database may hold for us --------------------------------------------------

    def known(self) -> list[int]:
        """Job ids whose rows this supervisor knows it holds: any other row claimed by it is
        an orphan of a claim whose answer was lost. Lost attempts did run: their rows are
        left to be rescued as failures, not given back: each is remembered until its row
        comes back to this supervisor, is rescued by it, or ``--lost-kept-for`` after the
        loss (by then its lease is long over and some supervisor's rescue took it)."""
        now = self.now()
        for job_id in [j for j, at in self.lost.items() if now - at > self.settings.lost_kept_for]:
            del self.lost[job_id]
        return [*self.in_flight, *(a.job_id for a in self.held),
                *(a.job_id for a in self.unwritten), *self.lost]
