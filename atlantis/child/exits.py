"""How the child ends: its exit codes, SIGTERM, and its last words.

When the child stops an attempt itself (the table's 4 and -9), it first says why: in the
lease cell, where the supervisor reads it for the error of the crash
(:meth:`~atlantis.protocol.leasecell.LeaseCell.last_words`), and in a line on stderr for
people, ``atlantis: job=N: <why>; stopping the attempt``.

Exit statuses of a child (``Popen.returncode`` as the supervisor sees them):

====  ==========================================================================================
0     a clean end: the control pipe's owner asked for it (SIGTERM during an attempt, after
      its ``Done``), or leftover work of the last attempt made the process unusable
1     the parent died before the parent-death signal was armed; or a zygote worker whose
      serving loop failed unexpectedly
3     :data:`EXIT_APP_ERROR`: the app could not be loaded (a ``Fatal`` message says why)
4     :data:`EXIT_PROTOCOL`: the events pipe is unusable (closed by the handler, EPIPE, or its
      descriptor now names another file); nothing more can be reported, so the child stops
      its descendants and leaves, after its last words
-9    killed by its own SIGKILL sweep (:func:`atlantis.child.tree.kill_group`): no lease
      renewal in time, the control pipe lost, corrupt or at EOF, the parent died, or the
      watchdog thread failed; its last words say which (except at EOF: nobody is left to
      read them)
-15   SIGTERM between attempts
====  ==========================================================================================
"""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
from types import FrameType
from typing import NoReturn

from atlantis.protocol.leasecell import LeaseCell

EXIT_ORPHANED = 1
EXIT_APP_ERROR = 3
EXIT_PROTOCOL = 4


class Terminated(BaseException):
    """SIGTERM reached the attempt (timeout, cancel or drain); lets ``finally`` blocks run."""


class TermSignal:
    """The SIGTERM handler of an attempt: raises :class:`Terminated` in the handler, once.

    Armed while the handler runs. A signal that arrives while the main thread writes a
    frame is held until the frame is whole (a frame cut in two would corrupt the events
    stream); one that arrives while disarmed (after the handler returned) is only noted,
    so the attempt's ``Done`` still goes out, and the child then leaves (``received``).
    """

    def __init__(self) -> None:
        self.armed = False
        self.received = False
        self.idle = False
        """Between attempts: SIGTERM then ends the process as its default action would."""
        self._writing = 0

    def reset(self) -> None:
        self.armed = False
        self.received = False
        self.idle = False
        self._writing = 0

    def arm(self) -> None:
        """Arm it as the handler starts; a SIGTERM that came before is raised now."""
        self.armed = True
        if self.received:
            self.armed = False
            raise Terminated()

    def handler(self, signum: int, frame: FrameType | None) -> None:
        if self.idle:  # installed for good: cheaper than swapping handlers every attempt
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        self.received = True
        if self.armed and not self._writing:
            self.armed = False
            raise Terminated()

    def begin_write(self) -> None:
        if threading.current_thread() is threading.main_thread():
            self._writing += 1

    def end_write(self) -> None:
        """End a write; raises the SIGTERM that was held back meanwhile, if any."""
        if threading.current_thread() is not threading.main_thread():
            return
        self._writing = max(0, self._writing - 1)
        if not self._writing and self.received and self.armed:
            self.armed = False
            raise Terminated()


def flush_output() -> None:
    """Flush the handler's buffered output, from the main thread only.

    Another thread must not wait for ``sys.stderr``'s lock: the main thread may hold it,
    blocked writing to a pipe that a wedged supervisor does not read.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # a handler may have replaced them with anything
            pass


def say(line: str) -> None:
    """Write one line to stderr, if it still can, without ever blocking for long.

    Written to fd 2 whatever became of ``sys.stderr``, through a non-blocking descriptor of
    its own (``/proc/self/fd/2`` opened anew): when the pipe is full (a chatty handler, a
    wedged supervisor) the line is lost rather than keeping the caller from killing the
    tree next.
    """
    flush_output()  # the handler's own output first
    data = (line.rstrip("\n") + "\n").encode("utf-8", "backslashreplace")
    try:
        fd = os.open("/proc/self/fd/2", os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:  # no /proc, or not a pipe or file: wait a little for room on fd 2
        fd = -1
    try:
        if fd < 0:
            poller = select.poll()
            poller.register(2, select.POLLOUT)
            if not poller.poll(100):
                return
        os.write(2 if fd < 0 else fd, data[:select.PIPE_BUF])  # one write: no interleaving
    except OSError:
        pass
    finally:
        if fd >= 0:
            os.close(fd)


def last_words(cell: LeaseCell | None, job: int | None, why: str,
               then: str = "stopping the attempt") -> None:
    """Say why this child stops its attempt itself: to the supervisor through ``cell``
    first (that never blocks), then on stderr (``atlantis: job=N: <why>; <then>``)."""
    if cell is not None:
        cell.set_last_words(why)
    say(f"atlantis: job={'-' if job is None else job}: {why}; {then}")


def exit_now(code: int) -> NoReturn:
    """Exit without waiting for threads, output flushed first (from the main thread)."""
    flush_output()
    os._exit(code)
