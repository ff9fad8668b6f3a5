"""The supervisor as PID 1 (a container without an init process): stay init, supervise from
a child.

PID 1 of a PID namespace adopts every orphan of the namespace, and nobody else will reap
them: each would stay a zombie. The supervisor waits for each of its own children by pid
(a pidfd and ``Popen.wait``, asyncio's child watcher): a reaper waiting for any child in
the same process would take those exit statuses from under them. So a supervisor started
as PID 1 forks before it does anything else. The child goes on as the supervisor, with
children of its own that no one else waits for; PID 1 only waits for any child (the
orphans, and the supervisor), forwards the signals an operator sends (stop, reload) to the
supervisor, and exits with the supervisor's exit status.
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType

#: Signals PID 1 passes on to the supervisor (the kernel drops any other sent to PID 1).
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
             signal.SIGUSR2)


def stay_init_if_pid1() -> None:
    """As PID 1, fork: return in the child (the supervisor); the parent never returns, it
    reaps until the supervisor exits, then exits with its status. Elsewhere, nothing."""
    if os.getpid() != 1:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    # Blocked across the fork: a stop signal sent meanwhile waits for its forwarder.
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    supervisor = os.fork()
    if supervisor == 0:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
        return
    os._exit(reap_until(supervisor))


def reap_until(supervisor: int) -> int:
    """Reap every child until ``supervisor`` exits; its exit code (128 + the signal that
    killed it, as a shell says)."""

    def forward(signum: int, frame: FrameType | None) -> None:
        try:
            os.kill(supervisor, signum)
        except ProcessLookupError:
            pass

    for sig in FORWARDED:
        signal.signal(sig, forward)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:  # not reached: the supervisor is a child until reaped
            return 1
        if pid == supervisor:
            code = os.waitstatus_to_exitcode(status)
            return code if code >= 0 else 128 - code
