"""The zygote: a single-threaded process that imports the app once and forks workers.

``--isolation fresh`` wants a new process for every attempt. Starting an interpreter and
importing the app costs hundreds of milliseconds; forking this warm, single-threaded,
connection-free process costs a few. Before the first fork it walks a worker's path once
without running any handler (:func:`rehearse`), so that the caches that path fills are
filled once, here, and shared.

Protocol (:mod:`atlantis.protocol.messages`; SOCK_SEQPACKET, one ``dumps()`` body a packet):
the zygote sends ``ZygoteReady(pid)`` once the app is imported, ``ZygoteFatal(error)`` (and
exits with ``EXIT_APP_ERROR``) if it cannot be, or ``Unsafe(reason)`` (and exits 0) if the
app started threads at import. The supervisor then sends ``Fork(token)`` packets carrying
exactly five descriptors (control, events, stdout, stderr, the lease cell); the zygote forks a worker that
serves one attempt on them and answers ``Forked(token, pid)``; it reaps its workers and reports each
``Exited(pid, code)`` (``code`` as in ``Popen.returncode``). A ``Preload(modules)`` packet,
with no descriptor, has it import those for every later worker (:mod:`atlantis.child.preload`:
it starts with the app alone). A malformed packet (neither, or with the wrong number of
descriptors) is dropped, its descriptors closed, and logged to
stderr; a fork the system refuses (after a few tries) is dropped the same way. The zygote
ends at EOF on its socket; its workers die with it (parent-death signal).
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import select
import signal
import socket
import sys
import threading
import time
from typing import NoReturn

from atlantis.app import load_app
from atlantis.child import preload
from atlantis.child.attempt import run_attempt
from atlantis.child.channel import Channel
from atlantis.child.exits import TermSignal
from atlantis.child.main import EXIT_APP_ERROR, _die_with_parent, serve
from atlantis.child.text import MAX_ERROR_CHARS, text_of
from atlantis.child.tracing import prepare as prepare_tracing
from atlantis.child.watchdog import Watchdog
from atlantis.errors import ConfigurationError
from atlantis.protocol.framing import ProtocolError
from atlantis.protocol.leasecell import LeaseCell
from atlantis.protocol.messages import (
    Exited,
    Fork,
    Forked,
    FromZygote,
    Preload,
    Ready,
    Run,
    Unsafe,
    ZygoteFatal,
    ZygoteReady,
    clip,
    decode,
    dumps,
    encode,
)
from atlantis.registry import Registry

MAX_MESSAGE = 64 * 1024
MAX_FDS = 8
#: A worker's descriptors: control, events, stdout, stderr, lease cell.
WORKER_FDS = 5
_FORK_RETRIES = (0.01, 0.05, 0.2)


class SupervisorGoneError(Exception):
    """The supervisor's end of the socket is closed."""


def _log(line: str) -> None:
    print(f"atlantis-zygote: {line}", file=sys.stderr, flush=True)


def _send(sock: socket.socket, msg: FromZygote) -> None:
    try:
        sock.send(dumps(msg))
    except OSError as exc:
        raise SupervisorGoneError(str(exc)) from exc


def _worker(control_fd: int, events_fd: int, out_fd: int, err_fd: int, lease_fd: int,
            registry: Registry, zygote: int) -> NoReturn:
    """In the forked worker: become a session leader with its own output, then serve."""
    code = 1
    try:
        os.setsid()
        for fd in (control_fd, events_fd, lease_fd):
            os.set_inheritable(fd, False)
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        for fd in (out_fd, err_fd):
            if fd > 2:
                os.close(fd)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        _die_with_parent(zygote)
        code = serve(registry, control_fd, events_fd, lease_fd, reused=False)
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        _send(sock, Exited(pid=pid, code=code))


def _close(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _receive(sock: socket.socket) -> tuple[Fork | Preload, list[int]] | None:
    """One request, or None for a packet that was dropped; SupervisorGoneError at EOF."""
    try:
        data, fds, flags, _addr = socket.recv_fds(sock, MAX_MESSAGE, MAX_FDS)
    except (BlockingIOError, InterruptedError):
        return None
    except OSError as exc:
        raise SupervisorGoneError(str(exc)) from exc
    if not data and not fds:
        raise SupervisorGoneError("end of stream")
    why = None
    msg: Fork | Preload | None = None
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        why = "packet truncated (too long, or too many descriptors)"
    else:
        try:
            decoded = decode(data, expect=(Fork, Preload))
        except ProtocolError as exc:
            why = str(exc)
        else:
            assert isinstance(decoded, Fork | Preload)
            msg = decoded
            wanted = WORKER_FDS if isinstance(msg, Fork) else 0
            if len(fds) != wanted:
                why = f"{len(fds)} descriptors, expected {wanted}"
    if why is not None or msg is None:
        _log(f"dropped a malformed packet ({why})")
        _close(fds)
        return None
    return msg, fds


def _fork(sock: socket.socket, msg: Fork, fds: list[int], registry: Registry) -> int | None:
    """Fork a worker serving on ``fds``; its pid, or None if the system refused."""
    sys.stdout.flush()
    sys.stderr.flush()
    zygote = os.getpid()
    for delay in (*_FORK_RETRIES, None):
        try:
            pid = os.fork()
        except OSError as exc:
            if delay is None:
                _log(f"could not fork a worker for request {msg.token} ({exc}); dropped it")
                return None
            time.sleep(delay)
            continue
        if pid == 0:
            sock.close()
            _worker(fds[0], fds[1], fds[2], fds[3], fds[4], registry, zygote)
        return pid
    return None  # pragma: no cover - the loop always returns


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="atlantis-zygote")
    parser.add_argument("--app", required=True)
    parser.add_argument("--socket-fd", type=int, required=True)
    parser.add_argument("--parent-pid", type=int, default=None,
                        help="the supervisor's pid; by hand, this process's parent at start")
    opts = parser.parse_args(argv)
    _die_with_parent(opts.parent_pid if opts.parent_pid is not None else os.getppid())
    os.set_inheritable(opts.socket_fd, False)
    sock = socket.socket(fileno=opts.socket_fd)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        try:
            registry = load_app(opts.app)
        except ConfigurationError as exc:
            _send(sock, ZygoteFatal(error=clip(text_of(exc), MAX_ERROR_CHARS)))
            return EXIT_APP_ERROR
        prepare_tracing()  # the SDK imported once here, not in every worker
        # Signals are the supervisor's business; SIGCHLD just wakes the poll below.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        if _unsafe(sock, "the app starts threads at import"):
            return 0
        try:
            rehearse(registry)
        except Exception as exc:  # only ever a saving: workers then fill their caches themselves
            _log(f"the rehearsal of a worker failed ({text_of(exc)}); forking anyway")
        _share()
        _send(sock, ZygoteReady(pid=os.getpid()))
        return _serve(sock, registry)
    except SupervisorGoneError:
        return 0  # the supervisor is gone; our workers die with us (parent-death signal)


def _preload(sock: socket.socket, msg: Preload) -> bool:
    """Import what ``msg`` names for every later worker; False (``Unsafe`` sent) if that
    started a thread, which none of them does: forking would then be unsafe. One that fails
    to import is left to the workers, which import it themselves (and say why)."""
    try:
        preload.load(msg.modules)
    except Exception as exc:
        _log(f"could not load {', '.join(msg.modules)} for the workers ({text_of(exc)})")
        return True
    if _unsafe(sock, f"loading {', '.join(msg.modules)} started threads"):
        return False
    _share()
    return True


def _unsafe(sock: socket.socket, what: str) -> bool:
    """Whether this process has a thread besides the main one: then ``Unsafe`` is sent
    (``what`` and the threads' names). A fork copies only the forking thread: locks the
    others hold would stay locked forever in every worker."""
    threads = [text_of(t.name) for t in threading.enumerate() if t is not threading.main_thread()]
    if not threads:
        return False
    _send(sock, Unsafe(reason=clip(f"{what} ({', '.join(threads)})", MAX_ERROR_CHARS)))
    return True


def _share() -> None:
    """Everything imported so far is shared with the workers copy-on-write. A collection in
    a worker would walk (and so write to, and copy) every one of those objects: moved to a
    generation the collector never visits, they stay shared."""
    gc.collect()
    gc.freeze()


def rehearse(registry: Registry) -> None:
    """Walk a worker's path once, here, before the first fork: no handler runs, nothing
    leaves this process.

    A worker writes every page it touches of the heap it shares with the zygote (CPython
    3.11 counts references in the objects themselves), and each such page is copied for
    it. The first run of a path also fills caches: the interpreter's method cache (a miss
    takes a reference to the attribute's name and the type's MRO: two more objects
    written), each job's logger. Filled here, once, they are shared with every worker
    instead of being made again in each. The attempt is of a job no handler is registered
    for, so it ends in a ``Done`` of its own without calling the app; its frames go into
    a pipe that is then closed.
    """
    job = "atlantis.rehearsal"
    while job in registry.registrations:
        job += "_"
    read_end, write_end = os.pipe()
    cell, cell_fd = LeaseCell.create()
    control_r, control_w = os.pipe()
    watchdog = None
    try:
        term = TermSignal()
        channel = Channel(write_end, term, cell)
        watchdog = Watchdog(control_r, cell)  # never started: this process stays single-threaded
        channel.send(Ready(pid=os.getpid(), tree="", jobs="\n".join(sorted(registry.registrations))))
        for name in (job, *sorted(registry.registrations)):
            logging.getLogger(f"atlantis.job.{name}")  # as a worker's attempt names it
        os.write(control_w, encode(Run(
            job_id=0, job=job, queue="", attempt=1, max_attempts=1, args="{}",
            deadline="2000-01-01T00:00:00+00:00", lease_end=time.monotonic() + 3600.0,
            lease_margin=1.0)))
        run, flags = watchdog.next_run()
        cell.set(run.lease_end)
        done, _must_exit = run_attempt(registry, run, flags, channel, watchdog, term)
        channel.send_done(done)
        channel.job_id = None
        cell.set(0.0)
    finally:
        if watchdog is not None:
            watchdog.close()
        cell.close()
        for fd in (read_end, write_end, cell_fd, control_r, control_w):
            os.close(fd)


def _serve(sock: socket.socket, registry: Registry) -> int:
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    while True:
        _reap(sock)
        if not poller.poll(50):
            continue
        request = _receive(sock)
        if request is None:
            continue
        msg, fds = request
        if isinstance(msg, Preload):
            if not _preload(sock, msg):
                return 0
            continue
        pid = _fork(sock, msg, fds, registry)
        _close(fds)
        if pid is not None:
            _send(sock, Forked(token=msg.token, pid=pid))


if __name__ == "__main__":
    raise SystemExit(main())
