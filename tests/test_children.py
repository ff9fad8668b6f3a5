"""Children (issue 35): ``ctx.spawn`` enqueues a child exactly once across runs (kill -9 of
the supervisor included), ``ctx.join`` suspends until every listed job has ended and
returns their results in order, a dead child raises ChildFailed, cancelling a parent
cancels its children, retention keeps the children of a live parent, a waiting job holds
no limit slot, and events and joins work inside a workflow's step. Real supervisors, real
PostgreSQL, real signals.
"""

from __future__ import annotations

import signal
from typing import Any

import psycopg
import pytest

import atlantis
from tests.conftest import (
    events,
    free_port,
    job_row,
    run_tide,
    scrape_metrics,
    wait_for,
    wait_state,
)

APP = "tests.apps.durable:registry"


def _start(supervise: Any, concurrency: int = 4) -> Any:
    return supervise(queues=("durable",), app=APP, concurrency=concurrency)


def _children(db: psycopg.Connection[Any], parent: int) -> list[tuple[int, str, Any]]:
    return [(r[0], r[1], r[2]) for r in db.execute(
        "SELECT (args->>'i')::int, state, result FROM atlantis.jobs WHERE parent_id = %s "
        "ORDER BY id", (parent,))]


def _fan_out(db: psycopg.Connection[Any], key: str, n: int, **more: Any) -> int:
    job_id = atlantis.enqueue(db, "durable.FanOut", {"key": key, "n": n, **more})
    db.commit()
    return job_id


def _joining(db: psycopg.Connection[Any], job_id: int) -> bool:
    row = job_row(db, job_id)
    return bool(row["state"] == "available" and row["suspended_for"] == "join:all")


def test_a_fan_out_spawns_each_child_once_and_joins_their_results_in_order(
        ddb: psycopg.Connection[Any], db_url: str, supervise: Any) -> None:
    _start(supervise)
    parent = _fan_out(ddb, "fan", 6)
    row = wait_state(ddb, parent, "complete")
    assert row["result"] == sum(i * 10 for i in range(6))
    assert _children(ddb, parent) == [(i, "complete", i * 10) for i in range(6)]
    kinds = dict(ddb.execute("SELECT name, kind FROM atlantis.job_steps WHERE job_id = %s",
                             (parent,)).fetchall())
    assert kinds == {**{f"child-{i}": "spawn" for i in range(6)}, "all": "join"}
    # The join suspended the parent (no attempt spent) and the last child's end woke it.
    assert row["attempt"] == 1
    assert [e[2] for e in events(ddb, "fan")].count("spawned-6") >= 1
    status = run_tide(["--database-url", db_url, "job", "status", str(parent)]).stdout
    assert "children" in status and "6 complete" in status
    child = _children_ids(ddb, parent)[0]
    shown = run_tide(["--database-url", db_url, "job", "status", str(child)]).stdout
    assert "parent" in shown and str(parent) in shown


def _children_ids(db: psycopg.Connection[Any], parent: int) -> list[int]:
    return [r[0] for r in db.execute(
        "SELECT id FROM atlantis.jobs WHERE parent_id = %s ORDER BY id", (parent,))]


def test_a_join_waits_holding_nothing_and_shows_what_it_waits_for(
        ddb: psycopg.Connection[Any], db_url: str, supervise: Any) -> None:
    _start(supervise)
    parent = _fan_out(ddb, "wait", 2, hold_ms=60_000)
    wait_for(lambda: _joining(ddb, parent), message="the parent to wait in its join")
    status = run_tide(["--database-url", db_url, "job", "status", str(parent)]).stdout
    assert "waiting" in status and "join all" in status and "2 running" in status
    assert "9999" not in status and "when what it waits for comes" in status
    as_json = run_tide(["--database-url", db_url, "job", "status", str(parent), "--json"])
    assert '"children"' in as_json.stdout
    assert atlantis.cancel(ddb, parent) == "cancelled"
    ddb.commit()
    # Cancelling the joined parent cancels its running children (their supervisor stops them).
    for child in _children_ids(ddb, parent):
        row = wait_state(ddb, child, "cancelled")
        assert f"with parent job {parent}" in (row["cancelled_by"] or "")


def test_cancelling_a_running_parent_cancels_its_waiting_children(
        ddb: psycopg.Connection[Any], supervise: Any) -> None:
    # The parent spawns slowly; its children wait (no supervisor serves them yet? they are in
    # the same queue: give them a delay by holding the parent's spawns), then a cancel.
    _start(supervise, concurrency=1)  # the parent holds the only slot: children wait
    parent = _fan_out(ddb, "cancel-running", 50, pause_ms=100)
    wait_for(lambda: len(_children_ids(ddb, parent)) >= 3, message="some children")
    assert atlantis.cancel(ddb, parent) == "running"
    ddb.commit()
    wait_state(ddb, parent, "cancelled")
    states = {s for _, s, _ in _children(ddb, parent)}
    assert states == {"cancelled"}, states
    # Once its cancel was asked, the parent spawned nothing more (its spawn was refused).
    assert ddb.execute(
        "SELECT count(*) FROM atlantis.jobs c JOIN atlantis.jobs p ON p.id = c.parent_id "
        "WHERE p.id = %s AND c.created_at > p.cancel_requested_at", (parent,)).fetchone() == (0,)
    assert len(_children_ids(ddb, parent)) < 50


def test_join_with_a_dead_child_raises_child_failed_naming_it(
        ddb: psycopg.Connection[Any], supervise: Any) -> None:
    _start(supervise)
    parent = _fan_out(ddb, "dead", 3, fail=1)
    row = wait_state(ddb, parent, "dead")
    bad = _children_ids(ddb, parent)[1]
    assert "ChildFailed" in row["last_error"]
    assert f"job {bad} dead" in row["last_error"] and "child 1 fails for good" in row["last_error"]
    # Every attempt joined again (the dead child stays dead) and none spawned anew.
    assert len(_children_ids(ddb, parent)) == 3


def test_spawn_is_never_duplicated_under_kill_9_of_the_supervisor(
        ddb: psycopg.Connection[Any], supervise: Any) -> None:
    first = _start(supervise, concurrency=2)
    parent = _fan_out(ddb, "k9", 30, pause_ms=50)
    wait_for(lambda: len(_children_ids(ddb, parent)) >= 8, message="some children spawned")
    first.signal(signal.SIGKILL)
    first.wait()
    _start(supervise)
    row = wait_state(ddb, parent, "complete", "dead", "cancelled", timeout=90)
    assert row["state"] == "complete", row
    children = _children(ddb, parent)
    assert sorted(i for i, _, _ in children) == list(range(30)), children
    assert row["result"] == sum(i * 10 for i in range(30))
    assert row["attempt"] == 2


def test_a_unique_child_that_exists_is_recorded_as_that_job_not_as_a_child(
        ddb: psycopg.Connection[Any], supervise: Any) -> None:
    existing = atlantis.enqueue(ddb, "durable.UniqueChild", {"key": "u"}, delay=3600)
    job_id = atlantis.enqueue(ddb, "durable.SpawnMisuse", {"key": "u", "mode": "unique"})
    ddb.commit()
    _start(supervise)
    row = wait_state(ddb, job_id, "complete")
    assert row["result"] == existing
    assert job_row(ddb, existing)["parent_id"] is None
    value = ddb.execute("SELECT value FROM atlantis.job_steps WHERE job_id = %s AND name = 'u'",
                        (job_id,)).fetchone()
    assert value == ({"job": existing, "child": False},)


def test_bad_spawns_and_joins_fail_the_attempt_with_one_clear_line(
        ddb: psycopg.Connection[Any], supervise: Any) -> None:
    jobs = {mode: atlantis.enqueue(ddb, "durable.SpawnMisuse", {"key": mode, "mode": mode})
            for mode in ("unknown-job", "bad-args", "bad-ids", "missing-id", "too-many")}
    ddb.commit()
    _start(supervise)
    errors = {mode: wait_state(ddb, job_id, "dead")["last_error"]
              for mode, job_id in jobs.items()}
    assert "UnknownJobError" in errors["unknown-job"] and "durable.NoSuchJob" in errors["unknown-job"]
    assert "ValidationError" in errors["bad-args"] and "field i is required" in errors["bad-args"]
    assert "StepError" in errors["bad-ids"] and "job ids are ints" in errors["bad-ids"]
    assert "JobNotFoundError" in errors["missing-id"] and "987654321" in errors["missing-id"]
    assert "more than the 100000 a join may wait for" in errors["too-many"]
    assert ddb.execute("SELECT count(*) FROM atlantis.jobs WHERE parent_id = ANY(%s)",
                       (list(jobs.values()),)).fetchone() == (0,)


def test_async_handlers_spawn_and_join(ddb: psycopg.Connection[Any], supervise: Any) -> None:
    job_id = atlantis.enqueue(ddb, "durable.AsyncFanOut", {"key": "async", "n": 3})
    ddb.commit()
    _start(supervise)
    assert wait_state(ddb, job_id, "complete")["result"] == [0, 10, 20]
    assert len(_children_ids(ddb, job_id)) == 3


def test_retention_keeps_the_children_of_a_live_parent(ddb: psycopg.Connection[Any]) -> None:
    parent = atlantis.enqueue(ddb, "durable.FanOut", {"key": "keep", "n": 0}, delay=3600)
    kids = [atlantis.enqueue(ddb, "durable.Child", {"key": "keep", "i": i}) for i in range(2)]
    ddb.execute("UPDATE atlantis.jobs SET parent_id = %s, state = 'complete', attempt = 1, "
                "finished_at = now() - interval '2 days' WHERE id = ANY(%s)", (parent, kids))
    ddb.commit()
    assert ddb.execute("SELECT atlantis.prune(interval '1 day')").fetchone() == (0,)
    assert ddb.execute("SELECT atlantis.delete_finished(%s)", (kids,)).fetchone() == (0,)
    atlantis.cancel(ddb, parent)
    ddb.execute("UPDATE atlantis.jobs SET finished_at = now() - interval '2 days' WHERE id = %s",
                (parent,))
    assert ddb.execute("SELECT atlantis.prune(interval '1 day')").fetchone() == (3,)
    ddb.commit()


def test_a_job_waiting_for_an_event_holds_no_limit_slot(
        ddb: psycopg.Connection[Any], supervise: Any) -> None:
    ids = [atlantis.enqueue(ddb, "durable.WaitLimited", {"key": f"slot-{i}"}) for i in range(3)]
    ddb.commit()
    _start(supervise)
    # `concurrency 1`: each can reach its wait only once the one before gave its slot back.
    wait_for(lambda: all(job_row(ddb, i)["suspended_for"] == "event:go" for i in ids),
             message="all three waiting")
    for i in ids:
        atlantis.send_event(ddb, i, "go", i)
    ddb.commit()
    for i in ids:
        assert wait_state(ddb, i, "complete")["result"] == i


def test_events_and_joins_inside_a_workflow_step(ddb: psycopg.Connection[Any],
                                                 supervise: Any) -> None:
    flow = atlantis.start_workflow(ddb, "durable.GatedFlow", {"key": "gated"})
    ddb.commit()
    _start(supervise)
    gate = ddb.execute("SELECT id FROM atlantis.jobs WHERE workflow_id = %s AND step = 'gate'",
                       (flow,)).fetchone()[0]  # type: ignore[index]
    wait_for(lambda: job_row(ddb, gate)["suspended_for"] == "event:go",
             message="the gate to wait")
    atlantis.send_event(ddb, gate, "go")
    ddb.commit()
    wait_for(lambda: ddb.execute("SELECT state FROM atlantis.workflows WHERE id = %s",
                                 (flow,)).fetchone()[0] == "complete",  # type: ignore[index]
             message="the workflow to complete")
    assert job_row(ddb, gate)["result"] == 30  # children 1 and 2: 10 + 20
    assert len(_children_ids(ddb, gate)) == 2


def test_a_join_past_16_mib_of_results_is_refused_and_results_false_returns_states(
        ddb: psycopg.Connection[Any]) -> None:
    """The cap of a join's results, on the SQL function a handler's join calls (a run's
    claim stood in for by the row's columns: no handler fills 16 MiB in a test)."""
    parent = atlantis.enqueue(ddb, "durable.FanOut", {"key": "cap", "n": 0})
    kids = [atlantis.enqueue(ddb, "durable.Child", {"key": "cap", "i": i}) for i in range(17)]
    run_id = ddb.execute(
        "UPDATE atlantis.jobs SET state = 'running', attempt = 1, claimed_by = 'test', "
        "claimed_until = now() + interval '1 hour', started_at = now(), "
        "run_id = gen_random_uuid() WHERE id = %s RETURNING run_id", (parent,)).fetchone()[0]  # type: ignore[index]
    ddb.execute("UPDATE atlantis.jobs SET parent_id = %s, state = 'complete', attempt = 1, "
                "finished_at = now(), result = to_jsonb(repeat('x', 1024 * 1024)) "
                "WHERE id = ANY(%s)", (parent, kids))
    ddb.commit()
    with pytest.raises(psycopg.Error, match="more than the 16777216 a join returns"):
        ddb.execute("SELECT * FROM atlantis.step_join(%s, %s, 'all', 1, %s, true)",
                    (parent, run_id, kids))
    ddb.rollback()
    rows = ddb.execute("SELECT id, state FROM atlantis.step_join(%s, %s, 'all', 1, %s, false)",
                       (parent, run_id, kids)).fetchall()
    assert rows == [(None, "ended"), *((k, "complete") for k in kids)]
    ddb.rollback()


def test_a_10000_child_fan_out_completes(ddb: psycopg.Connection[Any], supervise: Any) -> None:
    """Spawned by one ctx.spawn_many (2.5 s; one ctx.spawn each takes 16 s: the one-a-child
    path is the kill -9 test's, the scale here is the join's and the children's ends')."""
    _start(supervise, concurrency=4)
    parent = _fan_out(ddb, "ten-thousand", 10_000, many=True)
    row = wait_state(ddb, parent, "complete", timeout=600)
    assert row["result"] == sum(i * 10 for i in range(10_000))
    assert ddb.execute(
        "SELECT count(*), count(DISTINCT args->>'i'), count(*) FILTER (WHERE state = 'complete') "
        "FROM atlantis.jobs WHERE parent_id = %s", (parent,)).fetchone() == (10_000, 10_000, 10_000)


def test_the_metrics_count_waits_events_and_children(ddb: psycopg.Connection[Any],
                                                      supervise: Any) -> None:
    port = free_port()
    supervise("--metrics-port", str(port), "--worker-refresh", "0.3s", queues=("durable",),
              app=APP, concurrency=4)
    parent = _fan_out(ddb, "metrics", 2, hold_ms=60_000)
    waiter = atlantis.enqueue(ddb, "durable.Wait", {"key": "metrics", "event": "approved"})
    ddb.commit()
    wait_for(lambda: _joining(ddb, parent) and job_row(ddb, waiter)["suspended_for"],
             message="a join and a wait")
    atlantis.send_event(ddb, waiter, "other")  # kept, pending: the job waits for `approved`
    ddb.commit()
    want = ['atlantis_jobs_waiting{for="join",queue="durable"} 1.0',
            'atlantis_jobs_waiting{for="event",queue="durable"} 1.0',
            'atlantis_events{queue="durable",state="pending"} 1.0',
            'atlantis_child_jobs{queue="durable",state="running"} 2.0',
            'atlantis_jobs_asleep{queue="durable"} 0.0']
    text = wait_for(lambda: (t := scrape_metrics(port)) and all(w in t for w in want) and t,
                    message="the wait gauges")
    assert 'atlantis_child_jobs{queue="durable",state="complete"} 0.0' in text
    atlantis.cancel(ddb, parent)
    atlantis.cancel(ddb, waiter)
    ddb.commit()


def test_spawn_many_enqueues_a_batch_once_as_one_step(ddb: psycopg.Connection[Any],
                                                      supervise: Any) -> None:
    _start(supervise)
    parent = _fan_out(ddb, "many", 25, many=True)
    row = wait_state(ddb, parent, "complete")
    assert row["result"] == sum(i * 10 for i in range(25))
    ids = _children_ids(ddb, parent)
    assert [i for i, _, _ in _children(ddb, parent)] == list(range(25))
    records = ddb.execute("SELECT name, kind, value FROM atlantis.job_steps WHERE job_id = %s "
                          "ORDER BY name", (parent,)).fetchall()
    assert records[0][:2] == ("all", "join")
    assert records[1] == ("children", "spawn", {"jobs": ids, "children": 25})
