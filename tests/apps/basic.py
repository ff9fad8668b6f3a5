"""Handlers that record what they did in ``test_events`` so tests can check side effects."""

from __future__ import annotations

import ctypes
import math
import os
import signal
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

import atlantis

if TYPE_CHECKING:
    import psycopg

registry = atlantis.Registry.from_atl("jobs.atl")

EVENTS_DDL = """
CREATE TABLE IF NOT EXISTS test_events (
    id bigserial PRIMARY KEY,
    job_id bigint NOT NULL,
    attempt int NOT NULL,
    key text NOT NULL,
    event text NOT NULL,
    pid int NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""


def connect(ctx: atlantis.JobContext) -> psycopg.Connection[Any]:
    """An autocommit connection of the handler's own to the jobs' database. psycopg is
    imported here, by the first handler that writes, not with the app: a child that runs
    no such handler starts without it (some 90 ms of CPU, in each of the suite's
    thousand-odd children)."""
    import psycopg

    assert ctx.database_url is not None
    return psycopg.connect(ctx.database_url, autocommit=True)


def record(ctx: atlantis.JobContext, key: str, event: str, pid: int | None = None) -> None:
    """Write an event on the handler's own connection (never one the supervisor holds)."""
    with connect(ctx) as conn:
        conn.execute(
            "INSERT INTO test_events (job_id, attempt, key, event, pid) VALUES (%s, %s, %s, %s, %s)",
            (ctx.job_id, ctx.attempt, key, event, pid or os.getpid()),
        )


def runs(ctx: atlantis.JobContext, key: str) -> int:
    with connect(ctx) as conn:
        row = conn.execute("SELECT count(*) FROM test_events WHERE key = %s", (key,)).fetchone()
    return int(row[0]) if row else 0


@registry.handler("tests.Echo")
def echo(ctx: atlantis.JobContext, args: Any) -> None:
    print(f"echo {args.key} {args.value}")
    record(ctx, args.key, "ran")


@registry.handler("tests.Sleep")
def sleep(ctx: atlantis.JobContext, args: Any) -> None:
    record(ctx, args.key, "started")
    retry = getattr(args, "retry_seconds", None)  # tests.SleepSteady has none
    seconds = retry if retry is not None and ctx.attempt > 1 else args.seconds
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if args.checkpoint:
            ctx.checkpoint(50, "sleeping")
        time.sleep(0.05)
    record(ctx, args.key, "finished")


registry.handler("tests.SleepSteady")(sleep)


@registry.handler("tests.Fail")
def fail(ctx: atlantis.JobContext, args: Any) -> None:
    record(ctx, args.key, "ran")
    if args.mode == "raise":
        raise ValueError(f"bad value in attempt {ctx.attempt}")
    if args.mode == "exit":
        os._exit(args.code)
    if args.mode == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
        ctypes.string_at(0)
    if args.mode == "discard":
        raise atlantis.Discard("not worth retrying")
    if args.mode == "snooze" and runs(ctx, args.key) == 1:
        raise atlantis.Snooze(0.2)  # spends no attempt: the second run is attempt 1 again
    if args.mode == "flaky" and ctx.attempt < 2:
        raise RuntimeError("first attempt fails")


@registry.handler("tests.Checkpoints")
async def checkpoints(ctx: atlantis.JobContext, args: Any) -> None:
    errors = 0
    for i in range(args.count):
        if atlantis.checkpoint(ctx, i * 100 / max(args.count, 1), f"step {i}") is not None:
            errors += 1
    final = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}.get(args.special or "", args.pct)
    if final is not None or args.msg is not None:
        if atlantis.checkpoint(ctx, final, args.msg or "") is not None:
            errors += 1
    if args.then_sleep:
        import asyncio

        await asyncio.sleep(args.then_sleep)
    record(ctx, args.key, f"errors={errors}")


@registry.handler("tests.Slow")
def slow(ctx: atlantis.JobContext, args: Any) -> None:
    """Outlives its 1s timeout; ``stubborn`` ignores SIGTERM and leaves a grandchild."""
    if args.mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        grandchild = subprocess.Popen(
            [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"]
        )
        record(ctx, args.key, f"grandchild={grandchild.pid}")
    record(ctx, args.key, "started")
    end = time.monotonic() + 60
    while time.monotonic() < end:
        try:
            time.sleep(0.05)
        except BaseException:
            if args.mode != "stubborn":
                raise


@registry.handler("tests.Typed")
def typed(ctx: atlantis.JobContext, args: Any) -> None:
    pass


#: A double-forked ``setsid`` grandchild that writes its pid to descriptor argv[1], then sits
#: in the same C call as its handler.
#: One C call of argv[2] seconds that holds the GIL and spends no CPU (as
#: :func:`hold_the_gil`), in a double-forked grandchild that left the process group.
_CRUNCHING_GRANDCHILD = """
import ctypes, os, signal, sys
os.setsid()
if os.fork():
    os._exit(0)
fd = int(sys.argv[1])
os.write(fd, str(os.getpid()).encode())
os.close(fd)
signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
ctypes.PyDLL(None).sleep(int(sys.argv[2]))
"""


def hold_the_gil(seconds: int) -> None:
    """One C call of ``seconds`` that holds the GIL, as a long computation in C does (the
    issue's case: decimal's ln at 20,000 digits), without spending the CPU one would: libc's
    ``sleep`` called through ``ctypes.PyDLL`` (whose calls keep the GIL), with this thread's
    signals blocked for its length, so that a signal neither ends it early nor runs a
    Python handler before it returns (SIGKILL and SIGSTOP still act at once)."""
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    try:
        ctypes.PyDLL(None).sleep(seconds)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


@registry.handler("tests.Crunch")
def crunch(ctx: atlantis.JobContext, args: Any) -> None:
    """One long C call holding the GIL (:func:`hold_the_gil`), recorded before and after."""
    seconds = args.seconds if ctx.attempt == 1 else args.retry_seconds
    if args.grandchild:
        r, w = os.pipe()
        subprocess.run([sys.executable, "-c", _CRUNCHING_GRANDCHILD, str(w), str(seconds)],
                       pass_fds=(w,), check=True)
        os.close(w)
        with os.fdopen(r, "rb") as f:
            record(ctx, args.key, "grandchild", int(f.read()))
    record(ctx, args.key, "before")
    hold_the_gil(seconds)
    record(ctx, args.key, "after")
