"""Handlers for the supervisor's containment tests (tests/test_containment.py).

``contain.Act`` does what its ``mode`` says:

- ``ok``: records ``ran``.
- ``env``: records the database URL it was given and whether any ``PG*`` variable or the
  supervisor's own URL reached it (``url=...``, ``pg=...``, ``ctx=...``).
- ``forge-release`` / ``forge-attempt`` / ``oversize``: writes a forged frame straight onto
  the events pipe (a result claiming ``release``; one overwriting the attempt number; a
  header announcing a 64 MiB frame), then sleeps.
- ``checkpoint-nul``: a checkpoint whose message holds NUL and a lone surrogate, then returns.
- ``snooze-huge``: ``raise Snooze(1e13)``.
- ``snooze-nan`` / ``snooze-inf`` / ``snooze-negative``: ``raise Snooze(nan | inf | -1)``.
- ``nul-error``: ``raise ValueError("bad\\x00byte")``.
- ``chatty``: prints 5,000 lines as fast as it can.
- ``os-exit``: ``os._exit(5)``; ``segv``: reads address 0 through ctypes (SIGSEGV);
  ``recursion``: recurses until Python's limit; ``unpicklable``: raises an exception that
  holds a lock and refuses to be pickled; ``binary``: writes bytes that are not UTF-8 (and a
  NUL) to stdout, then returns; ``checkpoint-nan-huge``: ``checkpoint(nan, <10 MB>)``,
  then returns.
- ``forkbomb``: a bounded fork bomb: forks 2,500 processes that sleep, each marked with
  ``BOMB=<key>`` in its environment (for the test to look for survivors).
- ``slow-threads``: a tree that grows slowly: a sleeping thread every 5 ms, 300 of them,
  then sleeps (the task limit must still catch it, however seldom its tree is counted).

``contain.Stuck`` records ``started`` and sleeps past its 2 s timeout (the test stops it
with SIGSTOP to make it stop reading its control pipe). ``contain.Fails`` always raises.
"""

from __future__ import annotations

import ctypes
import math
import os
import struct
import sys
import threading
import time
from typing import Any

import orjson

import atlantis
from tests.apps.basic import record

registry = atlantis.Registry.from_atl("contain.atl")


def _events_fd() -> int:
    return int(sys.argv[sys.argv.index("--events-fd") + 1])


def _forge(body: dict[str, Any] | None, size: int | None = None) -> None:
    data = orjson.dumps(body) if body is not None else b""
    os.write(_events_fd(), struct.pack(">I", size if size is not None else len(data)) + data)


class UnpicklableError(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.lock = threading.Lock()

    def __reduce__(self) -> Any:
        raise TypeError("UnpicklableError cannot be pickled")


def _recurse(n: int) -> int:
    return _recurse(n + 1) + 1


_BAD_SNOOZES = {"snooze-nan": math.nan, "snooze-inf": math.inf, "snooze-negative": -1}


@registry.handler("contain.Act")
def act(ctx: atlantis.JobContext, args: Any) -> None:
    mode = args.mode
    if mode == "env":
        pg = sorted(k for k in os.environ if k.startswith("PG"))
        record(ctx, args.key, f"url={os.environ.get('ATLANTIS_DATABASE_URL')}")
        record(ctx, args.key, f"pg={','.join(pg)}")
        record(ctx, args.key, f"ctx={ctx.database_url}")
        record(ctx, args.key, f"repr={ctx!r}")
        return
    record(ctx, args.key, "ran")
    if mode == "forge-release":
        _forge({"t": "done", "job_id": ctx.job_id, "outcome": "release"})
        time.sleep(30)
    elif mode == "forge-attempt":
        _forge({"t": "done", "job_id": ctx.job_id, "outcome": "failed", "attempt": 99})
        time.sleep(30)
    elif mode == "oversize":
        _forge(None, size=64 * 1024 * 1024)
        time.sleep(30)
    elif mode == "checkpoint-nul":
        atlantis.checkpoint(ctx, 40, "half\x00way \ud800 there")
    elif mode == "snooze-huge":
        raise atlantis.Snooze(1e13)
    elif mode in _BAD_SNOOZES:
        raise atlantis.Snooze(_BAD_SNOOZES[mode])
    elif mode == "nul-error":
        raise ValueError("bad\x00byte")
    elif mode == "os-exit":
        os._exit(5)
    elif mode == "segv":
        ctypes.string_at(0)
    elif mode == "recursion":
        _recurse(0)
    elif mode == "unpicklable":
        raise UnpicklableError("holds a lock")
    elif mode == "binary":
        sys.stdout.flush()
        os.write(1, b"\xff\xfe binary \x00 out\n")
    elif mode == "checkpoint-nan-huge":
        atlantis.checkpoint(ctx, math.nan, "y" * 10_000_000)
    elif mode == "forkbomb":
        os.environ["BOMB"] = args.key
        for _ in range(2500):
            if os.fork() == 0:
                time.sleep(60)
                os._exit(0)
        time.sleep(30)
    elif mode == "slow-threads":
        for _ in range(300):
            threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
            time.sleep(0.005)
        time.sleep(30)
    elif mode == "chatty":
        for i in range(5000):
            print(f"line {i}")


@registry.handler("contain.Stuck")
def stuck(ctx: atlantis.JobContext, args: Any) -> None:
    record(ctx, args.key, "started")
    time.sleep(60)


@registry.handler("contain.Fails")
def fails(ctx: atlantis.JobContext, args: Any) -> None:
    raise RuntimeError(f"failure {ctx.attempt}")
