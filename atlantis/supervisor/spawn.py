"""How a child process starts: its environment, its pipes and lease cell, its process.

A fresh interpreter (``python -m atlantis.child``) or, with ``--isolation fresh``, a fork
of the zygote; never a fork of the supervisor itself, which has threads and database
connections.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

from atlantis import environ
from atlantis.protocol.leasecell import LeaseCell
from atlantis.supervisor import identity
from atlantis.supervisor.children import Child, Forker, Owner
from atlantis.supervisor.keeper import LeaseKeeper
from atlantis.supervisor.output import OutputLog


def child_environment(database_url: str, handler_database_url: str) -> dict[str, str]:
    """The environment every child starts with.

    With a handler URL, children get that one, and neither the supervisor's own URL nor any
    ``PG*`` variable (libpq would use ``PGPASSWORD`` and friends as defaults).
    """
    env = dict(os.environ)
    env.pop(environ.HANDLER_DATABASE_URL, None)
    env.pop(environ.LISTEN_DATABASE_URL, None)
    if handler_database_url:
        for key in [k for k in env if k.startswith("PG")]:
            del env[key]
        env[environ.DATABASE_URL] = handler_database_url
    else:
        env[environ.DATABASE_URL] = database_url
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH", "")) if p)
    return env


def set_scheduling(pid: int, policy: str) -> None:
    """Put ``pid`` under ``policy`` (``--child-scheduling``); what it starts inherits it.

    ``batch`` (SCHED_BATCH) changes one thing: a woken task does not preempt the running
    one, it waits for a free CPU or the scheduler's tick. Without it, every ``Run`` the
    supervisor writes (and every reply a handler waits for) may hand the CPU to the child
    there and then: on two cores the supervisor spent much of its time preempted in that
    ``write``. Lowering a policy needs no privilege. Best effort: a platform without it,
    or a process already gone, is left as it is.
    """
    if policy != "batch":
        return
    try:
        os.sched_setscheduler(pid, os.SCHED_BATCH, os.sched_param(0))
    except (OSError, AttributeError):
        pass


def spawn_child(app: str, env: dict[str, str], generation: int, loop: asyncio.AbstractEventLoop,
                owner: Owner, output_rate: float, forker: Forker | None = None,
                scheduling: str = "normal", keeper: LeaseKeeper | None = None) -> Child:
    """Start a child: a fresh interpreter (``python -m atlantis.child``) or a zygote's fork,
    handed to the lease ``keeper`` as soon as its pid is known.

    Never a fork of this process, which has threads and database connections.
    """
    made: list[int] = []
    cell: LeaseCell | None = None
    try:  # out of descriptors half way: close what was made (the caller tries again later)
        for _ in range(4):
            made.extend(os.pipe())
        cell, cell_fd = LeaseCell.create()
        made.append(cell_fd)
        kept = os.dup(cell_fd)  # for the keeper (close-on-exec, as os.dup makes it)
    except BaseException:
        for fd in made:
            os.close(fd)
        if cell is not None:
            cell.close()
        raise
    ctl_r, ctl_w, ev_r, ev_w, out_r, out_w, err_r, err_w = made[:8]
    ours = (ctl_w, ev_r, out_r, err_r)
    theirs = (ctl_r, ev_w, out_w, err_w, cell_fd)
    for fd in ours:
        os.set_inheritable(fd, False)
    os.set_blocking(ctl_w, False)
    child = Child(loop=loop, owner=owner, generation=generation, control_fd=ctl_w,
                  events_fd=ev_r, out_fd=out_r, err_fd=err_r, output=OutputLog(0, output_rate),
                  lease_cell=cell, cell_fd=kept)
    try:
        if forker is not None:
            def forked(pid: int) -> None:
                child.pid = child.output.pid = pid
                if keeper is not None and child.cell_fd >= 0:
                    keeper.watch(pid, child.cell_fd)

            forker.fork((ctl_r, ev_w, out_w, err_w, cell_fd), forked, child.exited)
        else:
            proc = subprocess.Popen(
                [sys.executable, "-m", "atlantis.child", "--app", app,
                 "--control-fd", str(ctl_r), "--events-fd", str(ev_w),
                 "--lease-fd", str(cell_fd), "--parent-pid", str(os.getpid())],
                pass_fds=(ctl_r, ev_w, cell_fd, *identity.inherited()),
                stdin=subprocess.DEVNULL, stdout=out_w,
                stderr=err_w,
                start_new_session=True, env=env,
            )
            child.pid = child.output.pid = proc.pid
            if keeper is not None:
                keeper.watch(proc.pid, kept)
            set_scheduling(proc.pid, scheduling)
            pidfd = os.pidfd_open(proc.pid)

            def reaped() -> None:
                loop.remove_reader(pidfd)
                os.close(pidfd)
                child.exited(proc.wait())

            loop.add_reader(pidfd, reaped)
    except BaseException:
        for fd in (*ours, kept):
            os.close(fd)
        cell.close()
        raise
    finally:
        for fd in theirs:
            os.close(fd)
    child.watch()
    return child
