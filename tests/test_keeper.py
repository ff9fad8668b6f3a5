"""The lease keeper: an attempt's lease end holds while the handler sits in one C call that
holds the GIL (so that neither the child's watchdog nor its parent-death handler can run),
and its supervisor is killed or stopped, alone or with its whole process group.

Every process of the attempt (a double-forked ``setsid`` grandchild that sits in the same
kind of C call included) must be dead at least :func:`policy.dead_before_end` (500 ms at
``heartbeat 2s``) before the row's ``claimed_until``, and the next attempt starts only
after that. Death times are read from pidfds, which the kernel makes readable the moment a
process exits.
"""

from __future__ import annotations

import os
import select
import signal
import time
from typing import Any

import psycopg
import pytest

import atlantis
from atlantis.supervisor import policy
from tests.conftest import events, job_row, wait_for, wait_state

#: Seconds of the handler's C call (tests.apps.basic.hold_the_gil): far past the lease,
#: which ends it first; the healthy supervisor's attempt is held past three heartbeats.
LONG = 30
HELD = 8
HEARTBEAT = 2.0  # tests.Crunch's


def _event_times(db: psycopg.Connection[Any], key: str) -> list[tuple[int, str, int, float]]:
    rows = db.execute(
        "SELECT attempt, event, pid, extract(epoch FROM at)::float8 FROM test_events "
        "WHERE key = %s ORDER BY id", (key,)).fetchall()
    return [(int(a), str(e), int(p), float(t)) for a, e, p, t in rows]


def _last_death(db: psycopg.Connection[Any], job_id: int, pids: list[int]) -> tuple[float, float]:
    """Wait until every process of ``pids`` has exited; returns when the last one did (the
    wall clock, as PostgreSQL's on this host) and attempt 1's last ``claimed_until``."""
    fds = {os.pidfd_open(p): p for p in pids}
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    claimed_until = 0.0
    last = 0.0
    deadline = time.monotonic() + 60
    looked = 0.0
    try:
        while fds:
            for fd, _ in poller.poll(10):
                last = time.time()
                poller.unregister(fd)
                os.close(fd)
                del fds[fd]
            if time.monotonic() - looked >= 0.1 or not fds:
                looked = time.monotonic()
                row = db.execute(
                    "SELECT attempt, state, extract(epoch FROM claimed_until)::float8 "
                    "FROM atlantis.jobs WHERE id = %s", (job_id,)).fetchone()
                assert row is not None
                if row[0] == 1 and row[1] == "running":
                    claimed_until = float(row[2])
            assert time.monotonic() < deadline, f"processes {sorted(fds.values())} still alive"
    finally:
        for fd in fds:
            os.close(fd)
    return last, claimed_until


@pytest.mark.parametrize("how", ["kill", "stop", "kill-group", "stop-group"])
def test_an_attempt_in_a_long_c_call_is_dead_before_its_lease_ends(
    db: psycopg.Connection[Any], supervise: Any, how: str
) -> None:
    key = f"crunch-{how}"
    job_id = atlantis.enqueue(db, "tests.Crunch", {
        "key": key, "seconds": LONG, "retry_seconds": 0, "grandchild": True})
    group = how.endswith("-group")
    first = supervise(concurrency=1, session=group)
    wait_for(lambda: any(e[1] == "before" for e in _event_times(db, key)), timeout=60,
             message="the handler to enter its C call")
    pids = [p for _a, e, p, _t in _event_times(db, key) if e in ("before", "grandchild")]
    assert len(pids) == 2
    sig = signal.SIGKILL if how.startswith("kill") else signal.SIGSTOP
    if group:
        os.killpg(first.pid, sig)
    else:
        first.signal(sig)
    try:
        second = supervise(concurrency=1)
        died, claimed_until = _last_death(db, job_id, pids)
        row = wait_state(db, job_id, "complete", timeout=60)
    finally:
        if sig == signal.SIGSTOP and group:
            os.killpg(first.pid, signal.SIGCONT)
        elif sig == signal.SIGSTOP:
            first.signal(signal.SIGCONT)
    assert claimed_until > 0
    # Dead at least a quarter of the heartbeat before the row could be claimed again.
    assert claimed_until - died >= policy.dead_before_end(HEARTBEAT), (claimed_until, died)
    assert row["attempt"] == 2 and row["errors"][0]["kind"] == "lease_expired"
    times = _event_times(db, key)
    # Attempt 1 never came out of its C call; attempt 2 began after every process of it died.
    assert [e for a, e, _p, _t in times if a == 1] == ["grandchild", "before"]
    (second_start,) = [t for a, e, _p, t in times if a == 2 and e == "before"]
    assert second_start > died
    if sig == signal.SIGSTOP:  # it may be alive: waited for until the lease ended
        assert second_start > claimed_until > died
    else:  # gone, with every process of it, on this host: rescued at once (test_liveness.py)
        assert "gone: no process of it is left" in row["errors"][0]["message"]
    second.stop()
    if sig == signal.SIGSTOP:
        first.stop()
        assert job_row(db, job_id) == row  # the resumed supervisor wrote nothing


def test_a_healthy_supervisor_keeps_an_attempt_in_a_long_c_call(
    db: psycopg.Connection[Any], supervise: Any
) -> None:
    job_id = atlantis.enqueue(db, "tests.Crunch", {
        "key": "healthy", "seconds": HELD, "retry_seconds": 0})
    supervise(concurrency=1)
    row = wait_state(db, job_id, "complete", timeout=120)
    assert row["attempt"] == 1 and row["errors"] == []
    times = _event_times(db, "healthy")
    assert [e for _a, e, _p, _t in times] == ["before", "after"]
    # The call held the GIL across several heartbeats: renewals reached only the keeper.
    assert times[1][3] - times[0][3] > 3 * HEARTBEAT


def test_a_killed_keeper_is_started_again_and_keeps_watching(
    db: psycopg.Connection[Any], supervise: Any
) -> None:
    import psutil

    job_id = atlantis.enqueue(db, "tests.Crunch", {
        "key": "rekept", "seconds": LONG, "retry_seconds": 0})
    sup = supervise(concurrency=1)
    wait_for(lambda: events(db, "rekept"), timeout=60, message="the handler to start")

    def keepers() -> list[psutil.Process]:
        found = []
        for p in psutil.Process(sup.pid).children():
            try:
                if "atlantis.keeper" in " ".join(p.cmdline()):
                    found.append(p)
            except psutil.Error:  # a child that exited meanwhile
                continue
        return found

    (keeper,) = wait_for(keepers, message="the keeper")
    keeper.kill()
    wait_for(lambda: [k for k in keepers() if k.pid != keeper.pid], timeout=20,
             message="another keeper")
    assert "the lease keeper exited" in sup.log()
    wait_for(lambda: sup.log().count("the lease keeper (pid") == 2, timeout=30,
             message="the new keeper to be ready")
    # The new keeper watches the running child: a stop of the supervisor now ends it in time.
    ((_, _, _, child_pid),) = events(db, "rekept")
    sup.signal(signal.SIGSTOP)
    try:
        died, claimed_until = _last_death(db, job_id, [child_pid])
    finally:
        sup.signal(signal.SIGCONT)
    assert claimed_until - died >= policy.dead_before_end(HEARTBEAT)
