"""The child's process tree: keep it together, find it, and kill it.

"Tree" means the process group plus every descendant, those that left the group with
setsid included; as a child subreaper this process also adopts descendants that
daemonize, so they cannot slip out of the tree either. Every process of the tree carries
the :data:`TREE_VARIABLE` mark in its environment, by which the supervisor finds those
that escaped anyway should the child die before it could clean up.
"""

from __future__ import annotations

import ctypes
import functools
import os
import signal
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, NoReturn

from atlantis import environ
from atlantis.child.exits import EXIT_ORPHANED, exit_now, flush_output

if TYPE_CHECKING:
    import psutil

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
#: Sent by the kernel when the parent dies; real-time, so no library has a use for it.
PARENT_DEATH_SIGNAL: int | None = (
    signal.SIGRTMIN + 3 if hasattr(signal, "SIGRTMIN") else None  # Linux only
)
#: Environment variable marking every process of a child's tree (see ``serve``).
TREE_VARIABLE = environ.TREE


@functools.cache
def _prctl() -> Callable[..., int] | None:
    """libc's ``prctl``, looked up once: a zygote's workers inherit it instead of each
    loading libc's symbols again (``ctypes.CDLL`` and a fresh function object per call)."""
    try:
        prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux
        return None
    return prctl


def die_with_parent(parent: int) -> None:
    """Have the kernel signal this process when its parent (the supervisor, or the zygote
    that forked it: pid ``parent``) dies.

    The signal is a dedicated real-time one with a handler that kills this process's whole
    tree, not a bare SIGKILL: SIGKILL would end this process at once and orphan the
    handler's subprocesses, which nothing would then ever stop. The watchdog's EOF on the
    control pipe leads to the same sweep; whichever runs first wins.
    """
    if PARENT_DEATH_SIGNAL is None:
        return
    signal.signal(PARENT_DEATH_SIGNAL, lambda signum, frame: kill_group())
    prctl = _prctl()
    if prctl is not None:
        prctl(_PR_SET_PDEATHSIG, PARENT_DEATH_SIGNAL, 0, 0, 0)
    # The parent died before prctl took effect: we were re-parented. Compared with the pid
    # we were started by, never with 1: a supervisor may itself be PID 1 (a container
    # without an init), and a subreaper adopts orphans as well.
    if os.getppid() != parent:
        os._exit(EXIT_ORPHANED)


def adopt_orphans() -> None:
    """Become a child subreaper (Linux).

    A handler's descendant that daemonizes (setsid plus a double fork) is then re-parented
    to this process instead of init, so it remains a descendant that the leftover sweep
    here and the supervisor's kill sweep both find. Orphans that exit are reaped after each
    attempt.
    """
    prctl = _prctl()
    if prctl is not None:
        prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def has_children() -> bool:
    """Whether this process has any child, running or exited, in one cheap system call.

    No child means no descendant at all (as a subreaper, orphans come back to us as
    children), so the common case reads no ``/proc`` file and never loads psutil.
    """
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def descendants(recursive: bool = True) -> list[psutil.Process]:
    """This process's children (``recursive``: and all their descendants), running or
    zombies, as psutil handles (identified by pid and start time since boot, so a handle
    never signals a process that took a freed pid)."""
    if not has_children():  # psutil is not loaded: a child that starts no process never loads it
        return []
    return processes_under(os.getpid(), recursive)


def processes_under(pid: int, recursive: bool = True) -> list[psutil.Process]:
    """``pid``'s children (``recursive``: every descendant, parents first) as psutil
    handles; those that exit meanwhile are left out.

    Not ``psutil.Process.children``: it drops every process whose wall-clock start time is
    before its parent's, and that time is the boot time (read anew from ``/proc/stat`` each
    time) plus the start since boot, so a boot time that moves by a second between two
    reads (a clock step, or the kernel's rounding: psutil issues 2526 and 2542) hides
    every descendant started within a second of its parent. A sweep that missed one let a
    ``setsid`` grandchild outlive a killed supervisor. Parent links here come from the
    kernel, with no clock involved.
    """
    import psutil  # here, not at import (see descendants)

    if not _HAS_CHILDREN_FILES:  # a kernel without CONFIG_PROC_CHILDREN
        try:
            return psutil.Process(pid).children(recursive=recursive)
        except psutil.Error:
            return []
    found: list[psutil.Process] = []
    pids = [p for p, _threads in walk(pid)][1:] if recursive else children_of(pid)
    for p in pids:
        try:
            found.append(psutil.Process(p))
        except psutil.Error:  # exited (and reaped) meanwhile
            continue
    return found


def children_of(pid: int) -> list[int]:
    """Pids of ``pid``'s children; [] if ``pid`` is gone."""
    try:
        return _children(pid, os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return []


def _children(pid: int, tids: list[str]) -> list[int]:
    """From ``/proc/PID/task/TID/children``: a child belongs to the thread that forked it,
    or to the one it was re-parented to."""
    found: list[int] = []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                found.extend(int(p) for p in f.read().split())
        except OSError:
            continue
    return found


def walk(pid: int) -> Iterator[tuple[int, int]]:
    """``(pid, threads)`` for ``pid`` and each of its descendants, parents first.

    Reads ``/proc/PID/task/TID/children`` (Linux), so it costs in proportion to the tree,
    not to the host (psutil's ``children`` reads every process of the host): a process
    with no descendant is a few small reads. A process that exits meanwhile is skipped;
    nothing when ``pid`` is gone or ``/proc`` is not there.
    """
    todo = [pid]
    while todo:
        proc = todo.pop()
        try:
            tids = os.listdir(f"/proc/{proc}/task")
        except OSError:
            continue
        yield proc, len(tids)
        todo.extend(_children(proc, tids))


_HAS_CHILDREN_FILES = os.path.exists(f"/proc/self/task/{os.getpid()}/children")


_PAGE = os.sysconf("SC_PAGE_SIZE")


def resident(pid: int) -> int:
    """Resident memory of one process in bytes (``/proc/PID/statm``); 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


def last_pid() -> int | None:
    """The last process id the kernel handed out (``/proc/loadavg``'s last field), in this
    process's pid namespace; None where there is no such file.

    Every new task, process or thread, takes a fresh id (also one in each enclosing
    namespace), and ids are handed out in a cycle: while this number stays put, no task
    was created anywhere, so no tree can have grown.
    """
    try:
        with open("/proc/loadavg", "rb") as f:
            return int(f.read().split()[-1])
    except (OSError, ValueError, IndexError):
        return None


def tasks_created() -> int | None:
    """Tasks (processes and threads) the kernel has created since it booted, host-wide:
    ``/proc/stat``'s ``processes`` line, which every fork and clone adds one to, in every pid
    namespace. Unlike a process id it never wraps around, so the difference of two readings
    bounds how much any tree can have grown between them. None where there is no such line.
    """
    try:
        with open("/proc/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    start = data.find(b"\nprocesses ")
    if start < 0:
        return None
    end = data.find(b"\n", start + 1)
    try:
        return int(data[start + len(b"\nprocesses "):end if end >= 0 else None])
    except ValueError:
        return None


def count_tasks(pid: int, limit: int) -> int:
    """Tasks (processes and threads, as systemd's ``TasksMax`` counts them) of ``pid``'s
    tree, itself included, counted only up to the first past ``limit``: a fork bomb costs
    the count no more than ``limit`` processes. Zombies count until they are reaped."""
    count = 0
    for _pid, threads in walk(pid):
        count += threads
        if count > limit:
            break
    return count


def freeze(pid: int, rounds: int = 20) -> set[int]:
    """SIGSTOP ``pid``'s tree, again and again until a walk finds no process not yet
    stopped: a stopped process cannot fork, so a tree that forks while it is being
    stopped is caught by the next round. Returns the pids stopped. For a kill: SIGKILL
    reaches stopped processes too, and none of them can add to the tree meanwhile.

    Pids rather than psutil handles, since a fork bomb may have thousands: these are
    descendants of a stopped process, and a pid freed during the sweep is not handed out
    again before the kernel's pid counter wraps around.
    """
    stopped: set[int] = set()
    for _ in range(rounds):
        fresh = [p for p, _threads in walk(pid) if p not in stopped]
        if not fresh:
            break
        for p in fresh:
            try:
                os.kill(p, signal.SIGSTOP)
            except OSError:
                pass
            stopped.add(p)
    return stopped


def kill_descendants(keep: frozenset[psutil.Process] = frozenset()) -> list[psutil.Process]:
    """SIGKILL every descendant (those that left our process group with setsid included).

    Repeated a few times, since a process may fork while the sweep runs; ``keep`` spares
    processes that existed before the attempt (the app's own). Returns what was killed.
    """
    killed: list[psutil.Process] = []
    for _ in range(3):
        found = [p for p in descendants() if p not in keep and p not in killed]
        if not found:
            break
        import psutil  # loaded by descendants() already

        for p in found:
            try:
                p.kill()
                killed.append(p)
            except psutil.Error:
                pass
    return killed


def kill_group() -> NoReturn:
    """SIGKILL this process's whole tree: descendants outside the group, then the group.

    Only a group this process leads is killed as a group (the supervisor starts every child
    in a session of its own): run by hand without one, the child kills just its
    descendants and itself, never its parent's group.
    """
    flush_output()
    try:
        kill_descendants()
    finally:
        try:
            if os.getpgid(0) == os.getpid():
                os.killpg(os.getpid(), signal.SIGKILL)
            else:
                os.kill(os.getpid(), signal.SIGKILL)
        finally:
            exit_now(EXIT_ORPHANED)  # pragma: no cover - not reached
