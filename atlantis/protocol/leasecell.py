"""The lease cell: one page the supervisor and a child share (a ``memfd`` the child maps).

Both ways, it carries what a pipe cannot carry well:

- **The lease's end**, supervisor to child. A frame on the control pipe would wake the
  child's watchdog thread, and the kernel charges that wake-up to the writer: with hundreds
  of long attempts renewed every heartbeat/3, writing renewal frames was most of what an
  otherwise idle supervisor did. So the supervisor writes each renewal into one shared
  double, and the watchdog reads it on its own timer, when its known lease nears its end.
  Frames carry only what must be heard at once: ``Run``, ``Cancel``, ``Stopping``.
- **The keeper's deadline**, supervisor to the lease keeper (:mod:`atlantis.keeper`): the
  time by which every process of the attempt must be dead, read by a process that runs no
  handler code, so that it holds while the child's own Python cannot run (a C call that
  holds the GIL) and the supervisor is stopped or gone.
- **The child's last words**, child to supervisor: why it stopped its attempt itself (its
  control or events pipe lost, no renewal in time, its watchdog failed...), just before it
  kills its tree or exits. The usual reasons are exactly those that leave the events pipe
  closed, replaced or full; the mapping outlives every descriptor a handler closes, and a
  store into it never blocks. The supervisor reads them once the child is gone, for the
  error of the crash.

The lease's protocol: the supervisor sets the cell to a ``Run``'s lease end before it
writes the ``Run`` (so the child can never read an older attempt's end for the new one),
then to every renewal's end while that attempt runs, and to 0 when the attempt ends on its
side; the keeper's deadline alongside, before the lease's end (both 0: no attempt). The child's watchdog takes the later of what the ``Run`` and the cell say, and only
while an attempt runs. An aligned 8-byte store or load is one instruction on the machines
Python runs on (x86-64, aarch64): a reader sees the old value or the new one, never a mix.
The value is a ``CLOCK_MONOTONIC`` time, as in ``Run``.

The last words: a 4-byte length, then that many bytes of UTF-8, stored in one copy (one
thread at a time: the copy holds the GIL); the last store wins.
"""

from __future__ import annotations

import mmap
import os
import struct

from atlantis.protocol.framing import clean

_DOUBLE = struct.Struct("d")  # native: one aligned 8-byte copy
_LENGTH = struct.Struct("I")
_KEEPER = _DOUBLE.size  # the keeper's deadline
_WORDS = 2 * _DOUBLE.size  # where the last words start: their length, then their bytes
SIZE = mmap.PAGESIZE
MAX_WORDS = SIZE - _WORDS - _LENGTH.size
"""Bytes of last words the cell holds; longer ones are cut (on a character's boundary)."""


class LeaseCell:
    """The shared page, mapped from the memfd ``fd`` (the descriptor may be closed after)."""

    def __init__(self, fd: int) -> None:
        self._map: mmap.mmap | None = mmap.mmap(fd, SIZE)

    @classmethod
    def create(cls) -> tuple[LeaseCell, int]:
        """A new cell holding 0, and the descriptor to hand to the child (close-on-exec)."""
        fd = os.memfd_create("atlantis-lease", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, SIZE)
            return cls(fd), fd
        except BaseException:
            os.close(fd)
            raise

    def set(self, lease_end: float, kill_by: float | None = None) -> None:
        """The lease's end for the child, and the keeper's deadline (``kill_by``, the lease's
        end when not given). The deadline is written first: a keeper never reads a renewed
        lease's deadline as anything earlier than it was."""
        if self._map is not None:
            _DOUBLE.pack_into(self._map, _KEEPER, lease_end if kill_by is None else kill_by)
            _DOUBLE.pack_into(self._map, 0, lease_end)

    def get(self) -> float:
        return float(_DOUBLE.unpack_from(self._map, 0)[0]) if self._map is not None else 0.0

    def kill_by(self) -> float:
        """The keeper's side: when every process of the running attempt must be dead; 0
        when no attempt runs."""
        return float(_DOUBLE.unpack_from(self._map, _KEEPER)[0]) if self._map is not None else 0.0

    def said(self) -> bool:
        """Whether last words were stored already (the keeper adds none then)."""
        return self._map is not None and _LENGTH.unpack_from(self._map, _WORDS)[0] > 0

    def set_last_words(self, why: str) -> None:
        """The child's side: why it stops its attempt itself. Never raises, never blocks."""
        try:
            data = why.encode("utf-8", "backslashreplace")[:MAX_WORDS]
            data = data.decode("utf-8", "ignore").encode("utf-8")  # a character cut in two
            if self._map is not None:
                self._map[_WORDS:_WORDS + _LENGTH.size + len(data)] = _LENGTH.pack(len(data)) + data
        except Exception:  # words are a courtesy: the caller goes on to stop the attempt
            pass

    def last_words(self) -> str:
        """The supervisor's side, once the child is gone: what it said, or ""."""
        if self._map is None:
            return ""
        (size,) = _LENGTH.unpack_from(self._map, _WORDS)
        start = _WORDS + _LENGTH.size
        data = self._map[start:start + min(size, MAX_WORDS)]
        return clean(data.decode("utf-8", "backslashreplace"))  # the child's memory: anything

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None
