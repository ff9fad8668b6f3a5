"""Attempt logs: each attempt's stdout and stderr lines, kept in ``atlantis.logs``.

The lines the supervisor logs (tagged ``job=N attempt=M``) are also queued here and written
in batches (one statement per flush), and an attempt's lines before its outcome (the
completer flushes them first). Each attempt keeps at most ``--log-retention-bytes``
of its newest lines in the database: once its budget is spent, older lines are deleted and
counted as dropped. The counts reach ``atlantis.attempts`` with the attempt's outcome.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from atlantis.store import upkeep as sql
from atlantis.supervisor.db import DatabaseUnavailable, StatementRejected
from atlantis.supervisor.output import Label
from atlantis.supervisor.policy import clip
from atlantis.supervisor.runtime import Runtime
from atlantis.supervisor.service import Loop, Service

log = logging.getLogger("atlantis.supervisor")

Line = tuple[datetime, str, str, int]
"""(when, stream, text, size in bytes) of a line not written yet."""


@dataclass
class _Kept:
    """One attempt's output: lines waiting to be written, and the sizes of those written."""

    pending: deque[Line] = field(default_factory=deque)
    written: deque[int] = field(default_factory=deque)
    bytes: int = 0
    lines: int = 0
    dropped: int = 0
    trim: bool = False


class AttemptLogs(Service):
    name = "logs"

    def __init__(self, rt: Runtime) -> None:
        super().__init__(rt)
        self.db = rt.db("logs")
        self.budget = rt.settings.log_retention_bytes
        # By (job id, run, attempt): run 2's attempt 1 is not run 1's.
        self._kept: dict[tuple[int, int, int], _Kept] = {}
        self._ended: set[tuple[int, int, int]] = set()
        self._lines = asyncio.Event()
        """Set when a line is kept: the flush loop waits for it while nothing is."""

    def loops(self) -> list[Loop]:
        return [self._flush_loop]

    def line(self, label: Label, stream: str, text: str) -> None:
        """One line of an attempt's output (called from the child's output reader).

        The budget holds in memory too: past it the oldest lines go, the written ones
        first (deleted at the next flush), so a flood never reaches the database.
        """
        if self.budget <= 0:
            return
        kept = self._kept.setdefault((label.job_id, label.run, label.attempt), _Kept())
        kept.lines += 1
        text = clip(text, 64 * 1024)
        size = len(text.encode("utf-8", "replace")) + 1
        kept.pending.append((datetime.now(UTC), stream, text, size))
        kept.bytes += size
        self._lines.set()
        while kept.bytes > self.budget:
            if kept.written:
                kept.bytes -= kept.written.popleft()
                kept.trim = True
            else:
                kept.bytes -= kept.pending.popleft()[3]
            kept.dropped += 1

    def ended(self, label: Label) -> tuple[int, int]:
        """The attempt ended: (lines it wrote, lines not kept). Its record is dropped soon."""
        key = (label.job_id, label.run, label.attempt)
        kept = self._kept.get(key)
        if kept is None:
            return (0, 0)
        self._ended.add(key)
        return (kept.lines, kept.dropped)

    def pending(self, keys: Iterable[tuple[int, int, int]]) -> bool:
        """Whether any of these attempts (job id, run, attempt) has lines not written yet."""
        return any(kept is not None and kept.pending
                   for kept in map(self._kept.get, keys))

    async def _flush_loop(self) -> None:
        while True:
            if not self._kept:  # nothing to write, trim or forget: wait for a line
                self._lines.clear()
                await self._lines.wait()
            await asyncio.sleep(self.rt.settings.log_flush_interval)
            await self.flush()

    async def flush(self) -> None:
        batch: list[tuple[int, int, int, Line]] = []
        taken: list[tuple[_Kept, list[Line]]] = []
        for (job_id, run, attempt), kept in self._kept.items():
            if kept.pending:
                lines = list(kept.pending)
                kept.pending.clear()
                kept.written.extend(x[3] for x in lines)
                taken.append((kept, lines))
                batch.extend((job_id, run, attempt, x) for x in lines)
        if batch:
            try:
                await sql.log_insert(self.db, [(j, r, a, x[0], x[1], x[2])
                                               for j, r, a, x in batch])
            except DatabaseUnavailable:
                for kept, lines in taken:  # written when the database is back
                    for _ in lines:
                        if kept.written:
                            kept.written.pop()
                    kept.pending.extendleft(reversed(lines))
                return
            except StatementRejected as exc:
                log.error("%d output lines were refused by the database (%s); dropped",
                          len(batch), exc)
        for key, kept in list(self._kept.items()):
            if kept.trim:
                kept.trim = False
                try:
                    await sql.log_trim(self.db, key, len(kept.written))
                except (DatabaseUnavailable, StatementRejected):
                    kept.trim = True
                    return
            if key in self._ended and not kept.pending:
                self._ended.discard(key)
                del self._kept[key]

    async def stop(self) -> None:
        """The output of the attempts that ended is written, then the loop stops."""
        await self.flush()
        await self.cancel_loops()
