"""Workflow transitions in the database (migration 0017, live/workflows.sql and live/workflow_operators.sql), driven by SQL as a
supervisor's claim and finish would drive them: the graph advances exactly once per
completion, failures and cancels compensate in reverse dependency order, and nothing is
left behind. The same transitions under real supervisors: tests/test_workflows.py."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

#: Database-facing: also run on PostgreSQL 16 (ATLANTIS_TEST_PG=16).
pytestmark = pytest.mark.server_matrix

FIELDS = [{"name": "account_id", "type": "varchar", "length": 64, "array": False,
           "not_null": True, "has_default": False, "default": None}]


def declare(db: psycopg.Connection[Any], steps: list[dict[str, Any]], *, name: str = "wf.Flow",
            unique: list[str] | None = None, timeout: float | None = None) -> None:
    jobs = {s["job"] for s in steps} | {s["compensate"] for s in steps if s.get("compensate")}
    for job in sorted(jobs):
        db.execute(
            "INSERT INTO atlantis.job_types (job, queue, max_attempts, timeout, heartbeat, backoff,"
            " fields) VALUES (%s, 'wf', 2, '1h', '5m', '10s', %s) ON CONFLICT (job) DO NOTHING",
            (job, Jsonb(FIELDS)))
    db.execute(
        "INSERT INTO atlantis.workflow_types (workflow, fields, unique_fields, timeout, steps)"
        " VALUES (%s, %s, %s, make_interval(secs => %s), %s)",
        (name, Jsonb(FIELDS), unique or [], timeout,
         Jsonb([{"after": [], "compensate": None, **s} for s in steps])))


CHAIN: list[dict[str, Any]] = [
    {"step": "create", "job": "wf.Create", "compensate": "wf.Delete"},
    {"step": "import", "job": "wf.Import", "after": ["create"], "compensate": "wf.Purge"},
    {"step": "welcome", "job": "wf.Welcome", "after": ["import"]},
]


def start(db: psycopg.Connection[Any], name: str = "wf.Flow", account: str = "a1") -> int:
    row = db.execute("SELECT atlantis.start_workflow(%s, %s)",
                     (name, Jsonb({"account_id": account}))).fetchone()
    assert row is not None
    return int(row[0])


def rows(db: psycopg.Connection[Any], wid: int) -> dict[tuple[str, bool], dict[str, Any]]:
    from psycopg.rows import dict_row

    cur = db.cursor(row_factory=dict_row)
    found = cur.execute("SELECT * FROM atlantis.jobs WHERE workflow_id = %s ORDER BY id",
                        (wid,)).fetchall()
    return {(r["step"], r["compensation"]): r for r in found}


def state(db: psycopg.Connection[Any], wid: int) -> str:
    row = db.execute("SELECT state FROM atlantis.workflows WHERE id = %s", (wid,)).fetchone()
    assert row is not None
    return str(row[0])


def claim(db: psycopg.Connection[Any], job_id: int) -> None:
    """As the claim statement does, and as a child that began the handler is recorded."""
    db.execute("UPDATE atlantis.jobs SET state = 'running', attempt = attempt + 1,"
               " claimed_by = 'w1', claimed_until = now() + heartbeat, started_at = now()"
               " WHERE id = %s AND state = 'available'", (job_id,))


def finish(db: psycopg.Connection[Any], job_id: int, outcome: str = "complete",
           result: Any = None) -> None:
    """As the finish statement does: the row's new state and its attempt in the timeline."""
    with db.transaction():
        db.execute("INSERT INTO atlantis.attempts (job_id, attempt, worker, child_pid, outcome)"
                   " SELECT id, attempt, 'w1', 4242, %s FROM atlantis.jobs WHERE id = %s",
                   (outcome, job_id))
        db.execute("UPDATE atlantis.jobs SET state = %s, claimed_until = NULL,"
                   " result = %s, cancel_requested_at = NULL,"
                   " finished_at = CASE WHEN %s IN ('complete', 'dead', 'cancelled')"
                   "                    THEN now() END WHERE id = %s",
                   (outcome, Jsonb(result) if result is not None else None, outcome, job_id))


def run(db: psycopg.Connection[Any], job_id: int, outcome: str = "complete",
        result: Any = None) -> None:
    claim(db, job_id)
    finish(db, job_id, outcome, result)


def test_a_chain_advances_one_step_at_a_time_and_completes(db: psycopg.Connection[Any]) -> None:
    declare(db, CHAIN)
    wid = start(db)
    assert list(rows(db, wid)) == [("create", False)]
    run(db, rows(db, wid)["create", False]["id"], result={"account": 7})
    assert list(rows(db, wid)) == [("create", False), ("import", False)]
    assert state(db, wid) == "running"
    imp = rows(db, wid)["import", False]
    assert imp["args"] == {"account_id": "a1"} and imp["queue"] == "wf"
    ctx = db.execute("SELECT atlantis.step_context(%s)", (imp["id"],)).fetchone()
    assert ctx is not None
    assert ctx[0] == {"workflow_id": wid, "step": "import", "compensation": False,
                      "results": {"create": {"account": 7}}, "compensating": None}
    run(db, imp["id"], result=[1, 2])
    welcome = rows(db, wid)["welcome", False]["id"]
    ctx = db.execute("SELECT atlantis.step_context(%s)", (welcome,)).fetchone()
    assert ctx is not None and ctx[0]["results"] == {"create": {"account": 7}, "import": [1, 2]}
    run(db, welcome)
    assert state(db, wid) == "complete"
    assert len(rows(db, wid)) == 3  # no compensation ran


def test_a_failing_last_step_compensates_in_reverse_order(db: psycopg.Connection[Any]) -> None:
    declare(db, CHAIN)
    wid = start(db)
    run(db, rows(db, wid)["create", False]["id"], result="c")
    run(db, rows(db, wid)["import", False]["id"], result="i")
    run(db, rows(db, wid)["welcome", False]["id"], "dead")
    assert state(db, wid) == "compensating"
    # import's undo first; create's waits for it.
    assert [k for k in rows(db, wid) if k[1]] == [("import", True)]
    purge = rows(db, wid)["import", True]
    assert purge["job"] == "wf.Purge" and purge["args"] == {"account_id": "a1"}
    ctx = db.execute("SELECT atlantis.step_context(%s)", (purge["id"],)).fetchone()
    assert ctx is not None
    assert ctx[0]["results"] == {"import": "i", "create": "c"}
    assert ctx[0]["compensating"]["step"] == "welcome"
    run(db, purge["id"])
    assert [k for k in rows(db, wid) if k[1]] == [("import", True), ("create", True)]
    run(db, rows(db, wid)["create", True]["id"])
    assert state(db, wid) == "failed"
    # exactly once each
    assert sum(1 for k in rows(db, wid) if k[1]) == 2


def test_a_step_that_never_started_is_not_compensated(db: psycopg.Connection[Any]) -> None:
    declare(db, CHAIN)
    wid = start(db)
    run(db, rows(db, wid)["create", False]["id"])
    # import's row waits, unclaimed; the workflow is cancelled.
    assert db.execute("SELECT atlantis.cancel_workflow(%s, 'alice')", (wid,)).fetchone() == (
        "compensating",)
    r = rows(db, wid)
    assert r["import", False]["state"] == "cancelled"
    assert r["import", False]["last_error"] == "cancelled by alice"
    assert ("import", True) not in r and ("create", True) in r
    run(db, r["create", True]["id"])
    assert state(db, wid) == "cancelled"


def test_a_cancel_during_a_running_step_compensates_it_after_it_stops(
        db: psycopg.Connection[Any]) -> None:
    declare(db, CHAIN)
    wid = start(db)
    run(db, rows(db, wid)["create", False]["id"])
    imp = rows(db, wid)["import", False]["id"]
    claim(db, imp)
    # atlantis.cancel of a step cancels its workflow.
    assert db.execute("SELECT atlantis.cancel(%s, 'bob')", (imp,)).fetchone() == ("running",)
    r = rows(db, wid)
    assert r["import", False]["cancel_requested_at"] is not None
    assert state(db, wid) == "compensating"
    assert ("create", True) not in r  # waits for import's undo, which waits for import
    finish(db, imp, "cancelled")
    assert [k for k in rows(db, wid) if k[1]] == [("import", True)]
    run(db, rows(db, wid)["import", True]["id"])
    run(db, rows(db, wid)["create", True]["id"])
    assert state(db, wid) == "cancelled"
    # A cancel once finished changes nothing.
    assert db.execute("SELECT atlantis.cancel_workflow(%s)", (wid,)).fetchone() == ("cancelled",)


def test_a_dead_compensation_ends_compensation_failed_and_a_retry_finishes_it(
        db: psycopg.Connection[Any]) -> None:
    declare(db, CHAIN)
    wid = start(db)
    run(db, rows(db, wid)["create", False]["id"])
    run(db, rows(db, wid)["import", False]["id"], "dead")
    purge = rows(db, wid)["import", True]["id"]
    run(db, purge, "dead")
    assert state(db, wid) == "compensation_failed"
    assert ("create", True) not in rows(db, wid)  # stopped behind the dead undo
    with pytest.raises(psycopg.Error, match="use tide workflow retry"):
        db.execute("SELECT atlantis.retry(%s)", (purge,))
    assert db.execute("SELECT atlantis.retry_workflow(%s)", (wid,)).fetchone() == (
        "compensating",)
    assert rows(db, wid)["import", True]["state"] == "available"
    run(db, purge)
    run(db, rows(db, wid)["create", True]["id"])
    assert state(db, wid) == "failed"
    with pytest.raises(psycopg.Error, match="only a compensation_failed"):
        db.execute("SELECT atlantis.retry_workflow(%s)", (wid,))


def test_independent_branches_compensate_at_once_and_a_dead_one_blocks_only_its_own(
        db: psycopg.Connection[Any]) -> None:
    declare(db, [
        {"step": "root", "job": "wf.Root", "compensate": "wf.UndoRoot"},
        {"step": "left", "job": "wf.Left", "after": ["root"], "compensate": "wf.UndoLeft"},
        {"step": "right", "job": "wf.Right", "after": ["root"], "compensate": "wf.UndoRight"},
        {"step": "end", "job": "wf.End", "after": ["left", "right"]},
    ])
    wid = start(db)
    run(db, rows(db, wid)["root", False]["id"])
    r = rows(db, wid)
    assert ("left", False) in r and ("right", False) in r
    run(db, r["left", False]["id"])
    run(db, r["right", False]["id"])
    run(db, rows(db, wid)["end", False]["id"], "dead")
    r = rows(db, wid)
    assert ("left", True) in r and ("right", True) in r and ("root", True) not in r
    run(db, r["left", True]["id"], "dead")
    run(db, r["right", True]["id"])
    assert ("root", True) not in rows(db, wid)
    assert state(db, wid) == "compensation_failed"


def test_two_dependencies_finishing_at_once_start_their_dependent_once(
        db_url: str, db: psycopg.Connection[Any]) -> None:
    declare(db, [
        {"step": "a", "job": "wf.A"},
        {"step": "b", "job": "wf.B"},
        {"step": "c", "job": "wf.C", "after": ["a", "b"]},
    ])
    wid = start(db)
    r = rows(db, wid)
    claim(db, r["a", False]["id"])
    claim(db, r["b", False]["id"])
    # Two transactions end a and b; the second waits for the first's lock on the workflow.
    with psycopg.connect(db_url) as one, psycopg.connect(db_url) as two:
        one.execute("UPDATE atlantis.jobs SET state = 'complete', finished_at = now()"
                    " WHERE id = %s", (r["a", False]["id"],))
        waited = threading.Event()

        def second() -> None:
            two.execute("UPDATE atlantis.jobs SET state = 'complete', finished_at = now()"
                        " WHERE id = %s", (r["b", False]["id"],))
            waited.set()
            two.commit()

        t = threading.Thread(target=second)
        t.start()
        # The second really waits on the lock (the race happened), then goes on.
        from tests.conftest import wait_for

        wait_for(lambda: db.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            " AND datname = current_database()").fetchone() == (1,), message="a lock wait")
        assert not waited.is_set()
        one.commit()
        t.join(30)
    assert [k for k in rows(db, wid)].count(("c", False)) == 1
    assert db.execute("SELECT count(*) FROM atlantis.jobs WHERE workflow_id = %s AND step = 'c'",
                      (wid,)).fetchone() == (1,)


def test_a_start_in_a_rolled_back_transaction_leaves_nothing(db_url: str,
                                                            db: psycopg.Connection[Any]) -> None:
    declare(db, CHAIN)
    with psycopg.connect(db_url) as conn:
        start(conn)
        conn.rollback()
    assert db.execute("SELECT count(*) FROM atlantis.workflow_instances").fetchone() == (0,)
    assert db.execute("SELECT count(*) FROM atlantis.workflow_steps").fetchone() == (0,)
    assert db.execute("SELECT count(*) FROM atlantis.jobs").fetchone() == (0,)


def test_bad_args_are_refused_naming_the_workflow_and_nothing_is_written(
        db: psycopg.Connection[Any]) -> None:
    declare(db, CHAIN)
    with pytest.raises(psycopg.Error, match="workflow wf.Flow: field account_id is required"):
        db.execute("SELECT atlantis.start_workflow('wf.Flow', '{}')")
    with pytest.raises(psycopg.Error, match="workflow wf.Flow: unknown field nope"):
        db.execute("SELECT atlantis.start_workflow('wf.Flow', %s)",
                   (Jsonb({"account_id": "a", "nope": 1}),))
    with pytest.raises(psycopg.Error, match="unknown workflow wf.Nope"):
        db.execute("SELECT atlantis.start_workflow('wf.Nope', '{}')")
    assert db.execute("SELECT count(*) FROM atlantis.workflow_instances").fetchone() == (0,)


def test_unique_returns_the_running_workflow(db: psycopg.Connection[Any]) -> None:
    declare(db, CHAIN, unique=["account_id"])
    first = start(db)
    assert start(db) == first
    assert start(db, account="a2") != first
    db.execute("SELECT atlantis.cancel_workflow(%s)", (first,))  # never started: cancelled
    assert state(db, first) == "cancelled"
    assert start(db) != first  # the key is free once the holder finished


def test_the_timeout_is_found_by_the_sweep_and_compensates(db: psycopg.Connection[Any]) -> None:
    declare(db, CHAIN, timeout=3600)
    wid = start(db)
    run(db, rows(db, wid)["create", False]["id"])
    assert db.execute("SELECT atlantis.workflow_sweep()").fetchone() == (0,)
    db.execute("UPDATE atlantis.workflow_instances SET deadline = now() - interval '1s'")
    assert db.execute("SELECT atlantis.workflow_sweep()").fetchone() == (1,)
    w = db.execute("SELECT state, cause, error FROM atlantis.workflows").fetchone()
    assert w is not None and w[0] == "compensating" and w[1] == "timeout"
    assert "timeout after" in w[2]
    assert rows(db, wid)["import", False]["state"] == "cancelled"
    run(db, rows(db, wid)["create", True]["id"])
    assert state(db, wid) == "failed"


def test_a_step_back_to_wait_in_a_stopped_workflow_never_runs_again(
        db: psycopg.Connection[Any]) -> None:
    declare(db, CHAIN)
    wid = start(db)
    create = rows(db, wid)["create", False]["id"]
    claim(db, create)
    # The workflow is cancelled while its step runs; the attempt then fails and would retry.
    db.execute("SELECT atlantis.cancel_workflow(%s)", (wid,))
    finish(db, create, "available")
    assert rows(db, wid)["create", False]["state"] == "cancelled"
    run(db, rows(db, wid)["create", True]["id"])  # it had started: it is undone
    assert state(db, wid) == "cancelled"


def test_prune_takes_a_finished_workflow_with_all_its_rows_never_a_step_alone(
        db: psycopg.Connection[Any]) -> None:
    declare(db, CHAIN)
    done = start(db)
    for step in ("create", "import", "welcome"):
        run(db, rows(db, done)[step, False]["id"])
    live = start(db, account="a2")
    run(db, rows(db, live)["create", False]["id"])
    assert db.execute("SELECT atlantis.prune('0s')").fetchone() == (3,)
    assert db.execute("SELECT count(*) FROM atlantis.workflow_instances").fetchone() == (1,)
    assert len(rows(db, live)) == 2 and rows(db, done) == {}
    assert db.execute("SELECT atlantis.delete_finished(%s)",
                      ([rows(db, live)["create", False]["id"]],)).fetchone() == (0,)


def test_the_python_api_runs_in_the_callers_transaction_and_names_errors(
        db_url: str, db: psycopg.Connection[Any]) -> None:
    import atlantis

    declare(db, CHAIN)
    with psycopg.connect(db_url) as conn:
        wid = atlantis.start_workflow(conn, "wf.Flow", {"account_id": "a1"})
        with pytest.raises(atlantis.ValidationError, match="workflow wf.Flow: field account_id"):
            atlantis.start_workflow(conn, "wf.Flow", {})
        with pytest.raises(atlantis.UnknownJobError, match="unknown workflow wf.Nope"):
            atlantis.start_workflow(conn, "wf.Nope", {})
        # The transaction is still usable and nothing is visible before the commit.
        assert db.execute("SELECT count(*) FROM atlantis.workflows").fetchone() == (0,)
        conn.commit()
        create = rows(db, wid)["create", False]["id"]
        with pytest.raises(atlantis.WorkflowStateError, match="use tide workflow retry"):
            atlantis.retry(conn, create)
        conn.rollback()
        with pytest.raises(atlantis.WorkflowStateError, match="only a compensation_failed"):
            atlantis.retry_workflow(conn, wid)
        with pytest.raises(atlantis.WorkflowNotFoundError, match="no workflow with id 999"):
            atlantis.cancel_workflow(conn, 999)
        assert atlantis.cancel_workflow(conn, wid, by="carol") == "cancelled"
        conn.commit()
    assert rows(db, wid)["create", False]["cancelled_by"] == "carol"


def test_the_async_twins(db_url: str, db: psycopg.Connection[Any]) -> None:
    import asyncio

    import atlantis

    declare(db, CHAIN)

    async def go() -> int:
        async with await psycopg.AsyncConnection.connect(db_url) as conn:
            wid = await atlantis.start_workflow_async(conn, "wf.Flow", {"account_id": "a1"})
            assert await atlantis.cancel_workflow_async(conn, wid) == "cancelled"
            await conn.commit()
            return wid

    assert state(db, asyncio.run(go())) == "cancelled"


def test_roles_start_cancel_advance_and_read_workflows(db: psycopg.Connection[Any]) -> None:
    declare(db, CHAIN)
    db.execute("SET ROLE atlantis_enqueuer")
    wid = start(db)
    db.execute("RESET ROLE")
    db.execute("SET ROLE atlantis_worker")
    run(db, rows(db, wid)["create", False]["id"])  # the worker's finish advances it
    db.execute("RESET ROLE")
    assert ("import", False) in rows(db, wid)
    db.execute("SET ROLE atlantis_reader")
    assert state(db, wid) == "running"
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        db.execute("SELECT atlantis.cancel_workflow(%s)", (wid,))
    db.execute("RESET ROLE")
    db.execute("SET ROLE atlantis_enqueuer")
    assert db.execute("SELECT atlantis.cancel_workflow(%s)", (wid,)).fetchone() == (
        "compensating",)
    db.execute("RESET ROLE")


def test_a_step_that_cannot_start_fails_the_workflow(db: psycopg.Connection[Any]) -> None:
    declare(db, CHAIN)
    wid = start(db)
    # import's job now needs a field the workflow does not have.
    db.execute("UPDATE atlantis.job_types SET fields = fields || %s WHERE job = 'wf.Import'",
               (Jsonb([{"name": "extra", "type": "int", "length": None, "array": False,
                        "not_null": True, "has_default": False, "default": None}]),))
    run(db, rows(db, wid)["create", False]["id"])  # the finish itself is never refused
    w = db.execute("SELECT state, error, failed_step FROM atlantis.workflows").fetchone()
    assert w is not None and w[0] == "compensating" and w[2] == "import"
    assert w[1].startswith("step import could not start: job wf.Import: field extra is required")
    run(db, rows(db, wid)["create", True]["id"])
    assert state(db, wid) == "failed"


def test_a_cancel_during_the_compensations_is_recorded_and_they_go_on(
        db: psycopg.Connection[Any]) -> None:
    declare(db, CHAIN)
    wid = start(db)
    run(db, rows(db, wid)["create", False]["id"])
    run(db, rows(db, wid)["import", False]["id"], "dead")
    purge = rows(db, wid)["import", True]["id"]
    claim(db, purge)
    assert db.execute("SELECT atlantis.cancel_workflow(%s, 'dave')", (wid,)).fetchone() == (
        "compensating",)
    # The compensation running is not cancelled, and the next one still starts.
    assert rows(db, wid)["import", True]["cancel_requested_at"] is None
    finish(db, purge)
    run(db, rows(db, wid)["create", True]["id"])
    w = db.execute("SELECT state, cause, cancelled_by, cancel_requested_at IS NOT NULL"
                   " FROM atlantis.workflows WHERE id = %s", (wid,)).fetchone()
    assert w == ("failed", "failed", "dave", True)


def test_a_steps_job_unique_key_does_not_apply_inside_a_workflow(
        db: psycopg.Connection[Any]) -> None:
    declare(db, CHAIN)
    db.execute("UPDATE atlantis.job_types SET unique_fields = '{account_id}'"
               " WHERE job = 'wf.Create'")
    one, two = start(db), start(db)
    assert one != two
    assert rows(db, one)["create", False]["unique_key"] is None
    assert rows(db, two)["create", False]["state"] == "available"


# ---- unique keys and dismissal (issue 31, migration 0022) ----------------------------------

def owes_its_undo(db: psycopg.Connection[Any], account: str = "a1") -> int:
    """A workflow of CHAIN whose import died and whose undo died too: compensation_failed."""
    wid = start(db, account=account)
    run(db, rows(db, wid)["create", False]["id"])
    run(db, rows(db, wid)["import", False]["id"], "dead")
    assert state(db, wid) == "compensating"
    assert start(db, account=account) == wid  # held while it compensates
    run(db, rows(db, wid)["import", True]["id"], "dead")
    assert state(db, wid) == "compensation_failed"
    return wid


def dismissal(db: psycopg.Connection[Any], wid: int) -> tuple[Any, ...]:
    row = db.execute("SELECT state, dismissed_by, dismissed_at IS NOT NULL"
                     " FROM atlantis.workflows WHERE id = %s", (wid,)).fetchone()
    assert row is not None
    return tuple(row)


def test_a_workflow_that_owes_its_undo_keeps_its_key_until_dismissed(
        db: psycopg.Connection[Any]) -> None:
    declare(db, CHAIN, unique=["account_id"])
    first = owes_its_undo(db)
    # Its undo is owed: starting the same key again returns it, whatever its state.
    assert start(db) == first
    other = start(db, account="a2")
    with pytest.raises(psycopg.Error) as refused:
        db.execute("SELECT atlantis.dismiss_workflow(%s)", (other,))
    assert refused.value.sqlstate == "ATL05"
    assert refused.value.diag.message_primary == (
        f"workflow {other} is running: only a compensation_failed workflow can be dismissed")
    assert db.execute("SELECT atlantis.dismiss_workflow(%s, 'erin')", (first,)).fetchone() == (
        "compensation_failed",)
    assert dismissal(db, first) == ("compensation_failed", "erin", True)
    # Dismissed: the key is free, and a new workflow of it starts.
    second = start(db)
    assert second != first and start(db) == second
    # Retrying the dismissed one while the other holds the key: one line naming the holder.
    with pytest.raises(psycopg.Error) as taken:
        db.execute("SELECT atlantis.retry_workflow(%s)", (first,))
    assert taken.value.sqlstate == "ATL03"
    assert taken.value.diag.message_primary == (
        f'workflow {second} (wf.Flow) holds the unique key ["a1"] now; retry workflow {first} '
        f"once workflow {second} has finished or been dismissed")
    assert dismissal(db, first) == ("compensation_failed", "erin", True)  # nothing changed
    # Dismissing again changes nothing.
    assert db.execute("SELECT atlantis.dismiss_workflow(%s, 'frank')", (first,)).fetchone() == (
        "compensation_failed",)
    assert dismissal(db, first) == ("compensation_failed", "erin", True)
    # Once the holder finished, the retry takes the key back and the undo runs.
    assert db.execute("SELECT atlantis.cancel_workflow(%s)", (second,)).fetchone() == (
        "cancelled",)
    assert db.execute("SELECT atlantis.retry_workflow(%s)", (first,)).fetchone() == (
        "compensating",)
    assert dismissal(db, first) == ("compensating", None, False)
    assert start(db) == first
    run(db, rows(db, first)["import", True]["id"])
    run(db, rows(db, first)["create", True]["id"])
    assert state(db, first) == "failed"
    assert start(db) not in (first, second)  # failed (compensated): the key is free


def test_the_python_api_dismisses_and_names_each_refusal(
        db_url: str, db: psycopg.Connection[Any]) -> None:
    import atlantis

    declare(db, CHAIN, unique=["account_id"])
    first = owes_its_undo(db)
    with psycopg.connect(db_url) as conn:
        with pytest.raises(atlantis.WorkflowNotFoundError, match="no workflow with id 999"):
            atlantis.dismiss_workflow(conn, 999)
        with pytest.raises(atlantis.ValidationError, match="workflow_id"):
            atlantis.dismiss_workflow(conn, 2**63)
        assert atlantis.start_workflow(conn, "wf.Flow", {"account_id": "a1"}) == first
        assert atlantis.dismiss_workflow(conn, first, by="grace") == "compensation_failed"
        second = atlantis.start_workflow(conn, "wf.Flow", {"account_id": "a1"})
        assert second != first
        with pytest.raises(atlantis.WorkflowStateError, match="only a compensation_failed"):
            atlantis.dismiss_workflow(conn, second)
        with pytest.raises(atlantis.UniqueKeyTakenError,
                           match=f"^workflow {second} \\(wf.Flow\\) holds the unique key"):
            atlantis.retry_workflow(conn, first)
        conn.commit()  # the refusals left the transaction usable
    assert dismissal(db, first) == ("compensation_failed", "grace", True)


def test_migration_0022_keeps_each_key_with_one_workflow_and_dismisses_the_others(
        admin_url: str) -> None:
    """A database of the previous schema holding what its index let through (a workflow
    compensation_failed and a later one of the same key running, or two compensation_failed
    ones), migrated: the key stays with the one running, else the newest; the others are
    marked dismissed by the migration, and the new index holds."""
    import os

    from atlantis.store.migrate import migrate, migrations
    from tests.conftest import url_for

    name = f"atl_m22_{os.getpid()}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {name}")
    try:
        with psycopg.connect(url_for(admin_url, name), autocommit=True) as db:
            db.execute("CREATE SCHEMA atlantis")
            db.execute("CREATE TABLE atlantis.schema_migrations (version int PRIMARY KEY,"
                       " name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())")
            for version, file, sql in migrations():
                if version >= 22:
                    break
                db.execute(sql)
                db.execute("INSERT INTO atlantis.schema_migrations (version, name)"
                           " VALUES (%s, %s)", (version, file))

            def add(account: str, state: str) -> int:
                finished = state != "running"
                row = db.execute(
                    "INSERT INTO atlantis.workflow_instances (workflow, args, state, unique_key,"
                    " finished_at, cause) VALUES ('wf.Flow', %s, %s, %s,"
                    " CASE WHEN %s THEN now() END, CASE WHEN %s THEN 'failed' END)"
                    " RETURNING id",
                    (Jsonb({"account_id": account}), state, f'["{account}"]', finished,
                     finished)).fetchone()
                assert row is not None
                return int(row[0])

            owed, running = add("a1", "compensation_failed"), add("a1", "running")
            older, newer = add("b1", "compensation_failed"), add("b1", "compensation_failed")
            alone = add("c1", "compensation_failed")
            compensated = add("d1", "failed")

            assert 22 in migrate(db)
            assert dismissal(db, owed) == ("compensation_failed", "migration 0022", True)
            assert dismissal(db, older) == ("compensation_failed", "migration 0022", True)
            for kept in (running, newer, alone, compensated):
                assert dismissal(db, kept)[1:] == (None, False)
            declare(db, CHAIN, unique=["account_id"])
            assert (start(db, account="a1"), start(db, account="b1"),
                    start(db, account="c1")) == (running, newer, alone)
            assert start(db, account="d1") not in (compensated, running, newer, alone)
            with pytest.raises(psycopg.Error) as taken:
                db.execute("SELECT atlantis.retry_workflow(%s)", (owed,))
            assert taken.value.sqlstate == "ATL03"
            assert str(taken.value.diag.message_primary).startswith(
                f'workflow {running} (wf.Flow) holds the unique key ["a1"] now')
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
