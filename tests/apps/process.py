"""Handlers that exercise the supervisor: kill trees, memory, leftovers, output."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
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
