"""The child process: load the app once, then run one attempt at a time.

Two threads: the main thread runs handlers; the watchdog thread owns the control pipe. The
watchdog enforces the lease on its own: if no renewal arrives before the lease's end minus
a margin (the supervisor may be paused, swapped out or wedged), it kills this process
group, so the attempt is dead before any other worker may claim the row. It also kills the
group when the control pipe reaches EOF (the supervisor died).
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
EXIT_APP_ERROR = 3


class Terminated(BaseException):
    """SIGTERM reached the attempt (timeout, cancel or drain); lets ``finally`` blocks run."""


def _die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when the supervisor dies."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux
        pass
    if os.getppid() == 1:  # the parent died before prctl took effect
        os._exit(1)


def _kill_group() -> None:
    """SIGKILL everything in this process group, this process included."""
    sys.stderr.flush()
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


def _error(kind: str, message: str, exc: BaseException | None = None) -> dict[str, Any]:
    tb = "".join(traceback.format_exception(exc)) if exc is not None else None
    return {"kind": kind, "message": message, "traceback": tb}


def _leftovers(watchdog: threading.Thread) -> list[str]:
    """Threads and processes the handler started and left running."""
    found = []
    for t in threading.enumerate():
        if t is threading.main_thread() or t is watchdog or not t.is_alive():
            continue
        found.append(f"thread {t.name!r}")
    for p in psutil.Process().children(recursive=True):
        try:
            found.append(f"process {p.pid} ({' '.join(p.cmdline())[:120] or p.name()})")
        except psutil.Error:
            continue
    return found


def _kill_descendants() -> None:
    for p in psutil.Process().children(recursive=True):
        try:
            p.kill()
        except psutil.Error:
            pass


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
        result.update(outcome="failed", error=_error("exception", f"{type(exc).__name__}: {exc}", exc))
    finally:
        ctx.flush()
    leftovers = _leftovers(watchdog)
    if leftovers:
        result["leftovers"] = leftovers
        _kill_descendants()
        must_exit = True  # threads cannot be killed: replace the process
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

    def on_term(signum: int, frame: object) -> None:
        raise Terminated()

    watchdog = Watchdog(control_fd)
    watchdog.start()
    channel.send({"t": "ready", "pid": os.getpid()})
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
        if must_exit:
            return 0
