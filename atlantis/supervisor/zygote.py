"""The supervisor's side of the zygote (``--isolation fresh``): start it, ask it to fork.

The zygote is started like a child (a fresh interpreter that imports the app), then forks
one worker per attempt on request. Its workers are its own children: it reaps them and
reports their exit codes here. If the zygote dies, its workers die with it (parent-death
signal) and are reported killed; a new zygote is started.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable

import orjson

log = logging.getLogger("atlantis.supervisor")
out_log = logging.getLogger("atlantis.output")

FORK_TIMEOUT = 10.0


class ZygoteGone(Exception):  # noqa: N818 - reads better at the except sites
    """The zygote died or stopped answering."""


class Zygote:
    def __init__(self, app: str, env: dict[str, str], loop: asyncio.AbstractEventLoop,
                 on_ready: Callable[[], None], on_dead: Callable[[Zygote], None]) -> None:
        self.loop = loop
        self.generation = 0
        self.ready = False
        self.dead = False
        self.unsafe: str | None = None
        """Why forking this app is unsafe (it has threads after import), if it is."""
        self._on_ready = on_ready
        self._on_dead = on_dead
        self._watchers: dict[int, Callable[[int], None]] = {}
        self._early_exits: dict[int, int] = {}
        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "atlantis.child.zygote", "--app", app,
                 "--socket-fd", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                start_new_session=True, env=env,
            )
        finally:
            theirs.close()
        assert self.proc.stdout is not None
        self._out = self.proc.stdout.fileno()
        os.set_blocking(self._out, False)
        loop.add_reader(self._out, self._read_output)
        self._sock.setblocking(False)
        loop.add_reader(self._sock.fileno(), self._read_messages)
        self._pidfd = os.pidfd_open(self.proc.pid)
        loop.add_reader(self._pidfd, self._exited)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def watching(self) -> bool:
        """Whether some of its workers are still alive."""
        return bool(self._watchers)

    def fork(self, control_fd: int, events_fd: int, out_fd: int, err_fd: int) -> int:
        """Fork a worker that serves on the given descriptors; returns its pid."""
        if self.dead or not self.ready:
            raise ZygoteGone("the zygote is not ready")
        try:
            # The reply comes within milliseconds; exit reports may arrive before it.
            self._sock.settimeout(FORK_TIMEOUT)
            socket.send_fds(self._sock, [orjson.dumps({"t": "fork"})],
                            [control_fd, events_fd, out_fd, err_fd])
            while True:
                data = self._sock.recv(65536)
                if not data:
                    raise ZygoteGone("the zygote closed its socket")
                msg = orjson.loads(data)
                if msg.get("t") == "forked":
                    return int(msg["pid"])
                # Later, not now: handling an exit may start a worker, re-entering fork().
                self.loop.call_soon(self._handle, msg)
        except OSError as exc:
            self.kill()
            raise ZygoteGone(f"the zygote did not fork: {exc}") from exc
        finally:
            if not self.dead:
                self._sock.setblocking(False)

    def watch(self, pid: int, on_exit: Callable[[int], None]) -> None:
        if pid in self._early_exits:
            code = self._early_exits.pop(pid)
            self.loop.call_soon(on_exit, code)
        else:
            self._watchers[pid] = on_exit

    def close(self) -> None:
        """EOF on its socket ends the zygote; its idle workers end on their own EOF."""
        if not self.dead:
            self._sock.shutdown(socket.SHUT_RDWR)

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def _handle(self, msg: dict[str, object]) -> None:
        kind = msg.get("t")
        if kind == "ready":
            self.ready = True
            self._on_ready()
        elif kind == "exit":
            pid, code = int(str(msg["pid"])), int(str(msg["code"]))
            watcher = self._watchers.pop(pid, None)
            if watcher is None:
                self._early_exits[pid] = code
            else:
                watcher(code)
        elif kind == "fatal":
            log.error("the zygote could not load the app: %s", msg.get("error"))
        elif kind == "unsafe":
            self.unsafe = str(msg.get("reason"))

    def _read_messages(self) -> None:
        while True:
            try:
                data = self._sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data = b""
            if not data:
                self.loop.remove_reader(self._sock.fileno())
                return
            self._handle(orjson.loads(data))

    def _read_output(self) -> None:
        try:
            data = os.read(self._out, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.loop.remove_reader(self._out)
            return
        for line in data.decode("utf-8", errors="backslashreplace").splitlines():
            out_log.info("zygote=%d %s", self.proc.pid, line)

    def _exited(self) -> None:
        self.loop.remove_reader(self._pidfd)
        os.close(self._pidfd)
        self._read_messages()  # exit reports it sent before dying
        code = self.proc.wait()
        self.dead = True
        self.ready = False
        for fd in (self._sock.fileno(), self._out):
            self.loop.remove_reader(fd)
        self._sock.close()
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        watchers, self._watchers = self._watchers, {}
        if watchers:
            log.error("the zygote exited (code %d); %d workers die with it", code, len(watchers))
        for pid, watcher in watchers.items():
            # Workers die with their parent; make sure, then report them killed.
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            watcher(-signal.SIGKILL)
        self._on_dead(self)
