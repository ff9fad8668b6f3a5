"""The zygote: a single-threaded process that imports the app once and forks workers.

``--isolation fresh`` wants a new process for every attempt. Starting an interpreter and
importing the app costs hundreds of milliseconds; forking this warm, single-threaded,
connection-free process costs a few. The supervisor sends, over a SOCK_SEQPACKET socket,
``{"t": "fork"}`` with the four descriptors the worker needs (control, events, stdout,
stderr); the zygote forks, replies ``{"t": "forked", "pid"}``, reaps its workers and reports
each ``{"t": "exit", "pid", "code"}`` (``code`` as in ``Popen.returncode``).
"""

from __future__ import annotations

import argparse
import logging
import os
import select
import signal
import socket
import sys
import threading

import orjson

from atlantis.app import load_app
from atlantis.child.main import EXIT_APP_ERROR, _die_with_parent, serve
from atlantis.errors import ConfigurationError

MAX_MESSAGE = 64 * 1024


def _send(sock: socket.socket, msg: dict[str, object]) -> None:
    sock.send(orjson.dumps(msg))


def _worker(control_fd: int, events_fd: int, out_fd: int, err_fd: int, registry: object) -> None:
    """In the forked worker: become a session leader with its own output, then serve."""
    os.setsid()
    for fd in (control_fd, events_fd):
        os.set_inheritable(fd, False)
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    for fd in (out_fd, err_fd):
        os.close(fd)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    _die_with_parent()
    from atlantis.registry import Registry

    assert isinstance(registry, Registry)
    code = 1
    try:
        code = serve(registry, control_fd, events_fd)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
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
        _send(sock, {"t": "exit", "pid": pid, "code": code})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="atlantis-zygote")
    parser.add_argument("--app", required=True)
    parser.add_argument("--socket-fd", type=int, required=True)
    opts = parser.parse_args(argv)
    _die_with_parent()
    os.set_inheritable(opts.socket_fd, False)
    sock = socket.socket(fileno=opts.socket_fd)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        registry = load_app(opts.app)
    except ConfigurationError as exc:
        _send(sock, {"t": "fatal", "error": str(exc)})
        return EXIT_APP_ERROR
    # Signals are the supervisor's business; SIGCHLD just wakes the poll below.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    threads = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    if threads:
        # A fork copies only the forking thread: locks the others hold stay locked forever.
        _send(sock, {"t": "unsafe", "reason": f"the app starts threads at import ({', '.join(threads)})"})
        return 0
    _send(sock, {"t": "ready", "pid": os.getpid()})
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    while True:
        _reap(sock)
        if not poller.poll(50):
            continue
        try:
            data, fds, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE, 8)
        except OSError:
            return 0
        if not data:
            return 0  # the supervisor is gone; our workers die with us (parent-death signal)
        msg = orjson.loads(data)
        if msg.get("t") != "fork" or len(fds) != 4:
            for fd in fds:
                os.close(fd)
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            sock.close()
            _worker(fds[0], fds[1], fds[2], fds[3], registry)
        for fd in fds:
            os.close(fd)
        _send(sock, {"t": "forked", "pid": pid, "token": msg.get("token")})


if __name__ == "__main__":
    raise SystemExit(main())
