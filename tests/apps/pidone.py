"""An app for a supervisor that is PID 1 of its PID namespace (tests/test_pid_one.py)."""

from __future__ import annotations

import ctypes
import os
import time
from typing import Any

import atlantis

registry = atlantis.Registry.from_atl("pidone.atl")

_PR_SET_CHILD_SUBREAPER = 36


@registry.handler("pidone.Orphan")
def orphan(ctx: atlantis.JobContext, args: Any) -> None:
    """Fork a process that forks a grandchild and exits at once; the grandchild exits too,
    and is re-parented to PID 1 as a zombie. The child, a subreaper, would adopt it:
    it stops being one for the moment."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
    try:
        middle = os.fork()
        if middle == 0:
            try:
                grandchild = os.fork()
                if grandchild == 0:
                    os._exit(0)
                with open(args.path, "w") as f:
                    f.write(str(grandchild))
            finally:
                os._exit(0)
        os.waitpid(middle, 0)
    finally:
        prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


@registry.handler("pidone.Daemon")
def daemon(ctx: atlantis.JobContext, args: Any) -> None:
    """Double-fork a daemon (a session of its own) that sleeps until ``args.release``
    exists, and return at once: it outlives the attempt, re-parented to PID 1, which must
    reap it when it ends. Not a subreaper meanwhile, as in :func:`orphan`."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
    try:
        middle = os.fork()
        if middle == 0:
            try:
                if os.fork() == 0:
                    os.setsid()
                    os.execv("/bin/sh", ["sh", "-c", 'while [ ! -e "$0" ]; do sleep 0.05; done',
                                         args.release])
            finally:
                os._exit(0)
        os.waitpid(middle, 0)
    finally:
        prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


@registry.handler("pidone.Hold")
def hold(ctx: atlantis.JobContext, args: Any) -> None:
    """Say it runs (the file ``args.path`` + ``.started``), then run until the file
    ``args.path`` exists (the test creates it during the drain)."""
    with open(f"{args.path}.started", "w"):
        pass
    while not os.path.exists(args.path):
        time.sleep(0.05)
