"""The child process: load the app once, then run one attempt at a time.

``python -m atlantis.child --app A --control-fd N --events-fd M --lease-fd L`` (the lease
cell, :mod:`atlantis.protocol.leasecell`). Two threads: the main thread runs handlers
(:mod:`atlantis.child.attempt`); the watchdog thread owns the control pipe and enforces the
lease (:mod:`atlantis.child.watchdog`). The process leads its own tree
(:mod:`atlantis.child.tree`); its exit codes are listed in :mod:`atlantis.child.exits`.

Protocol (:mod:`atlantis.protocol.messages`): the child sends ``Ready`` once the app is
imported (or ``Fatal`` and exits with :data:`EXIT_APP_ERROR`), then for every ``Run`` any
number of ``Checkpoint`` and exactly one ``Done``, unless it dies first (saying why in the
lease cell when it stops the attempt itself).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import sys

from atlantis.app import load_app
from atlantis.child import preload
from atlantis.child.attempt import run_attempt
from atlantis.child.channel import Channel
from atlantis.child.exits import (
    EXIT_APP_ERROR,
    EXIT_ORPHANED,
    EXIT_PROTOCOL,
    Terminated,
    TermSignal,
    exit_now,
)
from atlantis.child.state import ProcessState
from atlantis.child.text import MAX_ERROR_CHARS, child_error, describe, text_of
from atlantis.child.tracing import prepare as prepare_tracing
from atlantis.child.tree import TREE_VARIABLE, adopt_orphans, die_with_parent, kill_group
from atlantis.child.watchdog import Watchdog
from atlantis.errors import ConfigurationError
from atlantis.protocol.leasecell import LeaseCell
from atlantis.protocol.messages import Done, Fatal, Ready, clip
from atlantis.registry import Registry

# Kept importable from here: the zygote and the supervisor use these names.
_die_with_parent = die_with_parent
__all__ = [
    "EXIT_APP_ERROR",
    "EXIT_ORPHANED",
    "EXIT_PROTOCOL",
    "TREE_VARIABLE",
    "Terminated",
    "_die_with_parent",
    "main",
    "serve",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="atlantis-child")
    parser.add_argument("--app", required=True)
    parser.add_argument("--control-fd", type=int, required=True)
    parser.add_argument("--events-fd", type=int, required=True)
    parser.add_argument("--lease-fd", type=int, required=True,
                        help="the lease cell: a memfd shared with the supervisor "
                             "(atlantis.protocol.leasecell)")
    parser.add_argument("--parent-pid", type=int, default=None,
                        help="the pid of the process that started this one (the "
                             "supervisor); by hand, this process's parent at start")
    opts = parser.parse_args(argv)
    die_with_parent(opts.parent_pid if opts.parent_pid is not None else os.getppid())
    for fd in (opts.control_fd, opts.events_fd, opts.lease_fd):
        os.set_inheritable(fd, False)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        registry = load_app(opts.app)
    except ConfigurationError as exc:
        Channel(opts.events_fd).send(Fatal(error=clip(text_of(exc), MAX_ERROR_CHARS)))
        return EXIT_APP_ERROR
    prepare_tracing()  # an app that loaded OpenTelemetry: its SDK now, not at an attempt
    return serve(registry, opts.control_fd, opts.events_fd, opts.lease_fd)


def serve(registry: Registry, control_fd: int, events_fd: int, lease_fd: int,
          reused: bool = True) -> int:
    """Announce readiness, then run attempts until the control pipe closes.

    Also the entry point of a worker forked by the zygote, with the app already imported
    (``reused`` False: it runs one attempt, so its process state is never put back, and
    once its ``Done`` is out it kills its tree, as the EOF that would follow would make it).
    Every ``Run`` gets one ``Done``, whatever the handler did, unless the process dies
    first (killed, or its events pipe lost). A reused child puts back the process state
    it owns after each attempt, before its ``Done`` (:mod:`atlantis.child.state`); one
    that cannot says why in that ``Done`` (``retire``) and exits.
    """
    cell = LeaseCell(lease_fd)  # mapped: the descriptor is not needed any more
    os.close(lease_fd)
    term = TermSignal()
    channel = Channel(events_fd, term, cell)
    adopt_orphans()
    # Every process started from here on inherits this mark: should this process die
    # before it could clean up (a crash, os._exit, SIGKILL), the supervisor finds by it the
    # descendants that left the process group and were re-parented away.
    tree = os.urandom(8).hex()  # secrets.token_hex's bytes, without importing secrets
    os.environ[TREE_VARIABLE] = tree
    watchdog = Watchdog(control_fd, cell)
    watchdog.start()
    # The jobs it can run: the supervisor hands it no other (a reload may add or remove some).
    channel.send(Ready(pid=os.getpid(), tree=tree, jobs="\n".join(sorted(registry.registrations))))
    # SIGTERM between attempts ends the child quietly; during one it fails the attempt.
    signal.signal(signal.SIGTERM, term.handler)
    state = ProcessState() if reused else None
    # A zygote's worker names what it imports that its zygote did not hold (preload).
    had = None if reused else preload.loaded()
    while True:
        term.idle = True
        try:
            run, flags = watchdog.next_run()
        except KeyboardInterrupt:
            return 0
        term.reset()
        try:
            done, must_exit = run_attempt(registry, run, flags, channel, watchdog, term)
        except BaseException as exc:  # the child's own failure, after the handler: say so
            term.armed = False
            done, must_exit = Done(job_id=run.job_id, outcome="failed", error=child_error(
                "exception", f"the child failed while ending the attempt: {describe(exc)}",
                exc)), True
        if state is not None and not (must_exit or done.leftovers or term.received):
            why = state.restore()
            if why is not None:
                done = dataclasses.replace(done, retire=clip(text_of(why), MAX_ERROR_CHARS))
        if had is not None and (imported := preload.imported_since(had)) is not None:
            done = dataclasses.replace(done, preload=imported)
        channel.send_done(done)
        channel.job_id = None
        if done.leftovers or done.retire is not None:
            # A leftover thread cannot be stopped, and a normal exit would wait for every
            # non-daemon one; nor can a process that could not be put back serve on: leave
            # at once (the supervisor starts a replacement).
            exit_now(0)
        if not reused:
            # One attempt per process: end it now as the supervisor's EOF on the control
            # pipe would (its whole tree), without a wake-up to wait for that EOF.
            kill_group()
        if must_exit or term.received:
            return 0
