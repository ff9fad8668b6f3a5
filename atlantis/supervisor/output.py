"""A child's stdout and stderr as log lines: split, escaped, tagged, rate-limited.

Lines are tagged with the attempt they belong to (``job=42 attempt=1``). Bytes that are not
UTF-8, and NUL, are escaped (``\\xff``), never fatal; a line longer than 64 KiB is cut into
pieces. A chatty attempt cannot flood the log: past a rate (a token bucket per attempt,
bursts of ten seconds' worth) lines are counted instead of logged, and the count is logged
when the attempt ends.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

out_log = logging.getLogger("atlantis.output")
log = logging.getLogger("atlantis.supervisor")

MAX_LINE = 64 * 1024


class Label(NamedTuple):
    """The attempt a child runs, as its output lines are tagged."""

    job_id: int
    attempt: int
    queue: str
    run: int = 1

    def tag(self) -> str:
        run = f" run={self.run}" if self.run > 1 else ""
        return f"job={self.job_id}{run} attempt={self.attempt}"


@dataclass(eq=False)
class OutputLog:
    pid: int
    rate: float
    """Lines a second an attempt may log; 0 means no limit."""
    label: Label | None = None
    sink: Callable[[Label, str, str], None] | None = None
    """Also receives every logged line of an attempt (to keep it in the database)."""
    dropped: int = 0
    _tokens: float = 0.0
    _refilled: float = field(default_factory=time.monotonic)
    _partial: dict[str, bytearray] = field(default_factory=dict)

    def begin(self, label: Label) -> None:
        self.label = label
        self.dropped = 0
        self._tokens = self.rate * 10
        self._refilled = time.monotonic()

    def end(self) -> None:
        """The attempt ended: say how many of its lines were not logged, if any."""
        if self.label is not None and self.dropped:
            log.warning("%s: %d output lines were not logged (over %g lines a second)",
                        self.label.tag(), self.dropped, self.rate,
                        extra={"job_id": self.label.job_id, "attempt": self.label.attempt})
        self.label = None
        self.dropped = 0

    def feed(self, data: bytes, stream: str) -> None:
        buf = self._partial.setdefault(stream, bytearray())
        buf += data
        while True:
            nl = buf.find(b"\n")
            if nl < 0:
                if len(buf) > MAX_LINE:
                    self._emit(bytes(buf[:MAX_LINE]), stream)
                    del buf[:MAX_LINE]
                    continue
                break
            self._emit(bytes(buf[:nl]), stream)
            del buf[: nl + 1]

    def flush(self, stream: str) -> None:
        buf = self._partial.pop(stream, None)
        if buf:
            self._emit(bytes(buf), stream)

    def _allowed(self) -> bool:
        if self.rate <= 0 or self.label is None:
            return True
        now = time.monotonic()
        self._tokens = min(self._tokens + (now - self._refilled) * self.rate, self.rate * 10)
        self._refilled = now
        if self._tokens >= 1:
            self._tokens -= 1
            return True
        self.dropped += 1
        return False

    def _emit(self, line: bytes, stream: str) -> None:
        if not self._allowed():
            return
        # NUL is escaped like a byte that is not UTF-8: neither a log file nor PostgreSQL's
        # text (atlantis.logs) should get one.
        text = line.replace(b"\0", b"\\x00").decode("utf-8", errors="backslashreplace")
        text = text.rstrip("\r")
        extra: dict[str, object] = {"stream": stream, "child_pid": self.pid}
        label = self.label
        if label is not None:
            extra.update(job_id=label.job_id, run=label.run, attempt=label.attempt,
                         queue=label.queue)
            if self.sink is not None:
                self.sink(label, stream, text)
        out_log.info("%s %s", label.tag() if label else f"child={self.pid}", text, extra=extra)
