"""An attempt in flight: what the supervisor knows of one claimed row, and how it stops one."""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Any

from atlantis.protocol.messages import Cancel, Stopping
from atlantis.store.jobs import ClaimedRow, Progress
from atlantis.supervisor.children import Child
from atlantis.supervisor.policy import AttemptFacts, StopReason


@dataclass(eq=False)
class Attempt:
    row: ClaimedRow
    lease_end: float
    """CLOCK_MONOTONIC time by which the lease surely ends unless renewed."""
    renewed_at: float
    child: Child | None = None
    started: float = 0.0
    progress: Progress | None = None
    progress_dirty: bool = False
    progress_since: float = 0.0
    stop_reason: StopReason | None = None
    """Why the supervisor is stopping it: timeout, drain, memory, tasks, cancel, lease, protocol."""
    stop_detail: str = ""
    term_sent_at: float | None = None
    killed: bool = False
    lost: bool = False
    """The lease is gone: nothing more may be written for this attempt."""
    finished: bool = False
    cancel_heard_at: float | None = None
    """When this supervisor heard that an operator cancelled the job (the grace starts)."""
    child_pid: int | None = None
    next_check: float = 0.0
    """Before this (monotonic) nothing of it can be due: no limit, renewal or checkpoint
    flush (:meth:`Leases.check`). Whatever makes something due sooner resets it to 0."""
    log_lines: int = 0
    log_dropped: int = 0

    @property
    def job_id(self) -> int:
        return self.row.id

    @property
    def attempt(self) -> int:
        return self.row.attempt

    @property
    def run(self) -> int:
        return self.row.run

    @property
    def job(self) -> str:
        return self.row.job

    @property
    def queue(self) -> str:
        return self.row.queue

    @property
    def heartbeat(self) -> float:
        return self.row.heartbeat

    @property
    def timeout(self) -> float:
        return self.row.timeout

    @property
    def key(self) -> tuple[int, int, int]:
        """(job id, run, attempt): this attempt among every attempt of every run."""
        return (self.row.id, self.row.run, self.row.attempt)

    @property
    def facts(self) -> AttemptFacts:
        return AttemptFacts(self.row.attempt, self.row.max_attempts, self.row.backoff,
                            self.row.timeout)

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
        self.next_check = 0.0
        if self.child is not None:
            self.child.send(Cancel(job_id=self.row.id))
        return True

    def stop(self, reason: StopReason, now: float, *, sig: int = signal.SIGTERM,
             detail: str = "") -> None:
        """Stop the attempt's process group; the first reason given is the one recorded.

        SIGTERM starts the kill grace (a drain first tells the handler, ``ctx.stopping``);
        SIGKILL ends it at once.
        """
        self.next_check = 0.0
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
                child.send(Stopping(job_id=self.row.id))
        child.signal_group(sig)
