"""The lease cell: the end of a child's lease, in memory the supervisor and the child share.

A ``Lease`` frame on the control pipe wakes the child's watchdog thread, and the kernel
charges that wake-up to the writer: with hundreds of long attempts renewed every
heartbeat/3, writing those frames was most of what an otherwise idle supervisor did. So
the supervisor writes each renewal into one shared double instead (``memfd``, one page
per child), and the watchdog reads it on its own timer, when its known lease nears its
end. Frames still carry what must be heard at once: ``Run``, ``Cancel``, ``Stopping``.

The protocol: the supervisor sets the cell to a ``Run``'s lease end before it writes the
``Run`` (so the child can never read an older attempt's end for the new one), then to
every renewal's end while that attempt runs, and to 0 when the attempt ends on its side.
The child's watchdog takes the later of what the frames and the cell say, and only while
an attempt runs. An aligned 8-byte store or load is one instruction on the machines
Python runs on (x86-64, aarch64): a reader sees the old value or the new one, never a mix.
The value is a ``CLOCK_MONOTONIC`` time, as in ``Run`` and ``Lease``.
"""

from __future__ import annotations

import mmap
import os
import struct

_DOUBLE = struct.Struct("d")  # native: one aligned 8-byte copy
SIZE = _DOUBLE.size


class LeaseCell:
    """One shared double, mapped from the memfd ``fd`` (the descriptor may be closed after)."""

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

    def set(self, lease_end: float) -> None:
        if self._map is not None:
            _DOUBLE.pack_into(self._map, 0, lease_end)

    def get(self) -> float:
        return float(_DOUBLE.unpack_from(self._map, 0)[0]) if self._map is not None else 0.0

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None
