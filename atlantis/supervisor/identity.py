"""Who a supervisor is on its host, in a way that survives PID reuse and PID namespaces.

Each supervisor holds an exclusive ``flock`` on a lock file of its own,
``RUNTIME_DIR/WORKER_ID.lock`` (``--runtime-dir``: ``$XDG_RUNTIME_DIR/atlantis``, else
``/tmp/atlantis-UID``, a folder of the user's own, mode 0700), from before its worker row
exists until after it is deleted. The lease keeper, the zygotes and the children inherit
the locked descriptor, so the lock is free only once every one of them is gone too: the
kernel drops a ``flock`` when the last descriptor of its open file closes, whatever PID
the processes had or will have, and in whichever PID namespace they ran. Every process the
supervisor starts also carries its worker id in its environment (``ATLANTIS_WORKER``), so
that those which closed the descriptor (a ``subprocess`` closes what it does not pass) are
found by a sweep of the processes this one can see.

A supervisor of the same host (same host name, same boot id) whose lock file this one can
lock, and of whose processes none is left, is *provably gone*: its running rows are
released at once (:func:`gone`, the rescue service). A lock held (the supervisor alive,
stopped or stalled), a lock file that is not here (another host, another mount namespace,
another user's folder), or a process still marked: it is waited for, until its leases end.
"""

from __future__ import annotations

import fcntl
import functools
import logging
import os
import re
import stat
from pathlib import Path

import psutil

from atlantis import environ

log = logging.getLogger("atlantis.supervisor")

#: A worker id that may name a file: ``host:pid:random`` (no slash, no leading dot).
_SAFE = re.compile(r"[A-Za-z0-9_:-][A-Za-z0-9._:-]{0,250}")
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
_held: list[int] = []


def boot_id() -> str | None:
    """This boot of this machine (Linux); None where there is no such file."""
    try:
        return _BOOT_ID.read_text("ascii").strip() or None
    except (OSError, UnicodeDecodeError):
        return None


@functools.cache
def runtime_dir(setting: str) -> Path | None:
    """The folder of lock files, made if need be; None (with a warning) when it is not a
    folder of this user's own that nobody else may write: then this supervisor neither
    holds a lock nor rescues another's rows at once (their leases still end)."""
    if setting:
        path = Path(setting)
    elif os.environ.get(environ.XDG_RUNTIME_DIR, "").startswith("/"):
        path = Path(os.environ[environ.XDG_RUNTIME_DIR]) / "atlantis"
    else:
        path = Path(f"/tmp/atlantis-{os.getuid()}")  # its owner and mode checked below
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(path)
    except OSError as exc:
        log.warning("runtime folder %s: %s; no same-host rescue", path, exc)
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        log.warning("runtime folder %s is not a folder of this user's own that only it may "
                    "write; no same-host rescue", path)
        return None
    return path


def lock_path(folder: Path, worker: str) -> Path | None:
    return folder / f"{worker}.lock" if _SAFE.fullmatch(worker) else None


def hold(folder: Path | None, worker: str) -> int:
    """Take this supervisor's lock and mark what it will start; returns the descriptor
    (-1: no lock, see :func:`runtime_dir`)."""
    os.environ[environ.WORKER] = worker
    path = None if folder is None else lock_path(folder, worker)
    if path is None:
        return -1
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        log.warning("lock file %s: %s; no same-host rescue of this supervisor", path, exc)
        return -1
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a fresh id: nobody else has it
    _held.append(fd)
    return fd


def release(folder: Path | None, worker: str, fd: int) -> None:
    """At the stop, after the worker row is gone."""
    if fd < 0:
        return
    path = None if folder is None else lock_path(folder, worker)
    if path is not None:
        path.unlink(missing_ok=True)
    if fd in _held:
        _held.remove(fd)
    os.close(fd)


def inherited() -> tuple[int, ...]:
    """The descriptor the processes this supervisor starts inherit (``pass_fds``)."""
    return tuple(_held)


def gone(folder: Path, worker: str) -> int | str:
    """Whether the supervisor ``worker`` of this host is provably gone: the locked
    descriptor of its lock file if so (the caller releases its rows, then :func:`forget`),
    else why it is not known to be."""
    path = lock_path(folder, worker)
    if path is None:
        return "its id names no lock file"
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return "its lock file is not here (another host, or another runtime folder)"
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return "its lock is held (it, its lease keeper or a child of it is alive)"
    left = marked(worker)
    if left:
        os.close(fd)
        return f"processes it started are left: {', '.join(map(str, left))}"
    return fd


def forget(folder: Path, worker: str, fd: int, *, unlink: bool = True) -> None:
    """The gone supervisor's lock file, once its rows are released (``unlink`` False: they
    could not be, the file stays for the next look)."""
    path = lock_path(folder, worker)
    if unlink and path is not None:
        path.unlink(missing_ok=True)
    os.close(fd)


def marked(worker: str) -> list[int]:
    """The pids of the processes this one can see that carry ``worker``'s mark."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get(environ.WORKER) == worker:
                found.append(p.pid)
        except psutil.Error:
            continue
    return found
