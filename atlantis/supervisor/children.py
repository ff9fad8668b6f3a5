"""Child processes as the supervisor sees them: start, talk, watch, kill.

Each child leads its own session and process group, so a kill reaches the whole group;
a psutil sweep then catches descendants that left the group with ``setsid`` (the child is
a subreaper, so even daemonized ones stay its descendants), and a child that dies
mid-attempt has whatever escaped found by the mark it puts in their environment. Exit is
watched through a pidfd (no pid-reuse race) or reported by the zygote that forked it.

Nothing here blocks the event loop: every pipe is non-blocking. Control frames that a slow
child does not read yet wait in a buffer (lease renewals go through a shared lease cell,
not the pipe);
events are read continuously, each frame capped and validated (:mod:`messages`), so a
chatty or hostile child can neither fill a pipe nor feed the supervisor a bad message: a
protocol violation is reported to the owner, which kills the child and fails its attempt.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import psutil

from atlantis.child.tree import count_tasks, freeze, processes_under, resident, walk
from atlantis.environ import TREE as TREE_VARIABLE
from atlantis.protocol.framing import ProtocolError
from atlantis.protocol.leasecell import LeaseCell
from atlantis.protocol.messages import (
    Checkpoint,
    Done,
    EventReader,
    Fatal,
    FromChild,
    Ready,
    ToChild,
    encode,
)
from atlantis.supervisor.output import Label, OutputLog
from atlantis.supervisor.policy import keeper_margin

log = logging.getLogger("atlantis.supervisor")

MAX_PENDING_CONTROL = 4 << 20
"""Control bytes a child may leave unread before it counts as wedged (its lease ends it)."""


def read_ready(loop: asyncio.AbstractEventLoop, fd: int) -> bytes | None:
    """What the non-blocking ``fd`` holds now: b"" if nothing yet; None once it is closed
    (end of file, or an error), and then it is no longer watched by ``loop``.

    64 KiB at most: a larger buffer is a fresh mapping of memory on every read."""
    try:
        data = os.read(fd, 1 << 16)
    except BlockingIOError:
        return b""
    except OSError:
        data = b""
    if not data:
        loop.remove_reader(fd)
        return None
    return data


class Owner(Protocol):
    def on_message(self, child: Child, msg: FromChild) -> None: ...
    def on_protocol_error(self, child: Child, why: str) -> None: ...
    def on_exit(self, child: Child) -> None: ...


class Forker(Protocol):
    """Forks worker processes from a warm zygote (``--isolation fresh``), asynchronously."""

    def fork(self, fds: tuple[int, int, int, int, int], on_forked: Callable[[int], None],
             on_exit: Callable[[int], None]) -> None: ...


@dataclass(eq=False)
class Child:
    loop: asyncio.AbstractEventLoop
    owner: Owner
    generation: int
    """Which SIGHUP generation started this child."""
    control_fd: int
    events_fd: int
    out_fd: int
    err_fd: int
    output: OutputLog
    lease_cell: LeaseCell
    """The lease's end for the child; its last words for us (:mod:`atlantis.protocol.leasecell`)."""
    cell_fd: int = -1
    """The cell's descriptor, kept to hand the cell to a lease keeper started again."""
    pid: int = 0
    """0 until a zygote has forked it."""
    returncode: int | None = None
    """As ``Popen.returncode``: the exit code, or minus the signal that killed it."""
    state: str = "starting"  # starting, idle, busy, retiring, dead
    label: Label | None = None
    jobs_run: int = 0
    jobs: frozenset[str] | None = None
    """The jobs it has a handler for, as its Ready said (None until then)."""
    tree: str | None = None
    """The mark (``ATLANTIS_TREE``) in the environment of every process the child starts."""
    descendants: set[psutil.Process] = field(default_factory=set)
    """Descendants seen so far, kept as psutil handles: signalling one checks that its pid
    was not reused meanwhile, so a long-gone grandchild's number never hits a stranger."""
    reader: EventReader = field(default_factory=EventReader)
    last_rss: int = 0
    """What :meth:`rss` last found."""
    rss_read: int = 0
    """How many times :meth:`rss` was read."""
    tasks_recount_at: int = 0
    """The host's count of tasks created (:func:`~atlantis.child.tree.tasks_created`) from
    which this child's tree may have grown past the task limit: not counted again before."""
    _pending: deque[memoryview] = field(default_factory=deque)
    _pending_bytes: int = 0
    _watching_writes: bool = False
    _violated: bool = False

    # ---- control pipe (supervisor -> child) ---------------------------------------------

    def set_lease(self, lease_end: float, heartbeat: float) -> None:
        """Tell the child its attempt's lease now ends at ``lease_end`` (monotonic), and the
        lease keeper when to kill the attempt if no renewal comes, through the shared cell:
        no frame, no wake-up."""
        self.lease_cell.set(lease_end, lease_end - keeper_margin(heartbeat))

    def last_words(self) -> str:
        """Why the child stopped itself, if it did (it writes that in its lease cell before
        it goes: the cell outlives its pipes); empty otherwise."""
        return self.lease_cell.last_words()

    def clear_lease(self) -> None:
        """The attempt ended on the supervisor's side: its lease is nothing to the child now."""
        self.lease_cell.set(0.0)

    def send(self, msg: ToChild) -> bool:
        """Queue a control message; False when the child is gone or wedged."""
        if self.control_fd < 0:
            return False
        data = memoryview(encode(msg))
        if self._pending_bytes + len(data) > MAX_PENDING_CONTROL:
            return False
        self._pending.append(data)
        self._pending_bytes += len(data)
        self._flush_control()
        return True

    def _flush_control(self) -> None:
        while self._pending and self.control_fd >= 0:
            data = self._pending[0]
            try:
                n = os.write(self.control_fd, data)
            except BlockingIOError:
                n = 0
            except OSError:  # the child is gone; its exit is handled elsewhere
                self._pending.clear()
                self._pending_bytes = 0
                break
            self._pending_bytes -= n
            if n < len(data):
                self._pending[0] = data[n:]
                if not self._watching_writes:
                    self.loop.add_writer(self.control_fd, self._flush_control)
                    self._watching_writes = True
                return
            self._pending.popleft()
        if self._watching_writes and self.control_fd >= 0:
            self.loop.remove_writer(self.control_fd)
        self._watching_writes = False

    def close_control(self) -> None:
        """EOF on the control pipe tells the child to exit (once what is queued went out)."""
        if self.control_fd >= 0:
            if self._watching_writes:
                self.loop.remove_writer(self.control_fd)
                self._watching_writes = False
            os.close(self.control_fd)
            self.control_fd = -1
            self._pending.clear()
            self._pending_bytes = 0

    # ---- events and output (child -> supervisor) ----------------------------------------

    def _read_events(self) -> None:
        data = read_ready(self.loop, self.events_fd)
        if data:
            self._feed_events(data)

    def _feed_events(self, data: bytes) -> None:
        if self._violated:
            return
        try:
            messages = self.reader.feed(data)
        except ProtocolError as exc:
            self._violated = True
            self.loop.remove_reader(self.events_fd)
            self.owner.on_protocol_error(self, str(exc))
            return
        for msg in messages:
            assert isinstance(msg, Ready | Fatal | Checkpoint | Done)  # EventReader's expect
            if isinstance(msg, Ready):
                self.tree = msg.tree or None
                if msg.jobs is not None:
                    self.jobs = frozenset(j for j in msg.jobs.split("\n") if j)
            elif isinstance(msg, Done):
                # The handler's last output was written before its result: log it while the
                # attempt is still the child's, an unfinished last line included.
                self._drain_output()
            self.owner.on_message(self, msg)
            if self._violated:
                return

    def violated(self) -> None:
        """The owner found a message invalid: read nothing more from this child."""
        self._violated = True

    def _read_output(self, fd: int, stream: str) -> None:
        data = read_ready(self.loop, fd)
        if data is None:
            self.output.flush(stream)
        elif data:
            self.output.feed(data, stream)

    def _drain_output(self, limit: int = 4 << 20) -> None:
        """Log what the output pipes hold now. Bounded: a leftover may still be writing."""
        for fd, stream in ((self.out_fd, "stdout"), (self.err_fd, "stderr")):
            budget = limit
            while budget > 0:
                try:
                    data = os.read(fd, 1 << 16)
                except OSError:
                    break
                if not data:
                    break
                budget -= len(data)
                self.output.feed(data, stream)
            self.output.flush(stream)

    def exited(self, code: int) -> None:
        # What the child wrote before dying is still in the pipes: its output first, then
        # its events (a result would end the attempt the output belongs to).
        self._drain_output()
        for _ in range(64):
            try:
                data = os.read(self.events_fd, 1 << 20)
            except OSError:
                break
            if not data:
                break
            self._feed_events(data)
        self._drain_output()
        self.returncode = code
        if self.label is not None:  # it died mid-attempt: its own cleanup did not run
            killed = self.kill_marked()
            if killed:
                log.warning("%s: the child died and left processes %s running; killed them",
                            self.label.tag(), ", ".join(map(str, killed)),
                            extra={"job_id": self.label.job_id, "attempt": self.label.attempt})
        self.owner.on_exit(self)
        for fd in (self.events_fd, self.out_fd, self.err_fd):
            self.loop.remove_reader(fd)
            os.close(fd)
        self.close_control()
        self.lease_cell.close()
        if self.cell_fd >= 0:
            os.close(self.cell_fd)
            self.cell_fd = -1

    def watch(self) -> None:
        for fd in (self.events_fd, self.out_fd, self.err_fd):
            os.set_blocking(fd, False)
        self.loop.add_reader(self.events_fd, self._read_events)
        self.loop.add_reader(self.out_fd, self._read_output, self.out_fd, "stdout")
        self.loop.add_reader(self.err_fd, self._read_output, self.err_fd, "stderr")

    # ---- processes ------------------------------------------------------------------------

    def remember_descendants(self) -> None:
        """Note the child's current descendants and forget those that are gone."""
        self.descendants = {p for p in self.descendants if p.is_running()}
        if self.returncode is not None or not self.pid:
            return  # once reaped, its pid may belong to someone else
        self.descendants |= set(processes_under(self.pid))

    def signal_group(self, sig: int) -> None:
        """Signal the child's process group and any known descendant outside it.

        A SIGKILL of a live child first stops its whole tree (:func:`freeze`), so that
        nothing of it can fork while it is being killed (a fork bomb): every process the
        freeze stopped gets the SIGKILL too.
        """
        if not self.pid:
            return
        frozen: set[int] = set()
        if sig == signal.SIGKILL and self.returncode is None:
            frozen = freeze(self.pid)
        self.remember_descendants()
        if self.returncode is None:
            try:
                os.killpg(self.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        for p in self.descendants:
            try:
                p.send_signal(sig)
            except psutil.Error:
                pass
        for pid in frozen:
            try:
                os.kill(pid, sig)
            except OSError:
                pass

    def tasks(self, limit: int) -> int:
        """Tasks (processes and threads) of the child's tree, counted up to ``limit + 1``."""
        if not self.pid or self.returncode is not None:
            return 0
        return count_tasks(self.pid, limit)

    def kill_marked(self) -> list[int]:
        """SIGKILL every process carrying this child's mark; returns their pids.

        For a child that died mid-attempt: descendants that left its process group were
        re-parented away, but still carry the mark in their environment. Reads every
        process's environment, so it is kept for that rare case.
        """
        if not self.tree:
            return []
        killed: dict[int, None] = {}  # in order
        for _ in range(10):  # again while it finds some: one may fork while the sweep runs
            before = len(killed)
            for p in psutil.process_iter():
                try:
                    if p.pid not in killed and p.environ().get(TREE_VARIABLE) == self.tree:
                        p.kill()
                        killed[p.pid] = None
                except psutil.Error:
                    continue
            if len(killed) == before:
                break
        return list(killed)

    def rss(self) -> int:
        """Resident memory of the child and its descendants, in bytes (refreshes descendants)."""
        if not self.pid or self.returncode is not None:
            return 0
        # The tree is walked through /proc/PID/task/TID/children (atlantis.child.tree.walk),
        # in proportion to the tree: psutil's children() reads every process of the host,
        # and hundreds of children each doing so blocked the event loop for seconds, long
        # enough to lose leases (found with 500 sleeping attempts).
        # /proc/PID/statm directly: a psutil.Process per read cost ~100 us (500 children:
        # a fifth of an idle supervisor's time).
        self.rss_read += 1
        total = 0
        known: set[int] | None = None
        for pid, _threads in walk(self.pid):
            total += resident(pid)
            if pid == self.pid:
                continue
            if known is None:
                known = {p.pid for p in self.descendants}
            if pid not in known:
                try:
                    self.descendants.add(psutil.Process(pid))
                except psutil.Error:
                    continue
        self.last_rss = total
        return total

    def tag(self) -> str:
        return self.label.tag() if self.label is not None else f"child={self.pid}"
