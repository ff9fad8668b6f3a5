"""The supervisor's side of the lease keeper (:mod:`atlantis.keeper`): start it, hand it
each child, start it again if it dies.

The keeper is the one process that ends an attempt whose lease runs out while neither the
child's watchdog nor the supervisor can act (a C call holding the child's GIL; the
supervisor stopped or killed). It starts in a session of its own, so that a signal to the
supervisor's process group does not reach it, and is handed each child once, with a pidfd
(no pid-reuse race) and a duplicate of the child's lease cell, whose deadline the
supervisor writes (:meth:`atlantis.supervisor.children.Child.set_lease`). Nothing here
waits: a packet that cannot be sent now is logged and the child stays covered by its own
watchdog, as before the keeper existed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterable

from atlantis.supervisor import identity

log = logging.getLogger("atlantis.supervisor")

#: A keeper that dies is started again after this long at the least (a crash loop costs little).
RESTART_AFTER = 1.0


class LeaseKeeper:
    def __init__(self, loop: asyncio.AbstractEventLoop, env: dict[str, str],
                 children: Callable[[], Iterable[tuple[int, int]]]) -> None:
        """``children``: the ``(pid, lease cell descriptor)`` of every live child, handed
        to a keeper started again."""
        self.loop = loop
        self.env = env
        self._children = children
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._pidfd = -1
        self._closed = False
        self.starts = 0
        self.ready = False
        """Whether the keeper said it serves (what was handed to it before waits in its socket)."""

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self) -> None:
        if self._closed or self._sock is not None:
            return
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "atlantis.keeper", "--socket-fd", str(theirs.fileno())],
                pass_fds=(theirs.fileno(), *identity.inherited()), stdin=subprocess.DEVNULL,
                start_new_session=True, env=self.env,
            )
        except OSError as exc:
            ours.close()
            log.error("could not start the lease keeper (%s); next try in %.0fs", exc,
                      RESTART_AFTER)
            self.loop.call_later(RESTART_AFTER, self.start)
            return
        finally:
            theirs.close()
        self.starts += 1
        ours.setblocking(False)
        self._sock = ours
        self.ready = False
        self.loop.add_reader(ours.fileno(), self._read)
        self._pidfd = os.pidfd_open(self._proc.pid)
        self.loop.add_reader(self._pidfd, self._exited)
        for pid, cell_fd in self._children():
            self.watch(pid, cell_fd)

    def watch(self, pid: int, cell_fd: int) -> None:
        """Hand the keeper the child ``pid`` and its lease cell (the descriptors are sent as
        duplicates: the caller keeps its own)."""
        if self._sock is None or pid <= 0:
            return
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:  # already gone: nothing of it to keep
            return
        try:
            socket.send_fds(self._sock, [b"watch %d" % pid], [pidfd, cell_fd])
        except OSError as exc:  # full (a keeper that stopped reading) or gone: its exit says
            log.error("could not hand child %d to the lease keeper (%s); its own watchdog "
                      "still enforces its lease", pid, exc)
        finally:
            os.close(pidfd)

    def _read(self) -> None:
        """The keeper's only word: ``ready``. Anything else, or EOF, waits for its exit."""
        if self._sock is None:
            return
        try:
            data = self._sock.recv(64)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data == b"ready" and not self.ready:
            self.ready = True
            log.info("the lease keeper (pid %s) is watching %d children", self.pid,
                     sum(1 for _ in self._children()))
        elif not data:
            self.loop.remove_reader(self._sock.fileno())

    def _close_socket(self) -> None:
        if self._sock is not None:
            self.loop.remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None

    def _exited(self) -> None:
        self.loop.remove_reader(self._pidfd)
        os.close(self._pidfd)
        self._pidfd = -1
        code = self._proc.wait() if self._proc is not None else None
        self._close_socket()
        if self._closed:
            return
        log.error("the lease keeper exited (code %s); starting another in %.0fs", code,
                  RESTART_AFTER)
        self.loop.call_later(RESTART_AFTER, self.start)

    def close(self) -> None:
        """Stop: EOF on its socket ends the keeper (after it kills any tree still handed to
        it, which a clean stop leaves none of)."""
        self._closed = True
        self._close_socket()
