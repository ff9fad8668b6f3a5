"""``--isolation fresh``: a new process per attempt, forked from a warm zygote."""

from __future__ import annotations

import signal
from typing import Any

import psutil
import psycopg

import atlantis
from tests.conftest import events, wait_for, wait_state


def test_fresh_isolation_runs_every_attempt_in_a_new_process(
    db: psycopg.Connection[Any], supervise: Any
) -> None:
    ids = atlantis.enqueue_many(db, "tests.Echo", [{"key": f"f{i}", "value": "x"} for i in range(6)])
    sup = supervise("--isolation", "fresh", concurrency=2)
    for job_id in ids:
        wait_state(db, job_id, "complete")
    pids = [events(db, f"f{i}")[0][3] for i in range(6)]
    assert len(set(pids)) == 6
    assert sup.pid not in pids
    # Workers are forks of one zygote, not fresh interpreters started by the supervisor.
    supervisor = psutil.Process(sup.pid)
    zygotes = [c for c in supervisor.children() if "atlantis.child.zygote" in " ".join(c.cmdline())]
    assert len(zygotes) == 1

    def warm_workers() -> bool:
        live = [w for w in zygotes[0].children() if w.status() != psutil.STATUS_ZOMBIE]
        return len(live) == 2

    wait_for(warm_workers, message="two warm workers waiting for the next attempts")
    sup.stop()
    assert f"job={ids[0]} attempt=1 echo f0 x" in sup.log()
    wait_for(lambda: not zygotes[0].is_running() or zygotes[0].status() == psutil.STATUS_ZOMBIE,
             timeout=10, message="the zygote to exit")


def test_fresh_isolation_failures_and_sighup(db: psycopg.Connection[Any], supervise: Any) -> None:
    crash = atlantis.enqueue(db, "tests.Fail", {"key": "c", "mode": "exit", "code": 3})
    sup = supervise("--isolation", "fresh", concurrency=1)
    row = wait_state(db, crash, "dead")
    assert row["last_error"] == "child exited with code 3"
    supervisor = psutil.Process(sup.pid)

    def zygote_pids() -> set[int]:
        found = set()
        for c in supervisor.children():
            try:  # a zygote that just exited is a zombie until reaped: it has no cmdline
                if "atlantis.child.zygote" in " ".join(c.cmdline()):
                    found.add(c.pid)
            except psutil.Error:
                continue
        return found

    before = wait_for(zygote_pids, message="a zygote")
    long_id = atlantis.enqueue(db, "tests.Sleep", {"key": "h", "seconds": 2.0})
    wait_for(lambda: events(db, "h"), message="the long attempt to start")
    sup.signal(signal.SIGHUP)
    wait_for(lambda: zygote_pids() - before, message="a new zygote after SIGHUP")
    row = wait_state(db, long_id, "complete")  # finished in its old worker
    assert row["attempt"] == 1
    wait_for(lambda: not (zygote_pids() & before), timeout=10, message="the old zygote to retire")
    after = atlantis.enqueue(db, "tests.Echo", {"key": "after"})
    wait_state(db, after, "complete")


def test_fresh_isolation_falls_back_to_new_interpreters_for_threaded_apps(
    db: psycopg.Connection[Any], supervise: Any
) -> None:
    # tests.apps.process starts a thread at import: forking it would copy a half-alive thread.
    ids = atlantis.enqueue_many(db, "proc.Noop", [{"key": f"t{i}"} for i in range(3)])
    sup = supervise("--isolation", "fresh", app="tests.apps.process:registry", queues=("proc",),
                    concurrency=1)
    for job_id in ids:
        wait_state(db, job_id, "complete")
    pids = {events(db, f"t{i}")[0][3] for i in range(3)}
    assert len(pids) == 3
    assert all(psutil.Process(sup.pid).pid != p for p in pids)
    sup.stop()
    assert "starts threads at import (app-background)" in sup.log()


def test_the_zygote_loads_what_its_workers_needed_and_a_reloaded_one_at_once(
    db: psycopg.Connection[Any], supervise: Any
) -> None:
    """A zygote starts with the app alone; once a worker needed psycopg (tests.Echo writes
    its event on a connection of its own), the supervisor has the zygote load it for every
    later worker, and a zygote started by a reload loads it before its first fork."""
    sup = supervise("--isolation", "fresh", concurrency=1)
    supervisor = psutil.Process(sup.pid)

    def zygote() -> int | None:
        for c in supervisor.children():
            try:  # a zygote that just exited is a zombie until reaped: it has no cmdline
                if "atlantis.child.zygote" in " ".join(c.cmdline()):
                    return c.pid
            except psutil.Error:
                continue
        return None

    def maps(pid: int) -> str:
        with open(f"/proc/{pid}/maps") as f:
            return f.read()

    first = wait_for(zygote, message="a zygote")
    assert "psycopg" not in maps(first) and "_asyncio" not in maps(first)  # the app alone
    wait_state(db, atlantis.enqueue(db, "tests.Echo", {"key": "e", "value": "x"}), "complete")
    wait_for(lambda: "psycopg" in maps(first) and "_asyncio" in maps(first),
             message="the zygote to load psycopg (and asyncio, which psycopg imports)")
    assert f"zygote {first}: loading asyncio, psycopg for its workers" in sup.log()
    sup.signal(signal.SIGHUP)
    second = wait_for(lambda: (z := zygote()) is not None and z != first and z,
                      message="a new zygote after SIGHUP")
    wait_for(lambda: "psycopg" in maps(second), message="the new zygote to load psycopg at once")
