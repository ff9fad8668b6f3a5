"""The supervisor's side of the zygote (``--isolation fresh``): start it, ask it to fork.

The zygote is started like a child (a fresh interpreter that imports the app), then forks
one worker per attempt on request. Requests and answers are asynchronous: a ``Fork``
packet carries a token and the worker's five descriptors (control, events, stdout, stderr,
the lease cell), the ``Forked`` answer names the token and the pid; the event loop never
waits for it. Workers are the zygote's children: it reaps them and reports their exit
codes here. If the zygote dies, its workers die with it (parent-death signal) and are
reported killed, forks it never answered too; a new zygote is started. Every packet is validated; a malformed one kills the zygote.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable

from atlantis.protocol.framing import ProtocolError
from atlantis.protocol.messages import (
    Exited,
    Fork,
    Forked,
    Preload,
    Preloadable,
    Unsafe,
    ZygoteFatal,
    ZygoteReady,
    decode,
    dumps,
)
from atlantis.supervisor import identity
from atlantis.supervisor.children import read_ready

log = logging.getLogger("atlantis.supervisor")
out_log = logging.getLogger("atlantis.output")

_FROM_ZYGOTE = (Forked, Exited, ZygoteReady, ZygoteFatal, Unsafe)
class Zygote:
    def __init__(self, app: str, env: dict[str, str], loop: asyncio.AbstractEventLoop,
                 generation: int, on_ready: Callable[[], None],
                 on_dead: Callable[[Zygote], None], fork_timeout: float = 10.0) -> None:
        self.loop = loop
        self.fork_timeout = fork_timeout
        """A fork the zygote has not answered by then counts as failed."""
        self.generation = generation
        self.ready = False
        self.dead = False
        self.unsafe: str | None = None
        """Why forking this app is unsafe (it has threads after import), if it is."""
        self._on_ready = on_ready
        self._on_dead = on_dead
        self._tokens = itertools.count(1)
        self.preloaded: set[Preloadable] = set()
        """What it was asked to load for its workers (:mod:`atlantis.child.preload`)."""
        self._forking: dict[int, tuple[Callable[[int], None], Callable[[int], None]]] = {}
        self._watchers: dict[int, Callable[[int], None]] = {}
        self._early_exits: dict[int, int] = {}
        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "atlantis.child.zygote", "--app", app,
                 "--socket-fd", str(theirs.fileno()), "--parent-pid", str(os.getpid())],
                pass_fds=(theirs.fileno(), *identity.inherited()), stdin=subprocess.DEVNULL,
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
        """Whether some of its workers are still alive (or being forked)."""
        return bool(self._watchers or self._forking)

    def fork(self, fds: tuple[int, int, int, int, int], on_forked: Callable[[int], None],
             on_exit: Callable[[int], None]) -> None:
        """Ask for a worker serving on ``fds``; ``on_forked(pid)``, later ``on_exit(code)``.

        Never blocks and never raises: a zygote that cannot take the request is killed,
        and the worker is reported as killed (``on_exit``, called soon, not now).
        """
        token = next(self._tokens)
        if self.dead or not self.ready:
            self.loop.call_soon(on_exit, -signal.SIGKILL)
            return
        try:
            socket.send_fds(self._sock, [dumps(Fork(token=token))], list(fds))
        except OSError as exc:
            log.error("the zygote did not take a fork request (%s); restarting it", exc)
            self.loop.call_soon(on_exit, -signal.SIGKILL)
            self.kill()
            return
        self._forking[token] = (on_forked, on_exit)
        self.loop.call_later(self.fork_timeout, self._fork_overdue, token)

    def preload(self, modules: set[Preloadable]) -> None:
        """Ask it to load, for every later worker, what of ``modules`` it was not asked for
        yet. Before it is ready too: it reads its socket once it serves, in order, so the
        first worker is forked with them. Never blocks and never raises: a request that
        does not fit in the socket now is asked again with a later worker's ``Done``."""
        new = sorted(modules - self.preloaded)
        if not new or self.dead:
            return
        try:
            self._sock.send(dumps(Preload(modules=new)))
        except BlockingIOError:
            return
        except OSError as exc:
            log.error("the zygote did not take a preload request (%s); restarting it", exc)
            self.kill()
            return
        self.preloaded.update(new)
        log.info("zygote %d: loading %s for its workers (a worker needed it)", self.pid,
                 ", ".join(new))

    def _fork_overdue(self, token: int) -> None:
        """A fork never answered (the system refused it): the zygote is of no use any more."""
        if token in self._forking and not self.dead:
            log.error("the zygote did not answer a fork request in %.0fs; restarting it",
                      self.fork_timeout)
            self.kill()  # its exit reports every pending fork as killed

    def close(self) -> None:
        """EOF on its socket ends the zygote; its idle workers end on their own EOF."""
        if not self.dead:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def _handle(self, body: bytes) -> None:
        try:
            msg = decode(body, expect=_FROM_ZYGOTE)
        except ProtocolError as exc:
            log.error("the zygote sent an invalid message (%s); killing it", exc)
            self.kill()
            return
        if isinstance(msg, Forked):
            pending = self._forking.pop(msg.token, None)
            if pending is None:
                log.error("the zygote answered a fork nobody asked for; killing it")
                self.kill()
                return
            on_forked, on_exit = pending
            on_forked(msg.pid)
            if msg.pid in self._early_exits:
                on_exit(self._early_exits.pop(msg.pid))
            else:
                self._watchers[msg.pid] = on_exit
        elif isinstance(msg, Exited):
            watcher = self._watchers.pop(msg.pid, None)
            if watcher is None:
                self._early_exits[msg.pid] = msg.code
            else:
                watcher(msg.code)
        elif isinstance(msg, ZygoteReady):
            self.ready = True
            self._on_ready()
        elif isinstance(msg, ZygoteFatal):
            log.error("the zygote could not load the app: %s", msg.error)
        elif isinstance(msg, Unsafe):
            self.unsafe = msg.reason

    def _read_messages(self) -> None:
        while not self.dead:
            try:
                data = self._sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data = b""
            if not data:
                self.loop.remove_reader(self._sock.fileno())
                return
            self._handle(data)

    def _read_output(self) -> None:
        data = read_ready(self.loop, self._out)
        if not data:
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
        forking, self._forking = self._forking, {}
        if watchers or forking:
            log.error("the zygote exited (code %d); %d workers die with it", code,
                      len(watchers) + len(forking))
        for pid, watcher in watchers.items():
            # Workers die with their parent; make sure, then report them killed.
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            watcher(-signal.SIGKILL)
        for _, on_exit in forking.values():
            on_exit(-signal.SIGKILL)
        self._on_dead(self)
