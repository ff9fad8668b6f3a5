"""The completer: outcomes of attempts written in batches, one statement for many.

An attempt's end is recorded in the ledger (:meth:`Ledger.end`) and written here with the
next batch. While the claimer holds no rows ahead (it serves limited jobs), results come one
child at a time: a write waits ``finish_linger`` (2 ms) for a few more to share its commit.
While it claims ahead, a write waits only while results come faster than :data:`BUSY_LINGER`
but slower than a write takes (:func:`linger_for`): such results (a fresh worker's come a few
milliseconds apart) would otherwise each be a statement and a commit of its own; faster ones
gather while a write is under way, and an idle supervisor's are written at once.
A batch the server refuses because of its data (a value no column accepts) is
retried row by row: the rows that pass are written, and an offending row is written again
reduced to a plain failure with its text cleaned; only if even that is refused is the row
left to its lease (it will be rescued). A batch that fails for any other reason is an
outage: kept and retried with the connection's backoff. Nothing here can stop the
supervisor.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Sequence

from atlantis.store import supervision as sql
from atlantis.store.supervision import Progress, Result
from atlantis.supervisor import tracing
from atlantis.supervisor.attempt_logs import AttemptLogs
from atlantis.supervisor.attempts import Attempt
from atlantis.supervisor.db import DatabaseUnavailable, StatementRejected
from atlantis.supervisor.policy import clip, progress_text
from atlantis.supervisor.runtime import Runtime
from atlantis.supervisor.service import Loop, Service
from atlantis.tracing import FINISH_SPAN

log = logging.getLogger("atlantis.supervisor")

#: The longest a result waits for others to share its write while rows are claimed ahead.
BUSY_LINGER = 0.005
#: How many more results a busy supervisor's write waits for, at the pace they come.
BUSY_SHARE = 3


def linger_for(setting: float, ahead: bool, pace: float, write: float) -> float:
    """How long the next write waits for more results: ``setting`` (``--finish-linger``)
    while nothing is claimed ahead; while rows are, long enough for :data:`BUSY_SHARE` more
    at ``pace`` (the typical time between two results), at most :data:`BUSY_LINGER`, but
    only while they come slower than a write takes (``write``: faster, they gather on their
    own while one is under way) and faster than :data:`BUSY_LINGER` (an idle supervisor's
    go at once). ``setting`` 0: never."""
    if not setting:
        return 0.0
    if not ahead:
        return setting
    return min(BUSY_LINGER, BUSY_SHARE * pace) if write < pace < BUSY_LINGER else 0.0


class Completer(Service):
    name = "completer"

    def __init__(self, rt: Runtime, logs: AttemptLogs | None = None) -> None:
        super().__init__(rt)
        self.logs = logs
        """The attempts' output: written before their outcomes (``tide job logs`` of a job
        seen finished shows what its attempt printed)."""
        self.db = rt.db("finish")
        self._host = socket.gethostname()
        self.ledger = rt.ledger
        self.flush = asyncio.Event()
        self.ledger.on_ended = self._ended
        self._last_end = 0.0
        self.pace = 1.0
        """The typical time between two results (seconds, a moving average, at most 1)."""
        self.write_time = 0.001
        """The typical time a write takes (seconds, a moving average)."""
        self._maybe_written: set[tuple[int, int, int]] = set()
        """Attempts whose result went out in a statement whose answer was lost: it may have
        committed, and then the retry (fenced on the running attempt) matches no row."""

    def loops(self) -> list[Loop]:
        return [self._write_loop]

    def _ended(self) -> None:
        now = self.rt.now()
        self.pace = 0.5 * (self.pace + min(now - self._last_end, 1.0))
        self._last_end = now
        self.flush.set()

    # ---- writing --------------------------------------------------------------------------

    async def _write_loop(self) -> None:
        while True:
            await self.flush.wait()
            self.flush.clear()
            if not self.ledger.ended:
                continue
            linger = linger_for(self.rt.settings.finish_linger, self.rt.claim_mode.ahead,
                                self.pace, self.write_time)
            if linger and len(self.ledger.ended) < 8 and not self.rt.draining:
                # Results that come one at a time: a moment's wait lets a few share one
                # write (one commit).
                await asyncio.sleep(linger)
            # At most --finish-batch a statement: a backlog of results (after a stall) goes out
            # in several, each as quick to write and to retry as a usual one.
            batch = self.ledger.take_ended(self.rt.settings.finish_batch)
            began = tracing.now_ns()
            start = self.rt.now()
            try:
                await self._write(batch)
            except DatabaseUnavailable as exc:
                if exc.sent:
                    self._maybe_written.update(a.key for a, _ in batch)
                self.ledger.written(again=True)
                await asyncio.sleep(0.1)  # the connection's backoff paces the retries
                self.flush.set()
                continue
            except BaseException:
                self.ledger.written()
                raise
            self.ledger.written()
            self.write_time = 0.5 * (self.write_time + self.rt.now() - start)
            self.ledger.tracing.batch(FINISH_SPAN, (a for a, _ in batch), began, {})
            if self.ledger.ended:
                self.flush.set()
            self.rt.changed.set()
            self.rt.wake.set()

    async def _write(self, batch: list[tuple[Attempt, Result]]) -> None:
        if self.logs is not None and self.logs.pending(a.key for a, _ in batch):
            await self.logs.flush()  # never raises for the database: a failed one waits
        try:
            written = await self._finish([r for _, r in batch])
        except StatementRejected as exc:
            log.warning("a batch of %d results was refused (%s); writing them one by one",
                        len(batch), exc)
            written = set()
            for a, result in batch:
                written |= await self._write_alone(a, result)
        for a, result in batch:
            await self._check_written(a, result, written)

    async def _finish(self, results: Sequence[Result]) -> set[int]:
        try:
            rows = await sql.finish(self.db, self.rt.worker_id, results, self._host, os.getpid(),
                                    self.rt.settings.finish_timeout)
        except TypeError as exc:  # not encodable as JSON (a lone surrogate): refused as data
            raise StatementRejected(f"a result could not be encoded: {exc}", None) from exc
        return {r.id for r in rows}

    async def _write_alone(self, a: Attempt, result: Result) -> set[int]:
        try:
            return await self._finish([result])
        except StatementRejected as exc:
            why = str(exc)
            log.error("%s: the outcome was refused by the database (%s); writing a plain "
                      "failure instead", a.tag(), why, extra=a.log_extra())
        plain = sanitized(result, f"the attempt's outcome could not be stored: {why}")
        try:
            return await self._finish([plain])
        except StatementRejected as again:
            log.error("%s: even a plain failure was refused (%s); the row will be rescued when "
                      "its lease ends", a.tag(), again, extra=a.log_extra())
            return set()

    async def _check_written(self, a: Attempt, result: Result, written: set[int]) -> None:
        if a.job_id in written:
            self._maybe_written.discard(a.key)
            return
        if a.key in self._maybe_written:
            self._maybe_written.discard(a.key)
            if await self._landed_earlier(a, result):
                log.info("%s: result already recorded by the try whose answer was lost when the "
                         "connection broke", a.tag(), extra=a.log_extra())
                return
        log.warning("%s: result not recorded: the row is no longer this attempt's (lease lost "
                    "or row changed)", a.tag(), extra=a.log_extra())

    async def _landed_earlier(self, a: Attempt, result: Result) -> bool:
        try:
            row = await sql.attempt_state(self.db, a.job_id)
        except (DatabaseUnavailable, StatementRejected):
            return False
        expected = a.attempt if result.spent else a.attempt - 1
        return (row is not None and row.claimed_by == self.rt.worker_id
                and row.state != "running" and row.run == a.run and row.attempt == expected)

    async def stop(self) -> None:
        """Give the outcomes not written yet ``--flush-timeout`` to be written, then stop."""
        rt = self.rt
        deadline = rt.now() + rt.settings.flush_timeout
        while self.ledger.unwritten and rt.now() < deadline:
            self.flush.set()
            await rt.wait_changed(0.1)
        await self.cancel_loops()


def sanitized(result: Result, why: str) -> Result:
    """``result`` reduced to what any row accepts: a failure whose text is clean and short."""
    error = result.error or {}
    message = clip(str(error.get("message", "")), 1024)
    plain = {"attempt": result.attempt, "kind": str(error.get("kind", "exception"))[:40],
             "message": clip(f"{message} ({why})", 4096)}
    progress = (Progress(result.progress.pct, progress_text(result.progress.msg))
                if result.progress else None)
    state = result.state if result.state in ("complete", "dead", "available", "cancelled") else "dead"
    delay = result.delay if 0 <= result.delay <= 86_400 * 365 else 0.0
    backoff = result.backoff if result.backoff is None or 0 <= result.backoff <= 86_400 * 365 \
        else 0.0
    return Result(result.job_id, result.attempt, state, result.spent, delay, plain, progress,
                  result.label[:40], result.child_pid, result.log_lines, result.log_dropped,
                  result.run, backoff=backoff, workflow_id=result.workflow_id,
                  run_id=result.run_id)
