"""The events pipe, child -> supervisor: typed messages, each one whole frame.

The main thread sends ``Ready`` and ``Done``; checkpoints come from whichever thread the
handler calls ``ctx.checkpoint`` in, hence the lock. A message that cannot be encoded
never reaches the pipe: a ``Done`` is replaced by a plain failure saying so, a checkpoint
is dropped (the caller gets the error). A pipe that can no longer be written (the handler
closed the descriptor, the supervisor went away, the descriptor now names another file)
ends the child at once with :data:`~atlantis.child.exits.EXIT_PROTOCOL` after its last
words (:func:`~atlantis.child.exits.last_words`): nothing it could do next would be reported.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from typing import NoReturn

from atlantis.child.exits import EXIT_PROTOCOL, TermSignal, exit_now, last_words
from atlantis.child.text import describe, text_of
from atlantis.child.tree import kill_descendants
from atlantis.protocol.framing import HEADER
from atlantis.protocol.leasecell import LeaseCell
from atlantis.protocol.messages import (
    MAX_EVENT_FRAME,
    ChildError,
    Done,
    FromChild,
    encode,
)


def identity(fd: int) -> tuple[int, int]:
    """What ``fd`` refers to (device, inode); OSError if it is closed."""
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def _frame(msg: FromChild) -> bytes | None:
    """The message's frame; None if it is too large for the supervisor to take it."""
    data = encode(msg)
    return data if len(data) - HEADER.size <= MAX_EVENT_FRAME else None


class Channel:
    """Writes frames to the events pipe; ``cell`` takes its last words should it be lost."""

    def __init__(self, fd: int, term: TermSignal | None = None,
                 cell: LeaseCell | None = None) -> None:
        self._fd = fd
        self._lock = threading.Lock()
        self._term = term
        self._cell = cell
        self._identity = identity(fd)
        self.job_id: int | None = None
        """The attempt running now, for the last words should the pipe be lost."""

    def send(self, msg: FromChild) -> None:
        """Encode and write one message; raises what keeps it from being encoded."""
        data = _frame(msg)
        if data is None:
            raise ValueError(f"the frame would exceed {MAX_EVENT_FRAME} bytes")
        self._write(data)

    def send_done(self, done: Done) -> None:
        """Send an attempt's result; never raises (but may end the process).

        Should the result not fit a frame, the handler's spans go first (``Done.spans``),
        then its traceback; should it still not encode, a plain failure saying why is sent
        instead.
        """
        try:
            data = _frame(done)
            if data is None and done.spans is not None:
                done = dataclasses.replace(done, spans=None)
                data = _frame(done)
            if data is None and done.error is not None and done.error.traceback:
                data = _frame(dataclasses.replace(
                    done, error=dataclasses.replace(done.error, traceback=None)))
            if data is None:
                raise ValueError(f"the frame would exceed {MAX_EVENT_FRAME} bytes")
        except Exception as exc:
            why = text_of(describe(exc))[:1000]
            data = encode(Done(job_id=done.job_id, outcome="failed", error=ChildError(
                kind="exception", message=f"<the result could not be encoded: {why}>")))
        self._write(data)

    def _write(self, data: bytes) -> None:
        if self._term is not None:
            self._term.begin_write()
        try:
            with self._lock:
                try:
                    if identity(self._fd) != self._identity:
                        raise OSError(f"descriptor {self._fd} now refers to another file")
                    view = memoryview(data)
                    while view:
                        view = view[os.write(self._fd, view):]
                except OSError as exc:
                    self._lost(exc)
        finally:
            if self._term is not None:
                self._term.end_write()

    def _lost(self, exc: OSError) -> NoReturn:
        last_words(self._cell, self.job_id, f"the child lost its events pipe ({text_of(exc)})",
                   f"stopping the attempt and exiting with code {EXIT_PROTOCOL}")
        try:
            kill_descendants()
        finally:
            exit_now(EXIT_PROTOCOL)
