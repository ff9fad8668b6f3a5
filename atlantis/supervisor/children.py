"""Child processes as the supervisor sees them: start, talk, watch, kill.

Each child leads its own session and process group, so a kill reaches the whole group;
a psutil sweep then catches descendants that left the group with ``setsid`` (the child is
a subreaper, so even daemonized ones stay its descendants), and a child that dies
mid-attempt has whatever escaped found by the mark it puts in their environment. Exit is
watched through a pidfd (no pid-reuse race); output and events are read continuously,
so a chatty child can never fill a pipe and deadlock.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import psutil

from atlantis.child.main import TREE_VARIABLE
from atlantis.protocol import FrameReader, ProtocolError, write_frame
from atlantis.protocol.framing import Message

if TYPE_CHECKING:
    from atlantis.supervisor.attempts import Attempt

log = logging.getLogger("atlantis.supervisor")
out_log = logging.getLogger("atlantis.output")

_MAX_LINE = 64 * 1024


@dataclass(eq=False)
class Child:
    pid: int
    control_fd: int
    events_fd: int
    generation: int
    """Which SIGHUP generation started this child."""
    returncode: int | None = None
    """As ``Popen.returncode``: the exit code, or minus the signal that killed it."""
    state: str = "starting"  # starting, idle, busy, retiring, dead
    attempt: Attempt | None = None
    jobs_run: int = 0
    descendants: set[psutil.Process] = field(default_factory=set)
    """Descendants seen so far, kept as psutil handles: signalling one checks that its pid
    was not reused meanwhile, so a long-gone grandchild's number never hits a stranger."""
    reader: FrameReader = field(default_factory=FrameReader)
    tree: str | None = None
    """The mark (``ATLANTIS_TREE``) in the environment of every process the child starts."""
    _partial: dict[int, bytearray] = field(default_factory=dict)

    def send(self, msg: Message) -> bool:
        """Send a control message; False when the child is gone."""
        if self.control_fd < 0:
            return False
        try:
            write_frame(self.control_fd, msg)
        except OSError:
            return False
        return True

    def close_control(self) -> None:
        """EOF on the control pipe tells the child to exit."""
        if self.control_fd >= 0:
            os.close(self.control_fd)
            self.control_fd = -1

    def remember_descendants(self) -> None:
        """Note the child's current descendants and forget those that are gone.

        Once the child has been reaped its pid may belong to someone else: no lookup then.
        """
        self.descendants = {p for p in self.descendants if p.is_running()}
        if self.returncode is not None:
            return
        try:
            self.descendants |= set(psutil.Process(self.pid).children(recursive=True))
        except psutil.Error:
            pass

    def signal_group(self, sig: int) -> None:
        """Signal the child's process group and any known descendant outside it."""
        self.remember_descendants()
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        for p in self.descendants:
            try:
                p.send_signal(sig)
            except psutil.Error:
                pass

    def kill_marked(self) -> list[int]:
        """SIGKILL every process carrying this child's mark; returns their pids.

        For a child that died mid-attempt, before its own cleanup could run: descendants
        that left its process group (setsid) were re-parented away and are no longer its
        descendants, but they still carry the mark in their environment (unless a handler
        gave them an environment of its own). Reads every process's environment, so it is
        kept for that rare case.
        """
        if not self.tree:
            return []
        killed = []
        for p in psutil.process_iter():
            try:
                if p.environ().get(TREE_VARIABLE) == self.tree:
                    p.kill()
                    killed.append(p.pid)
            except psutil.Error:
                continue
        return killed

    def rss(self) -> int:
        """Resident memory of the child and its descendants, in bytes.

        The walk also refreshes ``descendants``: should the child crash, a descendant that
        left its process group is still known and killed with the rest.
        """
        try:
            proc = psutil.Process(self.pid)
            total = proc.memory_info().rss
            for p in proc.children(recursive=True):
                self.descendants.add(p)
                try:
                    total += p.memory_info().rss
                except psutil.Error:
                    continue
            return total
        except psutil.Error:
            return 0

    def tag(self) -> str:
        if self.attempt is not None:
            return f"job={self.attempt.job_id} attempt={self.attempt.attempt}"
        return f"child={self.pid}"

    def output(self, fd: int, data: bytes, stream: str) -> None:
        buf = self._partial.setdefault(fd, bytearray())
        buf += data
        while True:
            nl = buf.find(b"\n")
            if nl < 0:
                if len(buf) > _MAX_LINE:
                    self._emit(bytes(buf[:_MAX_LINE]), stream)
                    del buf[:_MAX_LINE]
                    continue
                break
            self._emit(bytes(buf[:nl]), stream)
            del buf[: nl + 1]

    def flush_output(self, fd: int, stream: str) -> None:
        buf = self._partial.pop(fd, None)
        if buf:
            self._emit(bytes(buf), stream)

    def _emit(self, line: bytes, stream: str) -> None:
        text = line.decode("utf-8", errors="backslashreplace").rstrip("\r")
        extra: dict[str, object] = {"stream": stream, "child_pid": self.pid}
        if self.attempt is not None:
            extra.update(job_id=self.attempt.job_id, attempt=self.attempt.attempt,
                         queue=self.attempt.queue)
        out_log.info("%s %s", self.tag(), text, extra=extra)


class Forker(Protocol):
    """Starts worker processes by forking a warm zygote (``--isolation fresh``)."""

    def fork(self, control_fd: int, events_fd: int, out_fd: int, err_fd: int) -> int: ...

    def watch(self, pid: int, on_exit: Callable[[int], None]) -> None: ...


def spawn_child(
    app: str,
    env: dict[str, str],
    generation: int,
    loop: asyncio.AbstractEventLoop,
    on_message: Callable[[Child, Message], None],
    on_exit: Callable[[Child], None],
    forker: Forker | None = None,
) -> Child:
    """Start a child: a fresh interpreter (``python -m atlantis.child``) or a fork of the zygote.

    Never a fork of this process, which has threads and database connections.
    """
    ctl_r, ctl_w = os.pipe()
    ev_r, ev_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    proc: subprocess.Popen[bytes] | None = None
    try:
        if forker is not None:
            pid = forker.fork(ctl_r, ev_w, out_w, err_w)
        else:
            proc = subprocess.Popen(
                [sys.executable, "-m", "atlantis.child", "--app", app,
                 "--control-fd", str(ctl_r), "--events-fd", str(ev_w)],
                pass_fds=(ctl_r, ev_w),
                stdin=subprocess.DEVNULL,
                stdout=out_w,
                stderr=err_w,
                start_new_session=True,
                env=env,
            )
            pid = proc.pid
    except BaseException:
        for fd in (ctl_w, ev_r, out_r, err_r):
            os.close(fd)
        raise
    finally:
        for fd in (ctl_r, ev_w, out_w, err_w):
            os.close(fd)
    for fd in (ctl_w, ev_r, out_r, err_r):
        os.set_inheritable(fd, False)
    child = Child(pid=pid, control_fd=ctl_w, events_fd=ev_r, generation=generation)
    streams = {out_r: "stdout", err_r: "stderr"}

    def read_events() -> None:
        try:
            data = os.read(ev_r, 1 << 20)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            loop.remove_reader(ev_r)
            return
        try:
            messages = child.reader.feed(data)
        except ProtocolError as exc:
            log.error("%s: corrupt event stream (%s); killing the child", child.tag(), exc)
            loop.remove_reader(ev_r)
            child.signal_group(signal.SIGKILL)
            return
        for msg in messages:
            if msg.get("t") == "ready":
                child.tree = str(msg.get("tree") or "") or None
            elif msg.get("t") == "done":
                # The handler's last output was written before its result: log it while the
                # attempt is still the child's, so that it carries its job id and attempt,
                # an unfinished last line (a progress bar, a prompt) included.
                drain_output()
            on_message(child, msg)

    def drain_output(limit: int = 4 << 20) -> None:
        """Log what the output pipes hold now, an unfinished last line included.

        Bounded: a leftover process may still be writing.
        """
        for fd, stream in streams.items():
            budget = limit
            while budget > 0:
                try:
                    data = os.read(fd, 1 << 16)
                except (BlockingIOError, OSError):
                    break
                if not data:
                    break
                budget -= len(data)
                child.output(fd, data, stream)
            child.flush_output(fd, stream)

    def read_output(fd: int) -> None:
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            loop.remove_reader(fd)
            child.flush_output(fd, streams[fd])
            return
        child.output(fd, data, streams[fd])

    def exited(code: int) -> None:
        # Whatever the child wrote before dying is still in the pipes: read it first, its
        # output before its events (a result would end the attempt the output belongs to).
        drain_output()
        while True:
            try:
                data = os.read(ev_r, 1 << 20)
            except (BlockingIOError, OSError):
                break
            if not data:
                break
            try:
                for msg in child.reader.feed(data):
                    on_message(child, msg)
            except ProtocolError:
                break
        drain_output()
        child.returncode = code
        if child.attempt is not None:  # it died mid-attempt: its own cleanup did not run
            killed = child.kill_marked()
            if killed:
                log.warning("%s: the child died and left processes %s running; killed them",
                            child.tag(), ", ".join(map(str, killed)),
                            extra={"job_id": child.attempt.job_id, "attempt": child.attempt.attempt})
        on_exit(child)
        for fd in (ev_r, *streams):
            loop.remove_reader(fd)
            os.close(fd)
        child.close_control()

    if proc is not None:
        popen = proc
        pidfd = os.pidfd_open(pid)

        def reaped() -> None:
            loop.remove_reader(pidfd)
            os.close(pidfd)
            exited(popen.wait())

        loop.add_reader(pidfd, reaped)
    else:
        assert forker is not None
        forker.watch(pid, exited)

    os.set_blocking(ev_r, False)
    loop.add_reader(ev_r, read_events)
    for fd in streams:
        os.set_blocking(fd, False)
        loop.add_reader(fd, read_output, fd)
    return child


def describe_exit(returncode: int) -> str:
    """How a child ended, in the words `last_error` uses."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        hint = " (perhaps out of memory?)" if -returncode == signal.SIGKILL else ""
        return f"killed by {name}{hint}"
    return f"child exited with code {returncode}"
