"""An attempt in flight: what the supervisor knows of one claimed row, and how it stops one."""

from __future__ import annotations

import math
import signal
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from atlantis.protocol.messages import Cancel, Stopping
from atlantis.store.supervision import ClaimedRow, Progress
from atlantis.supervisor.children import Child
from atlantis.supervisor.policy import AttemptFacts, StopReason


@dataclass(eq=False)
class Attempt:
    row: ClaimedRow
    lease_end: float = 0.0
    """CLOCK_MONOTONIC time by which the lease surely ends unless renewed: written by
    :meth:`leased` alone."""
    renewed_at: float = 0.0
    child: Child | None = None
    started: float = 0.0
    checkpoint: Progress | None = None
    """The latest checkpoint the handler reported (``ctx.checkpoint``)."""
    checkpoint_dirty: bool = False
    """``checkpoint`` is not written yet: the next renewal (or the finish) carries it."""
    checkpoint_sent: bool = False
    """A renewal on its way carries ``checkpoint``: until it is answered, the finish carries
    it too (the two go on different connections, and a finish that commits first leaves the
    renewal no running row to write it on)."""
    checkpoint_since: float = 0.0
    """When the oldest unwritten checkpoint came: it is written within
    ``progress_interval`` of that."""
    stop_reason: StopReason | None = None
    """Why the supervisor is stopping it: timeout, drain, memory, tasks, cancel, lease, protocol."""
    stop_detail: str = ""
    term_sent_at: float | None = None
    killed: bool = False
    lost: bool = False
    """The lease is gone: nothing more may be written for this attempt."""
    finished: bool = False
    cancelled_while_held: bool = False
    """A cancel reached it before a child took it: it ends cancelled and never starts."""
    cancel_heard_at: float | None = None
    """When this supervisor heard that an operator cancelled the job (the grace starts)."""
    child_pid: int | None = None
    next_check: float = 0.0
    """Before this (monotonic) no limit of it can be due (:meth:`Enforcement.check`).
    Whatever makes one due sooner resets it, through :meth:`look_again`."""
    next_renewal: float = 0.0
    """Before this no renewal or checkpoint write of it can be due (:meth:`Leases.check`).
    A new checkpoint resets it, through :meth:`look_again`."""
    stopping_sent: bool = False
    """The handler was told the supervisor is draining (``ctx.stopping``): once."""
    log_lines: int = 0
    log_dropped: int = 0
    warning: str | None = None
    """What atlantis had to end that the attempt left running (written on its attempt)."""
    span: Any = None
    """Its OpenTelemetry span while tracing is on (:mod:`atlantis.supervisor.tracing`)."""
    span_ended: bool = False
    limited: bool = False
    """Claimed by the limited claim (``claim_limited``) for an idle child, never ahead: it
    starts before the rows held ahead."""

    # The claimed row's own facts, read so often that each is an attribute (the row is frozen).
    job_id: int = field(init=False)
    attempt: int = field(init=False)
    run: int = field(init=False)
    """The job's run: with ``attempt``, which attempt this is (every write is fenced on both)."""
    job: str = field(init=False)
    queue: str = field(init=False)
    heartbeat: float = field(init=False)
    timeout: float = field(init=False)

    looks: ClassVar[int] = 0
    """How many times an attempt of this process asked :meth:`look_again`: the services that
    check every attempt in flight each tick skip the tick while it has not changed and none
    of them is due (:class:`Soonest`)."""

    def look_again(self, *, limits: bool = False, lease: bool = False) -> None:
        """Something made this attempt's limits (``limits``) or its lease or checkpoint
        (``lease``) need a look at the next tick: the one way ``next_check`` and
        ``next_renewal`` move earlier."""
        if limits:
            self.next_check = 0.0
        if lease:
            self.next_renewal = 0.0
        Attempt.looks += 1

    def __post_init__(self) -> None:
        row = self.row
        self.job_id, self.attempt, self.run = row.id, row.attempt, row.run
        self.job, self.queue = row.job, row.queue
        self.heartbeat, self.timeout = row.heartbeat, row.timeout

    def leased(self, sent: float) -> None:
        """The claim or a renewal that went out at ``sent`` (monotonic) took the lease: it
        ends a heartbeat later (never later than the row's ``claimed_until``, PostgreSQL's
        ``now()`` plus the heartbeat). The one writer of :attr:`lease_end`, for the ledger's
        claim and the leases service's renewals; a running child's lease cell hears it."""
        self.lease_end = sent + self.heartbeat
        self.renewed_at = sent
        if self.child is not None:
            self.child.set_lease(self.lease_end, self.heartbeat)

    @property
    def key(self) -> tuple[int, int, int]:
        """(job id, run, attempt): this attempt among every attempt of every run."""
        return (self.row.id, self.row.run, self.row.attempt)

    @property
    def facts(self) -> AttemptFacts:
        return AttemptFacts(self.row.attempt, self.row.max_attempts, self.row.backoff,
                            self.row.timeout, self.row.workflow is not None)

    def tag(self) -> str:
        run = f" run={self.row.run}" if self.row.run > 1 else ""
        return f"job={self.row.id}{run} attempt={self.row.attempt}"

    def log_extra(self) -> dict[str, Any]:
        return {"job_id": self.row.id, "run": self.row.run, "attempt": self.row.attempt,
                "queue": self.row.queue}

    @property
    def cancelling(self) -> bool:
        return self.cancel_heard_at is not None

    def request_cancel(self, now: float) -> bool:
        """An operator cancelled the job: tell the handler (``ctx.cancelled``) and start the
        cancel grace. False if it was known already."""
        if self.cancel_heard_at is not None:
            return False
        self.cancel_heard_at = now
        self.look_again(limits=True)
        if self.child is not None:
            self.child.send(Cancel(job_id=self.row.id))
        return True

    def stop(self, reason: StopReason, now: float, *, sig: int = signal.SIGTERM,
             detail: str = "") -> None:
        """Stop the attempt's process group; the first reason given is the one recorded.

        SIGTERM starts the kill grace (a drain first tells the handler, ``ctx.stopping``);
        SIGKILL ends it at once.
        """
        self.look_again(limits=True)
        if self.stop_reason is None:
            self.stop_reason = reason
            self.stop_detail = detail
        child = self.child
        if child is None:
            return
        if sig == signal.SIGKILL:
            self.killed = True
        elif self.term_sent_at is None:
            self.term_sent_at = now
            if reason == "drain":
                self.tell_stopping()
        child.signal_group(sig)

    def tell_stopping(self) -> None:
        """The supervisor is draining: tell the handler (``ctx.stopping``), once."""
        if self.child is not None and not self.stopping_sent:
            self.stopping_sent = True
            self.child.send(Stopping(job_id=self.row.id))

    def took_checkpoint(self, checkpoint: Progress, now: float) -> None:
        """The handler reported a checkpoint: written with the next renewal, or within
        ``progress_interval`` if that comes later (the only throttle on the way)."""
        self.checkpoint = checkpoint
        if not self.checkpoint_dirty:
            self.checkpoint_dirty = True
            self.checkpoint_since = now
            self.look_again(lease=True)


class Soonest:
    """When a service that looks at every attempt in flight each tick next has to: the
    earliest of their times (``next_check`` or ``next_renewal``) at its last whole pass,
    unless an attempt asked :meth:`Attempt.look_again` since. With hundreds of long
    attempts, a tick where none is due costs a comparison, not a walk over all of them."""

    def __init__(self) -> None:
        self.at = 0.0
        self._looks = -1

    def due(self, now: float) -> bool:
        """Whether the pass of this tick must walk the attempts (it then calls :meth:`seen`
        with the earliest time it found)."""
        if now < self.at and self._looks == Attempt.looks:
            return False
        self._looks = Attempt.looks
        return True

    def seen(self, at: float) -> None:
        self.at = at

    def walk(self, now: float, attempts: Iterable[Attempt],
             when: Callable[[Attempt], float]) -> Iterator[Attempt]:
        """The attempts due at ``now`` by ``when`` (their ``next_check`` or ``next_renewal``),
        none on a tick that is skipped. The caller looks at each before the next is given
        (and may move its time); the soonest time is taken after that."""
        if not self.due(now):
            return
        at = math.inf
        for a in list(attempts):
            if now >= when(a):
                yield a
            at = min(at, when(a))
        self.seen(at)
