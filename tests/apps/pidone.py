"""An app for a supervisor that is PID 1 of its PID namespace (tests/test_pid_one.py)."""

from __future__ import annotations

import ctypes
import os
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
