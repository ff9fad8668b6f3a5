"""Workflows under real supervisors, child processes and PostgreSQL (tests/apps/flows.atl):
dependencies, results, failure and cancel with their compensations, a supervisor killed
mid-workflow, two dependencies finishing at once on two supervisors, a dead compensation
and its retry. The transitions themselves, driven by SQL: tests/test_workflow_store.py."""

from __future__ import annotations

import signal
from collections.abc import Callable
from datetime import datetime
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

import atlantis
from atlantis.app import load_app
from atlantis.store import sync
from tests.conftest import Supervisor, wait_for

APP = "tests.apps.flows:registry"


@pytest.fixture
def flows(db: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    registry = load_app(APP)
    sync(db, list(registry.decls.values()), list(registry.workflows.values()))
    return db


def start(db: psycopg.Connection[Any], name: str, **args: Any) -> int:
    return atlantis.start_workflow(db, f"flows.{name}", {"key": "k", **args})


def supervisor(supervise: Callable[..., Supervisor], concurrency: int = 4) -> Supervisor:
    return supervise(app=APP, queues=("flows",), concurrency=concurrency)


def workflow_state(db: psycopg.Connection[Any], wid: int) -> str:
    row = db.execute("SELECT state FROM atlantis.workflows WHERE id = %s", (wid,)).fetchone()
    assert row is not None
    return str(row[0])


def wait_workflow(db: psycopg.Connection[Any], wid: int, *states: str,
                  timeout: float = 60.0) -> str:
    found: str = wait_for(lambda: (s := workflow_state(db, wid)) in states and s,
                          timeout, message=f"workflow {wid} in {states}")
    return found


def steps(db: psycopg.Connection[Any], wid: int) -> dict[tuple[str, bool], dict[str, Any]]:
    rows = db.cursor(row_factory=dict_row).execute(
        "SELECT * FROM atlantis.jobs WHERE workflow_id = %s ORDER BY id", (wid,)).fetchall()
    return {(r["step"], r["compensation"]): r for r in rows}


def timeline(db: psycopg.Connection[Any], wid: int) -> list[tuple[str, str, datetime]]:
    """(key, event, at) of every record the workflow's handlers made, in order."""
    return [(k, e, at) for k, e, at in db.execute(
        "SELECT key, event, at FROM test_events WHERE key LIKE %s ORDER BY at, id",
        (f"{wid}:%",)).fetchall()]


def at(events: list[tuple[str, str, datetime]], key: str, event: str) -> datetime:
    found = [t for k, e, t in events if k == key and e == event]
    assert len(found) == 1, f"{key} {event}: {len(found)} records"
    return found[0]


def count(events: list[tuple[str, str, datetime]], key: str, event: str) -> int:
    return sum(1 for k, e, _ in events if k == key and e.startswith(event))


def test_a_workflow_completes_in_dependency_order_with_results_passed_and_branches_at_once(
        flows: psycopg.Connection[Any], supervise: Callable[..., Supervisor]) -> None:
    db = flows
    supervisor(supervise)
    # left and right wait for each other: they can only finish if they ran at once.
    wid = start(db, "Diamond", meet=["left", "right"])
    assert wait_workflow(db, wid, "complete", "failed", "compensation_failed") == "complete"
    ev = timeline(db, wid)
    k = {s: f"{wid}:{s}" for s in ("root", "left", "right", "join")}
    for branch in ("left", "right"):
        assert at(ev, k["root"], "finished") < at(ev, k[branch], "started")
        assert at(ev, k[branch], "finished") < at(ev, k["join"], "started")
    # The branches overlapped in time.
    assert at(ev, k["left"], "started") < at(ev, k["right"], "finished")
    assert at(ev, k["right"], "started") < at(ev, k["left"], "finished")
    rows = steps(db, wid)
    assert sorted(rows) == [("join", False), ("left", False), ("right", False), ("root", False)]
    assert all(r["state"] == "complete" for r in rows.values())
    # Results stored and passed: each step saw its transitive predecessors' results.
    assert rows["join", False]["result"] == {"step": "join", "saw": ["left", "right", "root"],
                                             "key": k["join"]}
    assert rows["left", False]["result"]["saw"] == ["root"]


def test_a_failing_last_step_runs_the_compensations_in_reverse_order_once_each(
        flows: psycopg.Connection[Any], supervise: Callable[..., Supervisor]) -> None:
    db = flows
    supervisor(supervise)
    wid = start(db, "Chain", fail="third")
    assert wait_workflow(db, wid, "failed", "complete", "compensation_failed") == "failed"
    ev = timeline(db, wid)
    first, second = f"{wid}:first:compensate", f"{wid}:second:compensate"
    assert count(ev, first, "undoing") == 1 and count(ev, first, "undone") == 1
    assert count(ev, second, "undoing") == 1 and count(ev, second, "undone") == 1
    assert at(ev, second, "undone after third") < at(ev, first, "undoing")
    rows = steps(db, wid)
    assert rows["third", False]["state"] == "dead"
    assert ("third", True) not in rows  # no compensation declared
    assert rows["second", True]["result"] == {
        "undone": "second", "had": {"step": "second", "saw": ["first"], "key": f"{wid}:second"}}
    w = db.execute("SELECT error, failed_step, cause FROM atlantis.workflows WHERE id = %s",
                   (wid,)).fetchone()
    assert w is not None and w[1:] == ("third", "failed")
    assert "step third failed: step third fails on purpose" in w[0]


def test_a_cancel_during_step_two_cancels_it_and_compensates_steps_two_and_one(
        flows: psycopg.Connection[Any], supervise: Callable[..., Supervisor]) -> None:
    db = flows
    supervisor(supervise)
    wid = start(db, "Chain", hold="second")
    wait_for(lambda: count(timeline(db, wid), f"{wid}:second", "started") == 1,
             message="step two running")
    assert atlantis.cancel_workflow(db, wid) == "compensating"
    assert wait_workflow(db, wid, "cancelled", "failed", "compensation_failed") == "cancelled"
    ev = timeline(db, wid)
    assert count(ev, f"{wid}:second", "saw-cancel") == 1  # ctx.cancelled reached it
    rows = steps(db, wid)
    assert rows["second", False]["state"] == "cancelled"
    assert ("third", False) not in rows  # never started
    second, first = f"{wid}:second:compensate", f"{wid}:first:compensate"
    assert count(ev, second, "undone after None") == 1
    assert count(ev, first, "undone after None") == 1
    assert at(ev, second, "undone after None") < at(ev, first, "undoing")


def test_two_dependencies_finishing_at_once_on_two_supervisors_start_their_dependent_once(
        flows: psycopg.Connection[Any], supervise: Callable[..., Supervisor]) -> None:
    db = flows
    # One slot each: the two branches, which wait for each other, run on both supervisors
    # and return at the same moment.
    one, two = supervisor(supervise, 1), supervisor(supervise, 1)
    ids = []
    for i in range(3):  # one at a time: two waiting branches of two workflows would hold both slots
        wid = start(db, "Diamond", key=f"k{i}", meet=["left", "right"])
        ids.append(wid)
        assert wait_workflow(db, wid, "complete", "failed", "compensation_failed") == "complete"
        assert db.execute("SELECT count(*) FROM atlantis.jobs WHERE workflow_id = %s"
                          " AND step = 'join'", (wid,)).fetchone() == (1,)
        assert count(timeline(db, wid), f"{wid}:join", "started") == 1
        assert count(timeline(db, wid), f"{wid}:left", "started") == 1  # no timeout, no retry
    workers = {r[0] for r in db.execute(
        "SELECT DISTINCT worker FROM atlantis.attempts a JOIN atlantis.jobs j ON j.id = a.job_id"
        " WHERE j.step IN ('left', 'right')").fetchall()}
    assert len(workers) == 2, "the branches ran on both supervisors"
    assert one.proc.poll() is None and two.proc.poll() is None


def test_a_supervisor_killed_mid_workflow_loses_nothing(
        flows: psycopg.Connection[Any], supervise: Callable[..., Supervisor]) -> None:
    db = flows
    first = supervisor(supervise)
    wid = start(db, "Chain", hold="second")
    wait_for(lambda: count(timeline(db, wid), f"{wid}:second", "started") == 1,
             message="step two running")
    first.signal(signal.SIGKILL)
    first.wait()
    db.execute("INSERT INTO test_events (job_id, attempt, key, event, pid)"
               " VALUES (0, 0, %s, 'release', 0)", (f"release:{wid}",))
    supervisor(supervise)  # rescues step two when its lease expires, and carries on
    assert wait_workflow(db, wid, "complete", "failed", "compensation_failed") == "complete"
    ev = timeline(db, wid)
    for s in ("first", "second", "third"):
        assert count(ev, f"{wid}:{s}", "finished") == 1
    assert count(ev, f"{wid}:second", "started") == 2  # the killed attempt, then its retry
    assert steps(db, wid)["second", False]["errors"][0]["kind"] == "lease_expired"


def test_a_dead_compensation_ends_compensation_failed_and_its_retry_finishes_it(
        flows: psycopg.Connection[Any], supervise: Callable[..., Supervisor]) -> None:
    db = flows
    supervisor(supervise)
    wid = start(db, "Chain", fail="third", undo_fails="second")
    assert wait_workflow(db, wid, "compensation_failed", "failed") == "compensation_failed"
    rows = steps(db, wid)
    assert rows["second", True]["state"] == "dead"
    assert ("first", True) not in rows  # stopped behind the dead one
    db.execute("INSERT INTO test_events (job_id, attempt, key, event, pid)"
               " VALUES (0, 0, %s, 'fix', 0)", (f"fix:{wid}",))
    assert atlantis.retry_workflow(db, wid) == "compensating"
    assert wait_workflow(db, wid, "failed", "compensation_failed") == "failed"
    ev = timeline(db, wid)
    assert count(ev, f"{wid}:second:compensate", "undoing") == 2  # the dead one, then the retry
    assert count(ev, f"{wid}:second:compensate", "undone") == 1
    assert count(ev, f"{wid}:first:compensate", "undone") == 1
