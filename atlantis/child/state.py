"""The process state a reused child owns, and putting it back after every attempt.

A reused child (``--isolation reuse``) runs attempt after attempt in one process, so what
a handler does to the process itself would reach every later attempt: closed descriptors
0-2 fail every later ``print``, a SIGTERM handler a library installs keeps later attempts
from ever seeing their :class:`~atlantis.child.exits.Terminated`, an alarm left armed
kills the next attempt. :class:`ProcessState` notes, once the child is ready to serve,
what the child owns, and :meth:`ProcessState.restore` puts it back after each attempt,
before its ``Done`` goes out (so before the supervisor can send the next ``Run``):

- descriptors 0-2 (the same files, blocking: copies of them are kept above the low
  numbers a handler's files take) and ``sys.stdin``, ``sys.stdout`` and
  ``sys.stderr`` (the same objects, or new ones on descriptors 0-2 if they were closed);
- the disposition of every signal as Python's ``signal`` module sees it (SIGTERM, SIGINT,
  SIGCHLD, SIGPIPE, the parent-death signal...), and SIGTERM's C-level handler too, which
  a C library may replace without Python knowing (:data:`RELIED_ON`); the main thread's
  signal mask (a signal left pending while the handler blocked it is discarded, except
  SIGTERM and the parent-death signal);
- alarms and interval timers (``ITIMER_REAL``, ``ITIMER_VIRTUAL``, ``ITIMER_PROF``),
  except those the app itself had running;
- the working directory, the umask, ``os.environ`` and every rlimit;
- the session and process group, checked only in a child that does not lead its own
  session: one that does (every child a supervisor starts) can leave neither
  (``setsid`` and ``setpgid`` fail with EPERM).

What cannot be put back (a hard rlimit lowered without the privilege to raise it again,
a lost copy of a descriptor, another session) is returned as a reason: the child then
reports it with the attempt's result and exits, and the supervisor replaces it before it
could run another attempt.

Cost, in the usual case where nothing changed: about twenty cheap system calls (three
``dup2`` and ``F_GETFL`` for descriptors 0-2: cheaper than the ``fstat`` that would tell
whether they changed; three timers; the mask; one ``sigaction`` for SIGTERM; cwd; umask;
one read of ``/proc/self/limits`` for every rlimit) and a few comparisons in memory (every
signal's Python handler, ``os.environ``). Something is written back only when found
changed, except descriptors 0-2 and the umask, where writing costs no more than reading.
Measured with ``python -m benchmarks.restore``: 15-20 us of CPU in a warm loop, about 30
between real attempts (caches cold) on a busy 2-core VM where a no-op attempt costs its
child 110-170 us.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import importlib
import io
import logging
import os
import resource
import signal
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from atlantis.child.channel import identity
from atlantis.child.text import describe
from atlantis.child.tree import PARENT_DEATH_SIGNAL

# The C functions behind ``signal``'s: its wrappers turn every value into an enum, which
# made a sweep of every signal's handler cost ten times more.
_signal: Any = importlib.import_module("_signal")

#: Signals whose C-level handler is checked too: a C library may replace it behind
#: Python's back, and an attempt is ended by SIGTERM. (Each check is a ctypes call, the
#: dearest part of a restore: the others are left to Python's own view of their handlers.)
RELIED_ON: tuple[int, ...] = (signal.SIGTERM,)
#: Signals a handler left pending that must still be delivered once unblocked: a SIGTERM
#: ends the child after its result, the parent-death signal its tree.
KEEP_PENDING = frozenset(s for s in (signal.SIGTERM, PARENT_DEATH_SIGNAL) if s is not None)
_TIMERS = (signal.ITIMER_REAL, signal.ITIMER_VIRTUAL, signal.ITIMER_PROF)
_LIMITS = tuple(sorted({getattr(resource, name) for name in dir(resource)
                        if name.startswith("RLIMIT_")}))
_STREAMS = (("stdin", 0), ("stdout", 1), ("stderr", 2))


def _c_handler() -> Callable[[int], int | None] | None:
    """``PyOS_getsig``: the C-level handler of a signal (one ``sigaction`` call)."""
    try:
        getsig = ctypes.pythonapi.PyOS_getsig
    except AttributeError:  # not CPython
        return None
    getsig.restype = ctypes.c_void_p
    getsig.argtypes = [ctypes.c_int]
    return getsig


_getsig = _c_handler()


class UnrestorableError(Exception):
    """The process cannot be put back as it was: the child must be replaced."""


class _Stream:
    """One of ``sys.stdin``/``stdout``/``stderr`` as it was, and how to make it again."""

    def __init__(self, name: str, fd: int) -> None:
        self.name = name
        self.fd = fd
        self.obj: TextIO = getattr(sys, name)
        self.encoding = getattr(self.obj, "encoding", None) or "utf-8"
        self.errors = getattr(self.obj, "errors", None) or "strict"
        self.line_buffering = bool(getattr(self.obj, "line_buffering", False))
        self.write_through = bool(getattr(self.obj, "write_through", False))
        self.unbuffered = isinstance(getattr(self.obj, "buffer", None), io.RawIOBase)

    def intact(self) -> bool:
        return getattr(sys, self.name) is self.obj and not self.obj.closed

    def restore(self) -> None:
        if self.obj.closed:  # a handler closed it: one like it, on the same descriptor
            old, self.obj = self.obj, self._reopen()
            _repoint_logging(old, self.obj)
            setattr(sys, f"__{self.name}__", self.obj)
        setattr(sys, self.name, self.obj)

    def _reopen(self) -> TextIO:
        reading = self.fd == 0
        raw = io.FileIO(self.fd, "r" if reading else "w", closefd=False)
        buffer: Any
        if reading:
            buffer = io.BufferedReader(raw)
        else:
            buffer = raw if self.unbuffered else io.BufferedWriter(raw)
        return io.TextIOWrapper(buffer, encoding=self.encoding, errors=self.errors,
                                line_buffering=self.line_buffering,
                                write_through=self.write_through)


def _repoint_logging(old: TextIO, new: TextIO) -> None:
    """Logging handlers that wrote to a stream a handler closed write to its successor."""
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    for logger in loggers:
        for handler in getattr(logger, "handlers", ()):
            if isinstance(handler, logging.StreamHandler) and handler.stream is old:
                with handler.lock or contextlib.nullcontext():  # setStream would flush
                    handler.stream = new  # the closed one, and fail


class ProcessState:
    """What this process owns between attempts, noted once (see the module's docstring).

    Made in the main thread once the child is ready to serve; :meth:`restore` must run in
    the main thread too (only it may set signal handlers).
    """

    def __init__(self) -> None:
        self._pid = os.getpid()
        self._fds: list[tuple[int, int, bool]] = []
        """(descriptor, a copy of it, blocking) for each of 0-2 open now."""
        for fd in (0, 1, 2):
            try:
                blocking = os.get_blocking(fd)
            except OSError:  # not open: nothing of ours to keep
                continue
            self._fds.append((fd, _copy(fd), blocking))
        self._streams = [_Stream(name, fd) for name, fd in _STREAMS]
        self._timers = [w for w in _TIMERS if _signal.getitimer(w) == (0.0, 0.0)]
        """The timers the app did not have running: a handler's are cancelled."""
        self._signals = [int(s) for s in sorted(signal.valid_signals())
                         if s not in (signal.SIGKILL, signal.SIGSTOP)]
        self._handlers: list[Any] = list(map(_signal.getsignal, self._signals))
        self._c_handlers: list[tuple[int, int | None]] = (
            [(s, _getsig(s)) for s in RELIED_ON] if _getsig else [])
        self._mask: set[int] = _signal.pthread_sigmask(signal.SIG_BLOCK, ())
        self._cwd = os.getcwd()
        self._cwd_fd = os.open(self._cwd, getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY
                               | os.O_CLOEXEC)
        self._cwd_id = identity(self._cwd_fd)
        self._umask = os.umask(0o022)
        os.umask(self._umask)
        self._environ = os.environ
        self._env_data: dict[bytes, bytes] = vars(os.environ)["_data"]
        self._env = dict(self._env_data)
        self._env_text = dict(os.environ)
        self._limits = [(r, resource.getrlimit(r)) for r in _LIMITS]
        # One read of /proc/self/limits tells whether any of them changed, for half the
        # cost of asking for each.
        self._limits_fd: int | None = None
        try:
            self._limits_fd = os.open("/proc/self/limits", os.O_RDONLY | os.O_CLOEXEC)
            self._limits_text = os.pread(self._limits_fd, 8192, 0)
        except OSError:  # no /proc
            self._limits_fd = None
        self._sid = os.getsid(0)
        self._pgid = os.getpgrp()
        # A session leader can leave neither its session nor its process group.
        self._fixed_group = self._sid == self._pid

    def restore(self) -> str | None:
        """Put back what the last attempt changed; why the process cannot be, or None."""
        try:
            self._restore()
        except UnrestorableError as exc:
            return str(exc)
        except BaseException as exc:  # whatever it is, this process is not fit to go on
            return f"the child could not restore its process state ({describe(exc)})"
        return None

    def _restore(self) -> None:
        # Timers first: an alarm must not fire into what follows.
        for which in self._timers:
            _signal.setitimer(which, 0.0, 0.0)  # reads and cancels in one call
        self._restore_fds()
        for stream in self._streams:
            if not stream.intact():
                stream.restore()
        if list(map(_signal.getsignal, self._signals)) != self._handlers:
            for signum, handler in zip(self._signals, self._handlers, strict=True):
                if _signal.getsignal(signum) is not handler:
                    self._set_handler(signum, handler)
        if _getsig is not None:
            for signum, address in self._c_handlers:
                if _getsig(signum) != address:  # replaced outside Python: set Python's again
                    self._set_handler(signum, _signal.getsignal(signum))
                    if _getsig(signum) != address:
                        raise UnrestorableError(
                            f"the handler of signal {_name(signum)} was replaced outside "
                            f"Python and could not be put back")
        mask = _signal.pthread_sigmask(signal.SIG_BLOCK, ())
        if mask != self._mask:
            self._restore_mask(mask)
        os.umask(self._umask)  # reading it would cost the same call
        self._restore_cwd()
        if os.environ is not self._environ:  # os.environ itself replaced
            os.environ = self._environ  # noqa: B003 - the very object, its contents after
        if self._env_data != self._env:
            self._restore_environ()
        if self._limits_fd is None or os.pread(self._limits_fd, 8192, 0) != self._limits_text:
            for which, limits in self._limits:
                if resource.getrlimit(which) != limits:
                    self._restore_limit(which, limits)
        if not self._fixed_group and (os.getsid(0) != self._sid or os.getpgrp() != self._pgid):
            raise UnrestorableError("the handler moved the child to another session or process "
                                    "group, out of reach of a kill of its group")

    def _restore_fds(self) -> None:
        # Put back unconditionally: a dup2 costs a quarter of the fstat that would tell
        # whether the descriptor still names the same file. The copies sit above the low
        # numbers a handler's files take; one the handler closed fails the dup2.
        fd = -1
        try:
            for fd, copy, blocking in self._fds:
                os.dup2(copy, fd)
                if os.get_blocking(fd) != blocking:  # shared with the copy: not undone above
                    os.set_blocking(fd, blocking)
        except OSError as exc:
            raise UnrestorableError(f"descriptor {fd} could not be put back ({exc})") from exc

    def _set_handler(self, signum: int, handler: Any) -> None:
        if handler is None:  # installed outside Python: nothing to set it back to
            raise UnrestorableError(f"the handler of signal {_name(signum)} was replaced and "
                                    f"cannot be put back")
        _signal.signal(signum, handler)

    def _restore_mask(self, mask: set[int]) -> None:
        # Unblocked, a signal left pending would be delivered now, to a handler that
        # belongs to no attempt (or kill the process): discard it, by ignoring it a moment.
        for signum in _signal.sigpending() & (mask - self._mask) - KEEP_PENDING:
            handler = _signal.getsignal(signum)
            if handler is None:
                continue
            _signal.signal(signum, _signal.SIG_IGN)  # not the enum: _signal wants its own
            _signal.signal(signum, handler)
        _signal.pthread_sigmask(signal.SIG_SETMASK, self._mask)

    def _restore_cwd(self) -> None:
        try:
            same = os.getcwd() == self._cwd
        except OSError:  # the directory the handler went to was removed
            same = False
        if same:
            return
        try:
            if identity(self._cwd_fd) != self._cwd_id:
                raise OSError(f"descriptor {self._cwd_fd} now refers to another file")
            os.fchdir(self._cwd_fd)
            self._cwd = os.getcwd()  # the same directory, perhaps renamed meanwhile
        except OSError as exc:
            raise UnrestorableError(f"the working directory could not be put back ({exc})") from exc

    def _restore_environ(self) -> None:
        zone = os.environ.get("TZ")
        for key in [k for k in os.environ if k not in self._env_text]:
            del os.environ[key]
        for key, value in self._env_text.items():
            if os.environ.get(key) != value:
                os.environ[key] = value
        if os.environ.get("TZ") != zone:
            time.tzset()

    def _restore_limit(self, which: int, limits: tuple[int, int]) -> None:
        try:
            resource.setrlimit(which, limits)
        except (ValueError, OSError) as exc:
            raise UnrestorableError(f"{_limit_name(which)} could not be put back to {limits} "
                               f"({exc})") from exc


def _copy(fd: int) -> int:
    """A close-on-exec copy of ``fd`` above the low descriptors a handler's files take."""
    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)


def _name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)


def _limit_name(which: int) -> str:
    names = [n for n in dir(resource) if n.startswith("RLIMIT_") and getattr(resource, n) == which]
    return names[0] if names else f"rlimit {which}"
