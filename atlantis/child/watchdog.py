"""The watchdog thread: owns the control pipe and enforces the lease on its own.

It reads typed control frames (``Run``, ``Lease``, ``Cancel``), hands runs to the main
thread and marks the running attempt cancelled. If no renewal arrives before the lease's
end minus a margin (the supervisor may be paused, swapped out or wedged), it kills this
process tree, so the attempt is dead before any other worker may claim the row. It kills
the tree too, after a line on stderr, when:

- the control pipe reaches EOF (the supervisor died; quietly, nobody is left to read it);
- a control frame is malformed ("corrupt control stream");
- the control pipe is lost: reading it fails for any reason but EAGAIN/EINTR, or its
  descriptor was closed or now names another file (a handler that ran
  ``os.closerange(3, 65536)``); it is checked at least once a second;
- the thread itself fails of anything unexpected: without it, no lease would be enforced.
"""

from __future__ import annotations

import math
import os
import queue
import select
import threading
import time
from typing import NoReturn

from atlantis.child.channel import identity
from atlantis.child.exits import say
from atlantis.child.text import describe
from atlantis.child.tree import kill_group
from atlantis.context import JobContext
from atlantis.protocol.framing import MAX_FRAME, ProtocolError
from atlantis.protocol.messages import Cancel, EventReader, Lease, Run, Stopping

#: How often, at the least, the watchdog checks that its control pipe is still there.
CHECK_INTERVAL = 1.0
_POLL_BROKEN = select.POLLNVAL | select.POLLERR


class Watchdog(threading.Thread):
    def __init__(self, control_fd: int) -> None:
        super().__init__(name="atlantis-watchdog", daemon=True)
        self._fd = control_fd
        self._identity = identity(control_fd)
        self._reader = EventReader(max_frame=MAX_FRAME, expect=(Run, Lease, Cancel, Stopping))
        self.runs: queue.Queue[Run] = queue.Queue()
        self._lock = threading.Lock()
        self._job_id: int | None = None
        self._lease_end = math.inf
        self._margin = 0.0
        self._cancelled: int | None = None
        self._stopping: int | None = None
        self.ctx: JobContext | None = None

    def attempt_started(self, ctx: JobContext) -> None:
        with self._lock:
            self.ctx = ctx
            if self._cancelled == ctx.job_id:  # a cancel that came before the handler started
                ctx._cancelled = True
            if self._stopping == ctx.job_id:
                ctx._stopping = True

    def attempt_ended(self) -> None:
        with self._lock:
            self._job_id = None
            self._lease_end = math.inf
            self._cancelled = None
            self._stopping = None
            self.ctx = None

    def run(self) -> None:
        try:
            self._serve()
        except BaseException as exc:  # without this thread no lease is enforced: stop all
            self._stop(f"the child's watchdog failed ({describe(exc)})")

    def _stop(self, why: str) -> NoReturn:
        job = "-" if self._job_id is None else self._job_id
        say(f"atlantis: job={job}: {why}; stopping the attempt")
        kill_group()

    def _serve(self) -> None:
        os.set_blocking(self._fd, False)
        poller = select.poll()
        poller.register(self._fd, select.POLLIN | select.POLLHUP)
        while True:
            with self._lock:
                stop_at = self._lease_end - self._margin
            wait = stop_at - time.monotonic()
            if wait <= 0:
                self._stop("no lease renewal reached this child before the lease's end")
            timeout_ms = max(1, int(min(wait, CHECK_INTERVAL) * 1000))
            events = poller.poll(timeout_ms)
            try:
                if identity(self._fd) != self._identity:
                    raise OSError(f"descriptor {self._fd} now refers to another file")
            except OSError as exc:
                self._lost(exc)
            if not events:
                continue
            if any(revents & _POLL_BROKEN for _fd, revents in events):
                self._lost(OSError(f"poll reports descriptor {self._fd} unusable"))
            try:
                data = os.read(self._fd, 1 << 20)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError as exc:
                self._lost(exc)
            if not data:  # the supervisor is gone: nothing of ours may outlive it
                kill_group()
            try:
                messages = self._reader.feed(data)
            except ProtocolError as exc:
                self._stop(f"corrupt control stream ({exc})")
            for msg in messages:
                self._handle(msg)

    def _lost(self, exc: OSError) -> NoReturn:
        self._stop(f"the child lost its control pipe ({exc})")

    def _handle(self, msg: object) -> None:
        with self._lock:
            if isinstance(msg, Run):
                self._job_id = msg.job_id
                self._lease_end = msg.lease_end
                self._margin = msg.lease_margin
                self._cancelled = None
                self._stopping = None
                self.runs.put(msg)
            elif isinstance(msg, Lease) and msg.job_id == self._job_id:
                self._lease_end = max(self._lease_end, msg.lease_end)
            elif isinstance(msg, Cancel) and msg.job_id == self._job_id:
                self._cancelled = msg.job_id
                if self.ctx is not None and self.ctx.job_id == msg.job_id:
                    self.ctx._cancelled = True
            elif isinstance(msg, Stopping) and msg.job_id == self._job_id:
                self._stopping = msg.job_id
                if self.ctx is not None and self.ctx.job_id == msg.job_id:
                    self.ctx._stopping = True
