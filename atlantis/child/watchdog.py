"""The watchdog: reads the control pipe and enforces the lease on its own.

Control frames (``Run``, ``Cancel``, ``Stopping``) arrive on one pipe, read by one thread at
a time:

- between attempts the main thread reads it itself (:meth:`Watchdog.next_run`), so a
  ``Run`` starts with a single wake-up, not a hand-over between two threads;
- during an attempt the watchdog thread reads it: a ``Cancel`` or ``Stopping`` sets the
  attempt's :class:`~atlantis.context.AttemptFlags` (made with its ``Run``, read by the
  handler as ``ctx.cancelled`` and ``ctx.stopping``). It takes the pipe over once the
  attempt has run :data:`TAKEOVER` (a short attempt ends before that and costs the thread
  nothing), or at once when the lease ends before its next look.

The supervisor's renewals come only through the shared lease cell
(:mod:`atlantis.protocol.leasecell`), read whenever the known lease nears its end, so
they wake nobody.

If no renewal arrives before the lease's end minus a margin (the supervisor may be
paused, swapped out or wedged), the watchdog kills this process tree, so the attempt is
dead before any other worker may claim the row; a ``Run`` whose lease is already past
that point kills it before the handler starts. It is woken in time for that whatever
else it waits for. It kills the tree too, after its last words
(:func:`~atlantis.child.exits.last_words`), when:

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
import select
import threading
import time
from collections import deque
from typing import NoReturn

from atlantis.child.channel import identity
from atlantis.child.exits import last_words
from atlantis.child.text import describe
from atlantis.child.tree import kill_group
from atlantis.context import AttemptFlags
from atlantis.protocol.framing import MAX_FRAME, ProtocolError
from atlantis.protocol.leasecell import LeaseCell
from atlantis.protocol.messages import Cancel, EventReader, Run, Stopping

#: How often, at the least, the control pipe is checked to still be there.
CHECK_INTERVAL = 1.0
#: An attempt running this long has the watchdog thread reading the control pipe.
TAKEOVER = 0.25
#: Bytes read from the control pipe at a time (a smaller read needs no fresh mapping).
READ_SIZE = 65536
_POLL_BROKEN = select.POLLNVAL | select.POLLERR


class Watchdog(threading.Thread):
    def __init__(self, control_fd: int, cell: LeaseCell) -> None:
        super().__init__(name="atlantis-watchdog", daemon=True)
        self._fd = control_fd
        self._cell = cell
        self._identity = identity(control_fd)
        os.set_blocking(control_fd, False)
        # The main thread wakes the watchdog thread through this pipe, when it must look
        # sooner than it would on its own (a lease ending soon, a long attempt starting).
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._wake_ids = identity(self._wake_r), identity(self._wake_w)
        self._reader = EventReader(max_frame=MAX_FRAME, expect=(Run, Cancel, Stopping))
        self._runs: deque[tuple[Run, AttemptFlags]] = deque()
        self._lock = threading.Lock()  # the state below, and reading the pipe
        self._job_id: int | None = None
        self._flags: AttemptFlags | None = None  # the job_id's
        self._lease_end = math.inf
        self._margin = 0.0
        self._began: float | None = None  # monotonic start of the running attempt
        # One poll object per thread: CPython refuses concurrent calls on one.
        self._main_poller = select.poll()
        self._main_poller.register(self._fd, select.POLLIN | select.POLLHUP)
        self._idle_poller = select.poll()
        self._idle_poller.register(self._wake_r, select.POLLIN)
        self._busy_poller = select.poll()
        self._busy_poller.register(self._wake_r, select.POLLIN)
        self._busy_poller.register(self._fd, select.POLLIN | select.POLLHUP)

    # ---- the main thread -------------------------------------------------------------------

    def next_run(self) -> tuple[Run, AttemptFlags]:
        """Wait for the next ``Run``, reading the control pipe (main thread, between attempts);
        with it, the flags its ``Cancel`` and ``Stopping`` set, for the handler's context.

        Raises KeyboardInterrupt on SIGINT; ends the process as the watchdog thread would
        on EOF, a corrupt frame or a lost pipe.
        """
        while True:
            with self._lock:
                if self._runs:
                    return self._runs.popleft()
            events = self._main_poller.poll(int(CHECK_INTERVAL * 1000))
            self._check_pipe(events)
            if events:
                with self._lock:
                    self._read()

    def attempt_started(self) -> None:
        with self._lock:
            self._began = time.monotonic()
            if self._known_end() - self._margin <= self._began:
                # Nothing of a handler may run on a lease that is over (a supervisor that
                # was stalled, a Run that came late): another worker may have the row.
                self._halt("the lease had ended before the attempt could start")
            # Short attempts end before the thread would take the pipe over: leave it
            # asleep, unless the lease ends before its next look. Renewals come through
            # the lease cell, so a long attempt needs the thread on the pipe only for a
            # cancel or a drain, which can wait TAKEOVER.
            wake = self._known_end() - self._margin - self._began < CHECK_INTERVAL
        if wake:
            self._poke()

    def attempt_ended(self) -> None:
        with self._lock:
            self._began = None
            self._job_id = None
            self._flags = None
            self._lease_end = math.inf

    def _poke(self) -> None:
        try:
            if identity(self._wake_w) != self._wake_ids[1]:  # a handler closed it
                raise OSError(f"descriptor {self._wake_w} now refers to another file")
            os.write(self._wake_w, b"!")
        except BlockingIOError:  # already full of wake-ups
            pass
        except OSError as exc:
            self._lost(exc)

    def close(self) -> None:
        """Close the wake-up pipe of a watchdog that was never started (the zygote's
        rehearsal, :func:`atlantis.child.zygote.rehearse`)."""
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)

    # ---- the watchdog thread ---------------------------------------------------------------

    def run(self) -> None:
        try:
            self._serve()
        except BaseException as exc:  # without this thread no lease is enforced: stop all
            self._halt(f"the child's watchdog failed ({describe(exc)})")

    def _serve(self) -> None:
        while True:
            with self._lock:
                began = self._began
                stop_at = self._known_end() - self._margin
                now = time.monotonic()
                if now >= stop_at:
                    self._halt("no lease renewal reached this child before the lease's end")
                wait = min(CHECK_INTERVAL, stop_at - now)
                busy = began is not None and now - began >= TAKEOVER
                if not busy:  # the main thread has the pipe; look again at the takeover
                    wait = min(wait, TAKEOVER if began is None else began + TAKEOVER - now)
            poller = self._busy_poller if busy else self._idle_poller
            events = poller.poll(max(1, math.ceil(wait * 1000)))
            if busy and self._began is not None:  # else the main thread has the pipe
                self._check_pipe(events)
            for fd, _revents in events:
                if fd == self._wake_r:
                    self._drain_wake()
                elif fd == self._fd:
                    with self._lock:
                        if self._began is not None:  # else the pipe is the main thread's again
                            self._read()

    def _drain_wake(self) -> None:
        try:
            os.read(self._wake_r, 4096)
        except (BlockingIOError, InterruptedError):
            pass
        except OSError as exc:
            self._lost(exc)

    # ---- either thread ---------------------------------------------------------------------

    def _known_end(self) -> float:
        """The lease's end as the ``Run`` and the cell tell it (with the lock held). The cell
        counts only once a ``Run`` came: the supervisor sets it before writing one."""
        if self._job_id is not None:
            self._lease_end = max(self._lease_end, self._cell.get())
        return self._lease_end

    def _check_pipe(self, events: list[tuple[int, int]]) -> None:
        try:
            for fd, expected in ((self._fd, self._identity), (self._wake_r, self._wake_ids[0])):
                if identity(fd) != expected:
                    raise OSError(f"descriptor {fd} now refers to another file")
        except OSError as exc:
            self._lost(exc)
        if any(revents & _POLL_BROKEN for _fd, revents in events):
            self._lost(OSError(f"poll reports descriptor {self._fd} unusable"))

    def _read(self) -> None:
        """Read what the pipe holds and handle it (with the lock held)."""
        try:
            data = os.read(self._fd, READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._lost(exc)
        if not data:  # the supervisor is gone: nothing of ours may outlive it
            kill_group()
        try:
            messages = self._reader.feed(data)
        except ProtocolError as exc:
            self._halt(f"corrupt control stream ({exc})")
        for msg in messages:
            self._handle(msg)

    def _halt(self, why: str) -> NoReturn:
        last_words(self._cell, self._job_id, why)
        kill_group()

    def _lost(self, exc: OSError) -> NoReturn:
        self._halt(f"the child lost its control pipe ({exc})")

    def _handle(self, msg: object) -> None:
        if isinstance(msg, Run):
            self._job_id = msg.job_id
            self._flags = AttemptFlags()
            self._lease_end = msg.lease_end
            self._margin = msg.lease_margin
            self._runs.append((msg, self._flags))
        elif self._flags is None:  # no attempt since the last ended: nothing to cancel
            return
        elif isinstance(msg, Cancel) and msg.job_id == self._job_id:
            self._flags.cancelled = True
        elif isinstance(msg, Stopping) and msg.job_id == self._job_id:
            self._flags.stopping = True
