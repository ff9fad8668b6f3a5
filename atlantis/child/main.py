"""The child process: load the app once, then run one attempt at a time.

Two threads: the main thread runs handlers; the watchdog thread owns the control pipe. The
watchdog enforces the lease on its own: if no renewal arrives before the lease's end minus
a margin (the supervisor may be paused, swapped out or wedged), it kills this process
tree, so the attempt is dead before any other worker may claim the row. It also kills the
tree when the control pipe reaches EOF (the supervisor died), as does the parent-death
signal. "Tree" means the process group plus every descendant, those that left the group
with setsid included; as a child subreaper this process also adopts descendants that
daemonize, so they cannot slip out of the tree either.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import inspect
import logging
import math
import os
import queue
import secrets
import select
import signal
import sys
import threading
import time
import traceback
from datetime import datetime
from typing import Any

import psutil

from atlantis.app import load_app
from atlantis.context import JobContext
from atlantis.errors import ConfigurationError, Discard, Snooze
from atlantis.protocol import FrameReader, ProtocolError, write_frame
from atlantis.protocol.framing import Message
from atlantis.registry import Registry

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
EXIT_APP_ERROR = 3
#: Sent by the kernel when the parent dies; real-time, so no library has a use for it.
PARENT_DEATH_SIGNAL: int | None = (
    signal.SIGRTMIN + 3 if hasattr(signal, "SIGRTMIN") else None  # Linux only
)
#: Environment variable marking every process of a child's tree (see :func:`serve`).
TREE_VARIABLE = "ATLANTIS_TREE"
#: Error messages and tracebacks past this size are cut (a 10 MB message would otherwise be
#: stored, twice, in the row's ``errors`` and ``last_error``).
MAX_ERROR_CHARS = 64 * 1024


class Terminated(BaseException):
    """SIGTERM reached the attempt (timeout, cancel or drain); lets ``finally`` blocks run."""


def _die_with_parent() -> None:
    """Have the kernel signal this process when its parent (the supervisor) dies.

    The signal is a dedicated real-time one with a handler that kills this process's whole
    tree, not a bare SIGKILL: SIGKILL would end this process at once and orphan the
    handler's subprocesses, which nothing would then ever stop. The watchdog's EOF on the
    control pipe leads to the same sweep; whichever runs first wins.
    """
    if PARENT_DEATH_SIGNAL is None:
        return
    signal.signal(PARENT_DEATH_SIGNAL, lambda signum, frame: _kill_group())
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, PARENT_DEATH_SIGNAL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux
        pass
    if os.getppid() == 1:  # the parent died before prctl took effect
        os._exit(1)


def _adopt_orphans() -> None:
    """Become a child subreaper (Linux).

    A handler's descendant that daemonizes (setsid plus a double fork) is then re-parented
    to this process instead of init, so it remains a descendant that the leftover sweep
    here and the supervisor's kill sweep both find. Orphans that exit are reaped after each
    attempt (:func:`_reap_zombies`).
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _kill_descendants(keep: frozenset[psutil.Process] = frozenset()) -> list[psutil.Process]:
    """SIGKILL every descendant (those that left our process group with setsid included).

    Repeated a few times, since a process may fork while the sweep runs; ``keep`` spares
    processes that existed before the attempt (the app's own). Returns what was killed.
    """
    killed: list[psutil.Process] = []
    for _ in range(3):
        found = [p for p in _descendants() if p not in keep and p not in killed]
        if not found:
            break
        for p in found:
            try:
                p.kill()
                killed.append(p)
            except psutil.Error:
                pass
    return killed


def _exit_now(code: int) -> None:
    """Exit without waiting for threads, output flushed first."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _kill_group() -> None:
    """SIGKILL this process's whole tree: descendants outside the group, then the group."""
    try:
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    _kill_descendants()
    os.killpg(os.getpgid(0), signal.SIGKILL)
    os._exit(1)  # pragma: no cover - not reached


class Channel:
    """Writes to the events pipe; the main thread and the watchdog both send."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._lock = threading.Lock()

    def send(self, msg: Message) -> None:
        with self._lock:
            write_frame(self._fd, msg)


class Watchdog(threading.Thread):
    def __init__(self, control_fd: int) -> None:
        super().__init__(name="atlantis-watchdog", daemon=True)
        self._fd = control_fd
        self._reader = FrameReader()
        self.runs: queue.Queue[Message | None] = queue.Queue()
        self._lock = threading.Lock()
        self._job_id: int | None = None
        self._lease_end = math.inf
        self._margin = 0.0
        self.ctx: JobContext | None = None

    def attempt_started(self, ctx: JobContext) -> None:
        with self._lock:
            self.ctx = ctx

    def attempt_ended(self) -> None:
        with self._lock:
            self._job_id = None
            self._lease_end = math.inf
            self.ctx = None

    def run(self) -> None:
        os.set_blocking(self._fd, False)
        poller = select.poll()
        poller.register(self._fd, select.POLLIN | select.POLLHUP)
        while True:
            with self._lock:
                stop_at = self._lease_end - self._margin
            wait = stop_at - time.monotonic()
            if wait <= 0:
                print(
                    f"atlantis: job={self._job_id}: no lease renewal reached this child before "
                    "the lease's end; stopping the attempt",
                    file=sys.stderr,
                )
                _kill_group()
            timeout_ms = -1 if math.isinf(wait) else max(1, int(wait * 1000))
            if not poller.poll(timeout_ms):
                continue
            try:
                data = os.read(self._fd, 1 << 20)
            except BlockingIOError:
                continue
            if not data:  # the supervisor is gone: nothing of ours may outlive it
                _kill_group()
            try:
                messages = self._reader.feed(data)
            except ProtocolError as exc:
                print(f"atlantis: corrupt control stream: {exc}", file=sys.stderr)
                _kill_group()
            for msg in messages:
                self._handle(msg)

    def _handle(self, msg: Message) -> None:
        kind = msg["t"]
        with self._lock:
            if kind == "run":
                self._job_id = int(msg["job_id"])
                self._lease_end = float(msg["lease_end"])
                self._margin = float(msg["lease_margin"])
                self.runs.put(msg)
            elif kind == "lease" and msg.get("job_id") == self._job_id:
                self._lease_end = max(self._lease_end, float(msg["lease_end"]))
            elif kind == "cancel" and msg.get("job_id") == self._job_id and self.ctx is not None:
                self.ctx._cancelled = True


def _clip(text: str, head: int, tail: int = 0) -> str:
    """``text`` cut to about ``head + tail`` characters, saying how much was dropped."""
    if len(text) <= head + tail:
        return text
    note = f" ... [truncated: {len(text)} characters in all] ... "
    return text[:head] + note + (text[-tail:] if tail else "")


def _describe(exc: BaseException) -> str:
    """``Type: message``, even for an exception whose ``__str__`` itself raises."""
    try:
        text = str(exc)
    except Exception:  # a broken __str__ must not crash the child
        text = f"<unprintable {type(exc).__name__}>"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _error(kind: str, message: str, exc: BaseException | None = None) -> dict[str, Any]:
    tb: str | None = None
    if exc is not None:
        try:
            tb = "".join(traceback.format_exception(exc))
        except Exception:  # same: an unprintable exception still fails cleanly
            tb = None
    return {
        "kind": kind,
        "message": _clip(message, MAX_ERROR_CHARS),
        # The frames are at the top, the exception's own text at the bottom: keep both ends.
        "traceback": _clip(tb, MAX_ERROR_CHARS * 3 // 4, MAX_ERROR_CHARS // 4) if tb else tb,
    }


class Baseline:
    """Threads and child processes that existed before the attempt: the app's, not its.

    An app may start a thread or a helper process at import (a metrics exporter, an SDK);
    that is not work a handler left behind, must not be reported, and must not make every
    attempt replace the child.
    """

    def __init__(self) -> None:
        self.threads = frozenset(threading.enumerate())
        self.processes = frozenset(_descendants())


def _has_children() -> bool:
    """Whether this process has any child, running or exited, in one cheap system call.

    No child means no descendant at all (as a subreaper, orphans come back to us as
    children), so the common case skips psutil's scan of every process on the host.
    """
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def _descendants(recursive: bool = True) -> list[psutil.Process]:
    if not _has_children():
        return []
    try:
        return psutil.Process().children(recursive=recursive)
    except psutil.Error:
        return []


def _leftovers(watchdog: threading.Thread, baseline: Baseline) -> list[str]:
    """Threads and processes the handler started and left running."""
    found = []
    for t in threading.enumerate():
        if t is threading.main_thread() or t is watchdog or not t.is_alive() or t in baseline.threads:
            continue
        found.append(f"thread {t.name!r}")
    for p in _descendants():
        if p in baseline.processes:
            continue
        try:
            found.append(f"process {p.pid} ({' '.join(p.cmdline())[:120] or p.name()})")
        except psutil.Error:  # gone, or a zombie: it runs nothing
            continue
    return found


def _reap_zombies(baseline: Baseline) -> None:
    """Reap children that exited (the handler's, or orphans adopted as subreaper).

    Only after the attempt, so a handler that waits for its own subprocess is never robbed
    of its exit status; never the app's own helpers, which their owners wait for.
    """
    for p in _descendants(recursive=False):
        if p in baseline.processes:
            continue
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                continue
            os.waitpid(p.pid, os.WNOHANG)
        except (psutil.Error, ChildProcessError):
            continue


def run_attempt(
    registry: Registry, msg: Message, channel: Channel, watchdog: Watchdog
) -> tuple[Message, bool]:
    """Run one attempt; returns the result message and whether this child must exit."""
    job_id = int(msg["job_id"])
    job = str(msg["job"])
    reg = registry.registrations.get(job)
    must_exit = False

    def sink(pct: float, text: str) -> None:
        value: float | str = pct if math.isfinite(pct) else repr(pct)
        channel.send({"t": "checkpoint", "job_id": job_id, "pct": value, "msg": text})

    ctx = JobContext(
        job_id=job_id,
        job=job,
        queue=str(msg["queue"]),
        attempt=int(msg["attempt"]),
        max_attempts=int(msg["max_attempts"]),
        deadline=datetime.fromisoformat(str(msg["deadline"])),
        logger=logging.getLogger(f"atlantis.job.{job}"),
        database_url=msg.get("database_url"),
        _sink=sink,
    )
    baseline = Baseline()
    owner = os.getpid()
    watchdog.attempt_started(ctx)
    result: Message = {"t": "done", "job_id": job_id, "outcome": "complete"}
    try:
        if reg is None:
            raise Discard(f"no handler registered for {job} in this app")
        args = reg.args_type(**msg["args"])
        ret = reg.handler(ctx, args)
        if inspect.isawaitable(ret):
            asyncio.run(_await(ret))
    except Discard as exc:
        result.update(outcome="discard", error=_error("discarded", exc.reason))
    except Snooze as exc:
        result.update(outcome="snooze", delay=exc.seconds)
    except Terminated as exc:
        ctx._cancelled = True
        result.update(outcome="failed", error=_error("terminated", "terminated by SIGTERM", exc))
        must_exit = True
    except SystemExit as exc:
        result.update(outcome="failed", error=_error("exit", f"handler called sys.exit({exc.code})", exc))
    except BaseException as exc:  # a handler's failure, whatever it is, fails the attempt
        result.update(outcome="failed", error=_error("exception", _describe(exc), exc))
    finally:
        if os.getpid() != owner:
            # A process the handler forked returned into this loop (os.fork() without
            # os._exit): it must not report a second result on the shared pipe, nor wait
            # for work with no watchdog thread (threads do not survive a fork).
            _exit_now(0)
        ctx.flush()
    leftovers = _leftovers(watchdog, baseline)
    if leftovers:
        result["leftovers"] = leftovers
        _kill_descendants(baseline.processes)
        must_exit = True  # threads cannot be killed: replace the process
    else:
        _reap_zombies(baseline)
    watchdog.attempt_ended()
    return result, must_exit


async def _await(aw: Any) -> None:
    await aw


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="atlantis-child")
    parser.add_argument("--app", required=True)
    parser.add_argument("--control-fd", type=int, required=True)
    parser.add_argument("--events-fd", type=int, required=True)
    opts = parser.parse_args(argv)
    _die_with_parent()
    for fd in (opts.control_fd, opts.events_fd):
        os.set_inheritable(fd, False)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    try:
        registry = load_app(opts.app)
    except ConfigurationError as exc:
        Channel(opts.events_fd).send({"t": "fatal", "error": str(exc)})
        return EXIT_APP_ERROR
    return serve(registry, opts.control_fd, opts.events_fd)


def serve(registry: Registry, control_fd: int, events_fd: int) -> int:
    """Announce readiness, then run attempts until the control pipe closes.

    Also the entry point of a worker forked by the zygote, with the app already imported.
    """
    channel = Channel(events_fd)
    _adopt_orphans()
    # Every process started from here on inherits this mark: should this process die
    # before it could clean up (a crash, os._exit, SIGKILL), the supervisor finds by it the
    # descendants that left the process group and were re-parented away.
    tree = secrets.token_hex(8)
    os.environ[TREE_VARIABLE] = tree

    def on_term(signum: int, frame: object) -> None:
        raise Terminated()

    watchdog = Watchdog(control_fd)
    watchdog.start()
    channel.send({"t": "ready", "pid": os.getpid(), "tree": tree})
    while True:
        # SIGTERM between attempts ends the child quietly; during one it fails the attempt.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        msg = watchdog.runs.get()
        if msg is None:
            return 0
        signal.signal(signal.SIGTERM, on_term)
        try:
            result, must_exit = run_attempt(registry, msg, channel, watchdog)
        except Terminated:
            return 0
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        channel.send(result)
        if result.get("leftovers"):
            # A leftover thread cannot be stopped, and a normal exit would wait for every
            # non-daemon one: leave at once (the supervisor starts a replacement).
            _exit_now(0)
        if must_exit:
            return 0
