"""Test app (hostile): handlers that misbehave on purpose, for containment tests.

``hostile.Misbehave {mode, key}`` does what ``mode`` says; the expected ``Done`` (or end
of the child) is given for each. "Survives" means the child then serves the next ``Run``.

Failures the child reports and survives:

- ``ok``: returns; ``complete``.
- ``discard-int``: ``raise Discard(123)``; ``discard``, kind ``discarded``, message ``123``.
- ``discard-none``: ``raise Discard(None)``; ``discard``, message ``discarded by handler``.
- ``unprintable``: raises an exception whose ``__str__`` and ``__repr__`` raise;
  ``failed``, kind ``exception``, message ``UnprintableError: <unprintable UnprintableError>``.
- ``odd-class``: raises an exception whose metaclass makes ``__name__`` raise and whose
  ``__class__`` raises; ``failed``, kind ``exception``, message ``OddError: odd``.
- ``evil-str``: raises an exception whose ``__str__`` returns a str subclass whose
  methods (``replace``, ``encode``, slicing, ``__str__``...) raise; ``failed``, kind
  ``exception``, message ``EvilStrError: evil``.
- ``surrogate``: ``raise ValueError("bad \\ud800 value")``; ``failed``, message
  ``ValueError: bad \\\\ud800 value`` (the lone surrogate escaped).
- ``nul``: ``raise ValueError("nul \\x00 byte")``; ``failed``, message ``ValueError: nul  byte``.
- ``huge-error``: raises a ValueError of 10 MB; ``failed``, message clipped to about 64 KiB.
- ``control-chars``: raises a ValueError of a million ``\x01`` (each one six bytes once
  JSON-escaped); ``failed``, message clipped, the frame still within the limit.
- ``keyboard-interrupt`` / ``generator-exit``: raises it; ``failed``, kind ``exception``,
  message ``KeyboardInterrupt`` / ``GeneratorExit``.
- ``exit3``: ``sys.exit(3)``; ``failed``, kind ``exit``, message ``handler called sys.exit(3)``.
- ``snooze-huge``: ``Snooze(1e13)``; ``snooze``, delay 315360000 (ten years; the supervisor
  clamps further).
- ``snooze-inf`` / ``snooze-nan`` / ``snooze-negative``: ``Snooze(inf)`` / ``Snooze(nan)`` /
  ``Snooze(-5)``; ``failed``, kind ``exception``, ``invalid Snooze(nan): ...``.
- ``checkpoint-nan``: ``ctx.checkpoint(nan, "nan")``, returns; a ``Checkpoint`` with ``pct``
  None, then ``complete``.
- ``checkpoint-inf``: ``ctx.checkpoint(inf, "inf")``, returns; ``pct`` 100, ``complete``.
- ``checkpoint-huge``: ``ctx.checkpoint(50, <10 MB>)``, returns; ``msg`` of 1024 characters.
- ``checkpoint-dirty``: ``ctx.checkpoint(50, "a\\x00b\\ud800c")``, returns; ``msg``
  ``ab\\\\ud800c``, ``complete``.
- ``checkpoint-unprintable``: ``ctx.checkpoint(50, <object whose __str__ raises>)``, ignoring
  whatever that returns or raises, then returns; ``complete`` (a checkpoint, if one is
  sent, says ``<unprintable>``).
- ``sleep``: sleeps up to 20 s; once ``ctx.cancelled`` turns true it raises
  ``Discard("saw the cancel")`` instead. For leases, cancels, SIGTERM and timeouts.
- ``announce-sleep``: prints ``handler ran: job N``, then does as ``sleep``.
- ``setsid``: ``os.setsid()``, returns; ``complete``. Only a child that does not lead its
  own session can: it then reports ``retire`` (out of reach of a kill of its group) and
  exits 0. In one that does (as every supervised child), ``failed`` with PermissionError.
- anything else: ``raise ValueError("unknown mode ...")``.

Faults that end the child, loudly:

- ``close-fds``: ``os.closerange(3, 65536)``, returns; the child cannot send its ``Done``:
  it exits with code 4 (``EXIT_PROTOCOL``), stderr saying "lost its events pipe".
- ``close-fds-sleep``: ``os.closerange(3, 65536)``, then sleeps 20 s; the watchdog notices
  within about a second and kills the tree (SIGKILL), stderr saying "lost its control pipe".
- ``kill-watchdog``: raises RuntimeError inside the child's watchdog thread
  (``PyThreadState_SetAsyncExc``), then sleeps 20 s; the watchdog kills the tree within about
  a second, stderr saying "the child's watchdog failed".

``hostile.ArgsBoom`` has an args type whose constructor raises: ``failed``, kind ``args``.
``hostile.Noop`` returns.
"""

from __future__ import annotations

import ctypes
import math
import os
import sys
import threading
import time
from typing import Any

import atlantis

registry = atlantis.Registry.from_atl("hostile.atl")


class UnprintableError(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str for you")

    def __repr__(self) -> str:
        raise RuntimeError("no repr for you")


class _OddMeta(type):
    @property
    def __name__(cls) -> str:  # type: ignore[override]
        raise RuntimeError("no name for you")


class OddError(Exception, metaclass=_OddMeta):
    @property  # type: ignore[misc]
    def __class__(self) -> type:
        raise RuntimeError("no class for you")


class _EvilStr(str):
    def _refuse(self, *args: object, **kwargs: object) -> Any:
        raise RuntimeError("evil")

    replace = encode = __getitem__ = __str__ = __len__ = __iter__ = __contains__ = _refuse


class EvilStrError(Exception):
    def __str__(self) -> str:
        return _EvilStr("evil")


class _Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no str for you")

    __repr__ = __str__


_RAISES: dict[str, Any] = {
    "discard-int": lambda: atlantis.Discard(123),  # type: ignore[arg-type]
    "discard-none": lambda: atlantis.Discard(None),  # type: ignore[arg-type]
    "unprintable": UnprintableError,
    "odd-class": lambda: OddError("odd"),
    "evil-str": EvilStrError,
    "surrogate": lambda: ValueError("bad \ud800 value"),
    "nul": lambda: ValueError("nul \x00 byte"),
    "huge-error": lambda: ValueError("x" * 10_000_000),
    "control-chars": lambda: ValueError("\x01" * 1_000_000),
    "keyboard-interrupt": KeyboardInterrupt,
    "generator-exit": GeneratorExit,
    "snooze-huge": lambda: atlantis.Snooze(1e13),
    "snooze-inf": lambda: atlantis.Snooze(math.inf),
    "snooze-nan": lambda: atlantis.Snooze(math.nan),
    "snooze-negative": lambda: atlantis.Snooze(-5),
}

_CHECKPOINTS: dict[str, tuple[float, Any]] = {
    "checkpoint-nan": (math.nan, "nan"),
    "checkpoint-inf": (math.inf, "inf"),
    "checkpoint-huge": (50, "y" * 10_000_000),
    "checkpoint-dirty": (50, "a\x00b\ud800c"),
    "checkpoint-unprintable": (50, _Unprintable()),
}


@registry.handler("hostile.Noop")
def noop(ctx: atlantis.JobContext, args: object) -> None:
    return None


@registry.handler("hostile.Misbehave")
def misbehave(ctx: atlantis.JobContext, args: Any) -> None:
    mode = args.mode
    if mode == "ok":
        return
    if mode == "announce":
        print(f"handler ran: job {ctx.job_id}", flush=True)
        return
    if mode in _RAISES:
        raise _RAISES[mode]()
    if mode == "exit3":
        sys.exit(3)
    if mode in _CHECKPOINTS:
        pct, msg = _CHECKPOINTS[mode]
        try:
            ctx.checkpoint(pct, msg)
        except Exception:  # see checkpoint-unprintable
            pass
        return
    if mode == "announce-sleep":
        print(f"handler ran: job {ctx.job_id}", flush=True)
        mode = "sleep"
    if mode == "sleep":
        end = time.monotonic() + 20
        while time.monotonic() < end:
            if ctx.cancelled:
                raise atlantis.Discard("saw the cancel")
            time.sleep(0.01)
        return
    if mode == "kill-watchdog":
        for thread in threading.enumerate():
            if thread.name == "atlantis-watchdog" and thread.ident is not None:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(
                    ctypes.c_ulong(thread.ident), ctypes.py_object(RuntimeError))
        time.sleep(20)
        return
    if mode == "setsid":
        os.setsid()
        return
    if mode == "uses-asyncio":  # a module the zygote loads for later workers once asked
        import asyncio  # noqa: F401
        return
    if mode in ("close-fds", "close-fds-sleep"):
        os.closerange(3, 65536)
        if mode == "close-fds-sleep":
            time.sleep(20)
        return
    raise ValueError(f"unknown mode {mode!r}")


class _RefusingArgs:
    def __init__(self, **fields: object) -> None:
        raise RuntimeError("these args are not for me")


registry.register("hostile.ArgsBoom", noop, args_type=_RefusingArgs)
