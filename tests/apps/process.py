"""Handlers that exercise the supervisor: kill trees, memory, leftovers, output."""

from __future__ import annotations

import ctypes
import io
import json
import logging
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import atlantis
from tests.apps.basic import record

registry = atlantis.Registry.from_atl("process.atl")

# A thread the app starts at import, as metrics exporters and SDKs do: it belongs to the
# process, not to any attempt, so it must never count as work a handler left behind.
threading.Thread(target=threading.Event().wait, name="app-background", daemon=True).start()

#: A python process that ignores SIGTERM and waits; only SIGKILL ends it.
STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"
#: Detaches like a daemon: new session, double fork, prints the survivor's pid, parent exits.
DAEMON = (
    "import os, signal, sys, time\n"
    "os.setsid()\n"
    "if os.fork():\n"
    "    os._exit(0)\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print(os.getpid(), flush=True)\n"
    "sys.stdout.close()\n"
    "time.sleep(300)\n"
)


def spawn_escapees() -> dict[str, int]:
    """Start descendants that try every ordinary way to outlive the attempt."""
    stubborn = subprocess.Popen([sys.executable, "-c", STUBBORN])
    detached = subprocess.Popen([sys.executable, "-c", STUBBORN], start_new_session=True)
    daemonizer = subprocess.Popen([sys.executable, "-c", DAEMON], stdout=subprocess.PIPE)
    assert daemonizer.stdout is not None
    daemon = int(daemonizer.stdout.readline())
    daemonizer.stdout.close()
    daemonizer.wait()
    return {"stubborn": stubborn.pid, "detached": detached.pid, "daemon": daemon}


@registry.handler("proc.Noop")
def noop(ctx: atlantis.JobContext, args: Any) -> None:
    record(ctx, args.key, f"pid={os.getpid()}")


@registry.handler("proc.Escape")
def escape(ctx: atlantis.JobContext, args: Any) -> None:
    """Ignores SIGTERM itself, so only the supervisor's SIGKILL of the tree ends it."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    pids = spawn_escapees()
    record(ctx, args.key, " ".join(f"{k}={v}" for k, v in pids.items()))
    time.sleep(300)


@registry.handler("proc.Hog")
def hog(ctx: atlantis.JobContext, args: Any) -> None:
    record(ctx, args.key, f"pid={os.getpid()}")
    chunks = []
    for _ in range(args.mb):
        chunks.append(b"\x01" * (1 << 20))  # written, hence resident (unlike calloc'd zeros)
        time.sleep(0.01)
    record(ctx, args.key, "allocated")
    time.sleep(300)


@registry.handler("proc.Leaver")
def leaver(ctx: atlantis.JobContext, args: Any) -> None:
    threading.Thread(target=time.sleep, args=(300,), name="lingerer").start()  # not a daemon
    sleeper = subprocess.Popen(["sleep", "300"])
    record(ctx, args.key, f"pid={os.getpid()} sleep={sleeper.pid}")


@registry.handler("proc.Nap")
def nap(ctx: atlantis.JobContext, args: Any) -> None:
    record(ctx, args.key, f"started pid={os.getpid()}")
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        time.sleep(0.05)
    record(ctx, args.key, f"finished pid={os.getpid()}")


@registry.handler("proc.Chatty")
def chatty(ctx: atlantis.JobContext, args: Any) -> None:
    record(ctx, args.key, "started")
    out = sys.stdout.buffer
    out.write(b"chatty-begin\n")
    line = b"x" * (args.width - 1) + b"\n"
    for _ in range(args.lines):
        out.write(line)
    out.write(b"garbage \xff\xfe\xc3( end\n")
    out.flush()
    sys.stderr.write("chatty-stderr\n")
    print("chatty-end", flush=True)
    out.write(b"chatty-tail-without-newline")  # the last thing before returning
    out.flush()


@registry.handler("proc.Bulky")
def bulky(ctx: atlantis.JobContext, args: Any) -> None:
    record(ctx, args.key, f"blob={len(args.blob)}")
    atlantis.checkpoint(ctx, 50, "m" * (args.error_mb << 20))
    raise ValueError("E" * (args.error_mb << 20))


@registry.handler("proc.Hold")
def hold(ctx: atlantis.JobContext, args: Any) -> None:
    pids = spawn_escapees()
    record(ctx, args.key, f"child={os.getpid()} " + " ".join(f"{k}={v}" for k, v in pids.items()))
    time.sleep(300)


@registry.handler("proc.Fork")
def fork(ctx: atlantis.JobContext, args: Any) -> None:
    """The careless fork: the copy falls back into the child's loop after returning."""
    pid = os.fork()
    if pid == 0:
        record(ctx, args.key, f"copy={os.getpid()}")
        return
    record(ctx, args.key, f"original={os.getpid()} copy={pid}")
    os.waitpid(pid, 0)  # the copy must end as soon as it returns
    record(ctx, args.key, "original-finished")


@registry.handler("proc.Crash")
def crash(ctx: atlantis.JobContext, args: Any) -> None:
    """No cleanup can run in this process: only the supervisor can still find the escapees."""
    pids = spawn_escapees()
    record(ctx, args.key, " ".join(f"{k}={v}" for k, v in pids.items()))
    os._exit(3)


def _ignore_sigterm_in_c() -> None:
    """As a C library would: SIGTERM ignored through libc, behind Python's back."""
    libc = ctypes.CDLL(None)
    libc.signal.restype = ctypes.c_void_p
    libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.signal(signal.SIGTERM, 1)  # SIG_IGN


def _lower_nofile(hard: bool) -> None:
    soft, limit = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256 if hard else limit))


def _set_environ() -> None:
    os.environ["ATLANTIS_TEST_LEAK"] = "leaked"
    os.environ["PATH"] = "/nowhere"
    os.environ.pop("PYTHONUNBUFFERED", None)
    os.environ["TZ"] = "Asia/Tokyo"
    time.tzset()


def _close_stdio() -> None:
    for fd in (0, 1, 2):
        os.close(fd)


def _lose_stdout() -> None:
    """Close descriptor 1 and every other that names the same pipe: no copy is left."""
    target = os.readlink("/proc/self/fd/1")
    for name in os.listdir("/proc/self/fd"):
        try:
            if name != "1" and os.readlink(f"/proc/self/fd/{name}") == target:
                os.close(int(name))
        except OSError:  # the directory's own descriptor, gone once listed
            continue
    os.close(1)


def _leave_a_signal_pending() -> None:
    """SIGUSR1, whose default action ends the process, blocked and sent to this thread (a
    signal sent to the process would go to a thread that does not block it): it waits."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)


def _close_streams() -> None:
    sys.stdout.close()
    sys.stderr.close()


def _replace_streams() -> None:
    sys.stdout = io.StringIO()
    sys.stderr = io.StringIO()


#: What proc.Misuse does to its process, by mode, before it returns.
MISUSES: dict[str, Callable[[], object]] = {
    "close-stdio": _close_stdio,
    "replace-streams": _replace_streams,
    "close-streams": _close_streams,
    "lose-stdout": _lose_stdout,
    "nonblocking-stdout": lambda: os.set_blocking(1, False),
    "steal-sigterm": lambda: signal.signal(signal.SIGTERM, lambda signum, frame: None),
    "steal-sigterm-in-c": _ignore_sigterm_in_c,
    "signals": lambda: (signal.signal(signal.SIGCHLD, signal.SIG_IGN),
                        signal.signal(signal.SIGPIPE, signal.SIG_DFL),
                        signal.signal(signal.SIGINT, signal.SIG_IGN),
                        signal.signal(signal.SIGUSR1, lambda signum, frame: None)),
    "block-signals": lambda: signal.pthread_sigmask(
        signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT, signal.SIGUSR1}),
    "pending-signal": _leave_a_signal_pending,
    "alarm": lambda: signal.alarm(600),
    "itimers": lambda: (signal.setitimer(signal.ITIMER_VIRTUAL, 600),
                        signal.setitimer(signal.ITIMER_PROF, 600, 600)),
    "cwd": lambda: os.chdir(tempfile.gettempdir()),
    "umask": lambda: os.umask(0o077),
    "environ": _set_environ,
    "rlimit": lambda: _lower_nofile(hard=False),
    "rlimit-hard": lambda: _lower_nofile(hard=True),
    "setsid": os.setsid,
}


def _handler_of(signum: int) -> str:
    handler = signal.getsignal(signum)
    if handler in (signal.SIG_DFL, signal.SIG_IGN):
        return "default" if handler == signal.SIG_DFL else "ignore"
    return str(getattr(handler, "__qualname__", repr(handler)))


def look() -> dict[str, Any]:
    """What a handler sees of its process, all of it that a misuse above may change."""
    umask = os.umask(0o022)
    os.umask(umask)
    getsig = ctypes.pythonapi.PyOS_getsig
    getsig.restype = ctypes.c_void_p
    getsig.argtypes = [ctypes.c_int]
    return {
        "pid": os.getpid(),
        "stdio": [[os.fstat(fd).st_ino, os.get_blocking(fd)] for fd in (0, 1, 2)],
        "streams": [s is getattr(sys, f"__{n}__") and not s.closed
                    for n, s in (("stdin", sys.stdin), ("stdout", sys.stdout), ("stderr", sys.stderr))],
        "logging": [getattr(h, "stream", None) is sys.stderr for h in logging.getLogger().handlers],
        "handlers": {s.name: _handler_of(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD,
                                                      signal.SIGPIPE, signal.SIGUSR1, signal.SIGALRM)},
        "sigterm-in-c": getsig(signal.SIGTERM),
        "mask": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, ())),
        "timers": [signal.getitimer(w) != (0.0, 0.0)
                   for w in (signal.ITIMER_REAL, signal.ITIMER_VIRTUAL, signal.ITIMER_PROF)],
        "cwd": os.getcwd(),
        "umask": umask,
        "environ": dict(os.environ),
        "tzname": time.tzname,
        "nofile": resource.getrlimit(resource.RLIMIT_NOFILE),
        "session": [os.getsid(0), os.getpgrp()],
    }


@registry.handler("proc.Misuse")
def misuse(ctx: atlantis.JobContext, args: Any) -> None:
    record(ctx, args.key, f"pid={os.getpid()}")
    MISUSES[args.mode]()


@registry.handler("proc.Look")
def look_handler(ctx: atlantis.JobContext, args: Any) -> None:
    print(f"look {args.key} pid={os.getpid()}", flush=True)  # a closed stdout fails here
    record(ctx, args.key, json.dumps(look()))
    if not args.seconds:
        return
    try:
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:  # deaf to ctx.cancelled: only SIGTERM ends it early
            time.sleep(0.05)
    finally:
        record(ctx, args.key, "finally")
