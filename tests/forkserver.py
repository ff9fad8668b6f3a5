"""Supervisors for the tests, forked from an interpreter that has imported the supervisor.

Every ``atlantis-supervise`` a test starts is a real process running the real command
(``atlantis.supervisor.cli.main`` with the test's arguments, environment, working folder and
log), with its own pid, children, lease keeper and signals. What it skips is the half second
of CPU each one spends importing psycopg, asyncio, click and atlantis before it reads its
first argument: a pytest worker starts one server process (``python -m tests.forkserver FD``)
that imports all that once and forks a supervisor per request. About 270 supervisors start in
a run of the suite; this is about a tenth of its CPU.

A test whose environment changes how Python starts gets ``atlantis-supervise`` run as a
program, as before (:func:`forkable` decides), except for an app folder on ``PYTHONPATH``
and ``PYTHONDONTWRITEBYTECODE``, which the fork applies as the interpreter would
(:func:`_as_started`) unless a folder holds a ``sitecustomize`` or ``usercustomize``.

The protocol, one JSON line each way over a socket pair: a request
``{"seq", "argv", "env", "cwd", "log", "session"}`` is answered ``{"seq", "pid"}`` once
forked, and ``{"seq", "status"}`` (a wait status) when that process has exited: the server
is its parent and reaps it.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

import orjson

#: Variables that change how an interpreter starts: a request whose environment differs in
#: one of them from the server's own cannot be served by a fork.
_STARTUP_PREFIXES = ("PYTHON", "LD_")


#: Variables a fork can give its supervisor as the interpreter would have at its start
#: (:func:`_as_started`), when the server started without them: a test's app folder on
#: ``PYTHONPATH`` (tests that rewrite its modules set ``PYTHONDONTWRITEBYTECODE`` too).
_EMULATED = ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE")
#: Modules an interpreter runs at its start when ``PYTHONPATH`` finds them: never emulated.
_AT_START = ("sitecustomize.py", "usercustomize.py")


def forkable(env: dict[str, str], server_env: dict[str, str]) -> bool:
    """Whether a fork of a server started with ``server_env`` starts like a program run
    with ``env`` would."""
    emulated = not any(server_env.get(k) for k in _EMULATED)

    def startup(e: dict[str, str]) -> dict[str, str]:
        return {k: v for k, v in e.items() if k.startswith(_STARTUP_PREFIXES)
                and not (emulated and k in _EMULATED)}
    if startup(env) != startup(server_env):
        return False
    folders = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    return not any((Path(f) / name).exists() for f in folders for name in _AT_START)


def _as_started(env: dict[str, str]) -> None:
    """In the forked process: ``PYTHONPATH`` and ``PYTHONDONTWRITEBYTECODE`` of ``env`` as
    the interpreter applies them at its start (the folders, absolute, after the first
    entry of ``sys.path``, the script's own)."""
    folders = [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[1:1] = folders
    sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))


# ---- the server (python -m tests.forkserver FD) -----------------------------------------------

def _run_supervisor(request: dict[str, Any]) -> int:
    """In the forked process: become the requested ``atlantis-supervise`` and run it."""
    from atlantis.supervisor.cli import main

    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    if request["session"]:
        os.setsid()
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT, 0o644)  # made by the client
    os.dup2(log, 1)
    os.dup2(log, 2)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # as Popen's close_fds: the socket too
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    _as_started(request["env"])
    sys.argv = ["atlantis-supervise", *request["argv"]]
    try:
        main(args=request["argv"], prog_name="atlantis-supervise")
        code: Any = 0
    except SystemExit as exc:
        code = exc.code
    except BaseException:  # reported as an interpreter would, then exit 1
        traceback.print_exc()
        code = 1
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    return int(code)


def _child(request: dict[str, Any]) -> None:
    code = 1
    try:
        code = _run_supervisor(request)
    finally:
        with contextlib.suppress(BaseException):
            atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(BaseException):
                stream.flush()
        os._exit(code)


def serve(fd: int) -> None:
    import atlantis.supervisor.cli  # noqa: F401 - the imports every supervisor would pay

    sock = socket.socket(fileno=fd)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    seqs: dict[int, int] = {}  # pid -> seq
    buffer = b""

    def send(message: dict[str, Any]) -> None:
        with contextlib.suppress(OSError):
            sock.sendall(orjson.dumps(message) + b"\n")

    def reap() -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            seq = seqs.pop(pid, None)
            if seq is not None:
                send({"seq": seq, "status": status})

    while True:
        ready, _, _ = select.select([sock.fileno(), wake_r], [], [])
        if wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                while os.read(wake_r, 512):
                    pass
            reap()
        if sock.fileno() in ready:
            data = sock.recv(1 << 20)
            if not data:
                return  # the pytest worker is gone; its fixtures stopped what they started
            buffer += data
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                request = orjson.loads(line)
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    _child(request)
                seqs[pid] = request["seq"]
                send({"seq": request["seq"], "pid": pid})
            reap()


# ---- the client (in a pytest worker) ----------------------------------------------------------

class ForkedProcess:
    """What a test holds of a forked supervisor: the part of :class:`subprocess.Popen` the
    suite uses (``pid``, ``poll``, ``wait``, ``send_signal``, ``kill``, ``returncode``)."""

    def __init__(self, server: ForkServer, seq: int, pid: int, argv: list[str]) -> None:
        self._server = server
        self._seq = seq
        self.pid = pid
        self.args = argv
        self.returncode: int | None = None

    def _status(self) -> int | None:
        if self.returncode is None:
            status = self._server.statuses.get(self._seq)
            if status is not None:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def poll(self) -> int | None:
        with self._server.changed:
            return self._status()

    def wait(self, timeout: float | None = None) -> int:
        with self._server.changed:
            if not self._server.changed.wait_for(lambda: self._status() is not None, timeout):
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # not reaped yet: the pid is still this process's
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """One per pytest worker, started on first use; :meth:`close` stops it by pid."""

    def __init__(self, root: Path) -> None:
        ours, theirs = socket.socketpair()
        self.env = dict(os.environ)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.forkserver", str(theirs.fileno())],
            pass_fds=[theirs.fileno()], cwd=root, stdin=subprocess.DEVNULL)
        theirs.close()
        self._sock = ours
        self._lock = threading.Lock()  # one request at a time
        self.changed = threading.Condition()
        self.statuses: dict[int, int] = {}
        self._pids: dict[int, int] = {}
        self._seq = 0
        self._closed = False
        self._reader = threading.Thread(target=self._read, name="forkserver", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        buffer = b""
        while True:
            try:
                data = self._sock.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                with self.changed:
                    self._closed = True
                    self.changed.notify_all()
                return
            buffer += data
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                message = orjson.loads(line)
                with self.changed:
                    if "pid" in message:
                        self._pids[message["seq"]] = message["pid"]
                    else:
                        self.statuses[message["seq"]] = message["status"]
                    self.changed.notify_all()

    def spawn(self, argv: list[str], env: dict[str, str], cwd: Path, log: Path,
              session: bool) -> ForkedProcess:
        with self._lock:
            self._seq += 1
            seq = self._seq
            request = {"seq": seq, "argv": argv, "env": env, "cwd": str(cwd),
                       "log": str(log), "session": session}
            self._sock.sendall(orjson.dumps(request) + b"\n")
            with self.changed:
                if not self.changed.wait_for(lambda: seq in self._pids or self._closed, 60):
                    raise RuntimeError("the supervisor fork server did not answer in 60s")
                if seq not in self._pids:
                    raise RuntimeError(f"the supervisor fork server exited ({self.proc.poll()})")
                pid = self._pids.pop(seq)
        return ForkedProcess(self, seq, pid, ["atlantis-supervise", *argv])

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(5)


if __name__ == "__main__":
    serve(int(sys.argv[1]))
