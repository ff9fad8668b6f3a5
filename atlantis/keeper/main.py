"""The lease keeper: the lease's end enforced by a process that runs no handler code.

The child's own watchdog is Python: while the handler sits in one long C call that holds
the GIL (``decimal`` at 20,000 digits, a ``list.sort`` of plain values, many C extensions),
neither it nor the parent-death handler can run, and a supervisor that is stopped (SIGSTOP,
a paused VM) or killed renews nothing. The keeper is the floor under both: one small
process per supervisor, in a session of its own (a SIGSTOP or SIGKILL of the supervisor's
process group does not reach it), which imports neither the app nor a database driver.

Protocol (SOCK_SEQPACKET): the keeper says ``ready`` once it serves; then each packet from
the supervisor is ``watch PID`` and
carries exactly two descriptors, a pidfd of the child that runs attempts and its lease cell
(:mod:`atlantis.protocol.leasecell`). The keeper reads each cell's deadline (``kill_by``,
written by the supervisor before every ``Run`` and with every renewal; 0 while no attempt
runs) and, once the monotonic clock reaches it, stops that child's whole tree
(:func:`atlantis.child.tree.freeze`: ``setsid`` grandchildren and daemons re-parented to
the child included, nothing able to fork meanwhile) and kills it, after writing in the
cell why, for the supervisor's record of the crash. It looks at the cells at the earliest
deadline and at least every :data:`LOOK_EVERY` (a new attempt's deadline is at least a
heartbeat minus its margin away).

At EOF on its socket the supervisor is gone: nobody can renew or record anything of the
attempts in flight, so the keeper kills every tree it watches at once and exits. A
malformed packet is dropped (its descriptors closed) and logged; SIGTERM, SIGINT and
SIGHUP are ignored (a ``KillMode=control-group`` stop sends SIGTERM to every process: the
keeper leaves when its supervisor has).
"""

from __future__ import annotations

import argparse
import math
import os
import select
import signal
import socket
import sys
import time
from dataclasses import dataclass

from atlantis.child.tree import freeze
from atlantis.protocol.leasecell import LeaseCell

#: How often, at the least, the keeper reads the cells it watches.
LOOK_EVERY = 0.05
#: Why the keeper ended an attempt, as the supervisor records it.
WHY_LEASE = ("the lease keeper killed the attempt: no lease renewal reached it before its "
             "lease's end (the supervisor stopped, stalled or gone, or the handler held the "
             "interpreter in one long C call)")
WHY_GONE = "the lease keeper killed the attempt: its supervisor is gone"
_POLL_IN = select.POLLIN | select.POLLHUP | select.POLLERR


def _log(text: str) -> None:
    try:
        sys.stderr.write(f"atlantis-keeper[{os.getpid()}]: {text}\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # nobody left to read it
        pass


@dataclass(eq=False)
class Watched:
    pid: int
    pidfd: int
    cell: LeaseCell
    ended: bool = False


def end_tree(w: Watched, why: str) -> None:
    """Stop and kill ``w``'s whole tree (once); a child that has exited is left alone."""
    if w.ended:
        return
    w.ended = True
    try:
        signal.pidfd_send_signal(w.pidfd, signal.SIGSTOP)
    except OSError:  # gone (or a zombie): nothing of it runs, and its pid may be reused
        return
    if not w.cell.said():
        w.cell.set_last_words(why)
    stopped = freeze(w.pid)
    try:
        signal.pidfd_send_signal(w.pidfd, signal.SIGKILL)
    except OSError:
        pass
    try:
        os.killpg(w.pid, signal.SIGKILL)  # it leads its group: what is left in it
    except OSError:
        pass
    for pid in stopped:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


class Keeper:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.watched: dict[int, Watched] = {}  # by pidfd
        self.poller = select.poll()
        self.poller.register(sock.fileno(), _POLL_IN)

    def serve(self) -> None:
        while True:
            now = time.monotonic()
            soonest = math.inf
            for w in list(self.watched.values()):
                kill_by = w.cell.kill_by()
                if kill_by <= 0 or w.ended:
                    continue
                if now >= kill_by:
                    end_tree(w, WHY_LEASE)
                    _log(f"child {w.pid}: no lease renewal before its deadline; killed its tree")
                else:
                    soonest = min(soonest, kill_by)
            wait = min(LOOK_EVERY, max(soonest - time.monotonic(), 0.0))
            for fd, _events in self.poller.poll(math.ceil(wait * 1000)):
                if fd == self.sock.fileno():
                    if not self._receive():
                        self._supervisor_gone()
                        return
                else:
                    self._forget(fd)

    def _receive(self) -> bool:
        """Take one packet; False at EOF (or an error: the socket is all the keeper has)."""
        try:
            data, fds, _flags, _addr = socket.recv_fds(self.sock, 64, 2)
        except InterruptedError:
            return True
        except OSError as exc:
            _log(f"lost its socket ({exc})")
            return False
        if not data and not fds:
            return False
        parts = data.split()
        if len(fds) != 2 or len(parts) != 2 or parts[0] != b"watch" or not parts[1].isdigit():
            _log(f"dropped a malformed packet ({len(data)} bytes, {len(fds)} descriptors)")
            for fd in fds:
                os.close(fd)
            return True
        pidfd, cell_fd = fds
        try:
            cell = LeaseCell(cell_fd)
        except (OSError, ValueError) as exc:
            _log(f"dropped a packet whose lease cell cannot be mapped ({exc})")
            os.close(pidfd)
            return True
        finally:
            os.close(cell_fd)
        self.watched[pidfd] = Watched(int(parts[1]), pidfd, cell)
        self.poller.register(pidfd, select.POLLIN)  # readable once the process has exited
        return True

    def _forget(self, pidfd: int) -> None:
        w = self.watched.pop(pidfd, None)
        self.poller.unregister(pidfd)
        os.close(pidfd)
        if w is not None:
            w.cell.close()

    def _supervisor_gone(self) -> None:
        for w in self.watched.values():
            end_tree(w, WHY_GONE)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="atlantis-keeper")
    parser.add_argument("--socket-fd", type=int, required=True)
    opts = parser.parse_args(argv)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    os.set_inheritable(opts.socket_fd, False)
    sock = socket.socket(fileno=opts.socket_fd)
    try:
        keeper = Keeper(sock)
        try:
            sock.send(b"ready")
        except OSError:  # the supervisor is gone already: nothing was handed over yet
            return 0
        keeper.serve()
    except BaseException as exc:  # pragma: no cover - a bug: say so; the supervisor restarts it
        _log(f"failed: {type(exc).__name__}: {exc}")
        return 1
    return 0
